"""Checks for lesson 12's exercises: a term the planner lacks (activation memory with sequence
parallelism), and a prediction of each pipeline stage's activations checked against a run.

Korthikanti et al. 2022 (Table 2: activation bytes per layer, with and without sequence
parallelism); Narayanan et al. 2021 (1F1B keeps at most p - s micro-batches in flight on stage
s). The library's planner counts the first stage only and has no sequence parallelism; both
answers are the exercise's, so their references sit between solution markers and the student
edition of the library leaves them out. Each check is a probe (the student's kernel) and a judge
(outside it): see :mod:`course_lib.exercises.common`.
"""

from __future__ import annotations

import math

from course_lib import planner as P
from course_lib.exercises.common import (
    ExerciseFailed,
    check_drawn,
    checked,
    grading_seed,
    judge_cases,
    launch_checked,
)

# -- exercise 1: activation memory with sequence parallelism -----------------------------------


def sequence_parallel_bytes_per_layer(model: P.Transformer, plan: P.Plan) -> float:
    """Reference: one layer's activation bytes for one micro-batch with tensor and sequence
    parallelism (Korthikanti et al. 2022, Table 2): s b h (34/t + 5 a s / (h t)). With full
    recomputation the paper's table gives 2 s b h; the layer's input lies in the
    sequence-parallel region, so the exercise splits it too: 2 s b h / t."""
    ### BEGIN SOLUTION
    sbh = model.seq * P.micro_batch_size(model, plan) * model.hidden
    if plan.recompute:  # each layer keeps its input, split along the sequence
        return model.value_bytes * sbh / plan.tp
    scores = 5 * model.heads * model.seq / model.hidden  # attention's s x s, split by heads
    return sbh * (34 + scores) / plan.tp  # everything else, split along the sequence
    ### END SOLUTION


def _sp_cases(seed):
    cases = [(P.Transformer(layers=32, hidden=4096, heads=32, seq=2048, vocab=51_200,
                            global_batch=512), P.Plan(dp=8, tp=8, pp=4, micro_batches=16)),
             (P.Transformer(layers=40, hidden=5120, heads=40, seq=8192, vocab=51_200,
                            global_batch=256), P.Plan(dp=4, tp=8, pp=1, micro_batches=64)),
             (P.Transformer(layers=40, hidden=5120, heads=40, seq=8192, vocab=51_200,
                            global_batch=256),
              P.Plan(dp=4, tp=8, pp=1, micro_batches=64, recompute=True)),
             (P.Transformer(layers=24, hidden=2304, heads=24, seq=2048, vocab=51_200,
                            global_batch=512), P.Plan(dp=32, tp=1, pp=1, micro_batches=4))]
    if seed is not None:
        import random

        g = random.Random(seed)
        heads = g.choice([16, 24, 32])
        tp = g.choice([2, 4, 8])
        cases.append((P.Transformer(layers=g.choice([12, 24]), hidden=heads * 64, heads=heads,
                                    seq=g.choice([1024, 4096]), vocab=32_000, global_batch=64),
                      P.Plan(dp=2, tp=tp, pp=1, micro_batches=g.choice([4, 8]),
                             recompute=g.random() < 0.5)))
    return cases


def _plain(model, plan, hidden=False):
    return dict(model=dict(model.__dict__), plan=dict(plan.__dict__), hidden=hidden)


def _probe_sequence_parallel(fn) -> dict:
    out = []
    for i, (model, plan) in enumerate(_sp_cases(grading_seed())):
        value = fn(model, plan)
        out.append(dict(case=_plain(model, plan, hidden=i >= 4), answer=value if isinstance(
            value, (int, float)) and not isinstance(value, bool) else repr(value)))
    return dict(cases=out)


def _judge_sp_case(item):
    model, plan = P.Transformer(**item["case"]["model"]), P.Plan(**item["case"]["plan"])
    answer = item["answer"]
    if not isinstance(answer, (int, float)) or not math.isfinite(answer):
        return f"for {plan} the function returned {answer!r}: return a number of bytes"
    right = sequence_parallel_bytes_per_layer(model, plan)
    if abs(answer - right) <= 1e-9 * right:
        return None
    plain = P.activation_bytes_per_layer(model, plan)
    if abs(answer - plain) <= 1e-9 * plain and plan.tp > 1:
        split = ("the layer's input, kept for recomputation, is split along the sequence too"
                 if plan.recompute else "the LayerNorms' and dropouts' 10 s b h are split over "
                 "the t ranks too")
        return f"for {plan} that is the count without sequence parallelism: {split}"
    return (f"for a {model.layers}-layer model {model.hidden} wide, sequence {model.seq}, "
            f"{plan}: {answer:.4g} bytes, but the layer keeps {right:.4g}")


def _judge_sequence_parallel(data) -> str:
    judge_cases(data["cases"], _judge_sp_case)
    return ("correct: with sequence parallelism every activation of a layer is split over the "
            "tensor-parallel ranks")


check_sequence_parallel = checked("lesson12.sequence_parallel", _probe_sequence_parallel,
                                  _judge_sequence_parallel)
check_sequence_parallel.__doc__ = """Check ``fn(model, plan)``: one layer's activation bytes for
one micro-batch on one GPU with tensor and sequence parallelism (``planner.Transformer``,
``planner.Plan``)."""

# -- exercise 2: each pipeline stage's activations, predicted, then measured --------------------


def draw_pipeline(rng) -> dict:
    """Exercise 2's run: 2 stages, the micro-batch count and the context drawn.
    ``common.drawn("lesson12.pipeline", draw_pipeline)`` in the notebook."""
    return dict(micro_batches=int(rng.choice([2, 4, 8])), context=int(rng.choice([32, 48, 64])))


SHAPE = dict(vocab=96, d_model=64, layers=4, heads=4, global_batch=16)


def run_model(drawn: dict) -> P.Transformer:
    """The drawn run's model as the planner describes it (float32, its own head)."""
    return P.Transformer(layers=SHAPE["layers"], hidden=SHAPE["d_model"], heads=SHAPE["heads"],
                         seq=drawn["context"], vocab=SHAPE["vocab"],
                         global_batch=SHAPE["global_batch"], value_bytes=4, tied_head=False)


def stage_activation_bytes(model: P.Transformer, plan: P.Plan) -> list[float]:
    """Reference: the peak activation bytes of each pipeline stage of a TinyGPT under 1F1B
    (dp any, no recomputation): stage s keeps min(p - s, m) micro-batches of its layers; the
    last also keeps the head's (final norm in and out, its statistics, the log-softmax)."""
    ### BEGIN SOLUTION
    p, m = plan.pp, plan.micro_batches
    tokens = model.seq * P.micro_batch_size(model, plan)
    layer = P.tiny_gpt_bytes_per_layer(model, plan)
    head = tokens * (2 * model.hidden + 2 + model.vocab) * model.value_bytes
    return [model.layers // p * min(p - s, m) * layer + (head if s == p - 1 else 0.0)
            for s in range(p)]
    ### END SOLUTION


def _stage_cases(seed):
    if seed is None:
        return []
    import random

    g = random.Random(seed + 12)
    model = P.Transformer(layers=8, hidden=g.choice([32, 96]), heads=4, seq=g.choice([16, 40]),
                          vocab=96, global_batch=32, value_bytes=4, tied_head=False)
    return [(model, P.Plan(dp=1, tp=g.choice([1, 2]), pp=4, micro_batches=g.choice([2, 8]))),
            (model, P.Plan(dp=2, tp=1, pp=2, micro_batches=g.choice([1, 4])))]


def _measure(drawn):
    from course_lib import train_gpt

    return train_gpt.train(pp=2, micro_batches=drawn["micro_batches"], steps=1,
                           context=drawn["context"], **SHAPE)["activations"]


def _probe_stages(fn, drawn) -> dict:
    model = run_model(drawn)
    plan = P.Plan(dp=1, tp=1, pp=2, micro_batches=drawn["micro_batches"])
    predicted = fn(model, plan)
    measured = launch_checked(_measure, 2, (drawn,), timeout=120)
    hidden = [dict(case=_plain(m, p, hidden=True), answer=fn(m, p))
              for m, p in _stage_cases(grading_seed())]
    return dict(drawn=drawn, predicted=predicted, measured=measured, hidden=hidden)


def _numbers(value, n):
    return (isinstance(value, (list, tuple)) and len(value) == n and
            all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for v in value))


def _judge_stage_case(item):
    model, plan = P.Transformer(**item["case"]["model"]), P.Plan(**item["case"]["plan"])
    right = stage_activation_bytes(model, plan)
    if not _numbers(item["answer"], plan.pp):
        return f"for {plan} return one number per stage ({plan.pp})"
    if any(abs(a - r) > 1e-9 * r for a, r in zip(item["answer"], right, strict=True)):
        return f"for {plan} some stage's bytes are wrong"
    return None


def _judge_stages(data) -> str:
    drawn, predicted, measured = data["drawn"], data["predicted"], data["measured"]
    check_drawn("lesson12.pipeline", draw_pipeline, drawn)  # graded runs only
    if not _numbers(predicted, 2):
        raise ExerciseFailed(f"return a list of 2 numbers of bytes, one per stage, not "
                             f"{predicted!r}")
    off = [p / m - 1 for p, m in zip(predicted, measured, strict=True)]
    if max(abs(x) for x in off) > 0.02:
        worse = max(range(2), key=lambda s: abs(off[s]))
        hint = (" (which stage keeps the head's activations, and how many micro-batches does "
                "each stage hold at once under 1F1B?)")
        raise ExerciseFailed(f"stage {worse}'s prediction is {off[worse]:+.0%} off what the run "
                             f"kept{hint}")
    judge_cases(data["hidden"], _judge_stage_case)
    return (f"correct: both stages within {max(abs(x) for x in off):.1%} of the run "
            f"(m = {drawn['micro_batches']}, context {drawn['context']})")


check_stages = checked("lesson12.stages", _probe_stages, _judge_stages)
check_stages.__doc__ = """Check ``fn(model, plan)``, each pipeline stage's peak activation bytes,
against a run of the drawn plan: ``check_stages(fn, drawn)``."""
