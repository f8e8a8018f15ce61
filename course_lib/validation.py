"""The planner against published training runs: is the published plan one of its candidates,
does it fit, how fast does the planner predict it, and where does it rank (lesson 12).

Lecture: the seed article's "choose a strategy" step, checked against what was run at scale
(:mod:`course_lib.published`). One function, :func:`compare`, used by the lesson and its tests.
"""

from __future__ import annotations

from course_lib.planner import rank_plans, with_plan
from course_lib.published import Run, cluster_of


def compare(run: Run, mfu: float) -> dict:
    """The planner on ``run``'s model and cluster at kernel speed ``mfu``, with the run's
    ``options``. Returns ``candidate`` (the published plan, its unpublished fields chosen by the
    planner, is among the candidates), ``fits``, ``ranked`` (the published plan's
    :class:`planner.Ranked`), ``predicted`` teraFLOP/s per GPU in the run's convention and its
    ``ratio`` to the published, ``best`` (the planner's best fitting plan with the same
    recomputation), ``step_ratio`` (the published plan's predicted step over the best's) and
    ``rank`` (1: the best) among the fitting plans with that recomputation."""
    ranked = rank_plans(run.model, cluster_of(run, mfu), **run.options)
    mine = with_plan(ranked, **run.plan)
    out = dict(run=run, candidate=bool(mine), fits=bool(mine) and mine[0].fits)
    if not mine:
        return out
    published = mine[0]
    plan = published.plan
    flops = (run.model.hardware_flops(plan.recompute, plan.attention)
             if run.convention == "hardware" else run.model.model_flops())
    predicted = flops / (published.time["total"] * run.gpus) / 1e12
    same = [r for r in ranked if r.fits and r.plan.recomputation == plan.recomputation]
    best = same[0] if same else published
    rank = next((i + 1 for i, r in enumerate(same) if r.plan == plan), None)
    return dict(out, ranked=published, predicted=predicted, ratio=predicted / run.tflops,
                best=best, step_ratio=published.time["total"] / best.time["total"], rank=rank,
                plans=len(same))
