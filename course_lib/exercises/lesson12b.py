"""Checks for lesson 12b's exercises: a prediction of each pipeline stage's activations checked
against a run, and how many pairs of plans a prediction puts in the measured order.

Narayanan et al. 2021 (1F1B keeps at most p - s micro-batches in flight on stage s); Kendall
1938 (the pairs a ranking orders right: the planner is for choosing, so its order matters more
than its seconds). The planner reports the busiest stage only and has no pair count; both answers
are the exercise's, so their references sit between solution markers and the student edition of
the library leaves them out. Each check is a probe (the student's kernel) and a judge (outside
it): see :mod:`course_lib.exercises.common`. The judges draw their cases themselves and take only
the answers from the data (:mod:`.cases`).
"""

from __future__ import annotations

from course_lib import planner as P
from course_lib.exercises import practice
from course_lib.exercises.cases import merged
from course_lib.exercises.common import (
    ExerciseFailed,
    HiddenTestFailed,
    are_numbers,
    check_drawn,
    checked,
    hidden_seed,
    is_number,
    judge_cases,
    launch_checked,
)


def _plain(model, plan, hidden=False, **extra):
    return dict(model=dict(model.__dict__), plan=plan.as_dict(), hidden=hidden, **extra)


# -- exercise 1: each pipeline stage's activations, predicted, then measured --------------------


def draw_pipeline(rng) -> dict:
    """Exercise 1's run: 2 stages, the micro-batch count and the context drawn.
    ``common.drawn("lesson12b.pipeline", draw_pipeline)`` in the notebook."""
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
              for m, p in _stage_cases(hidden_seed())]
    return dict(drawn=drawn, predicted=predicted, measured=measured, hidden=hidden)


def _judge_stage_case(item):
    model, plan = P.Transformer(**item["case"]["model"]), P.Plan(**item["case"]["plan"])
    right = stage_activation_bytes(model, plan)
    if not are_numbers(item["answer"], plan.pp):
        return f"for {plan} return one number per stage ({plan.pp})"
    if any(abs(a - r) > 1e-9 * r for a, r in zip(item["answer"], right, strict=True)):
        return f"for {plan} some stage's bytes are wrong"
    return None


def _judge_stages(data) -> str:
    drawn, predicted, measured = data["drawn"], data["predicted"], data["measured"]
    check_drawn("lesson12b.pipeline", draw_pipeline, drawn)  # graded runs only
    if not are_numbers(predicted, 2):
        raise ExerciseFailed(f"return a list of 2 numbers of bytes, one per stage, not "
                             f"{predicted!r}")
    if not (are_numbers(measured, 2) and all(m > 0 for m in measured)):  # NaN passed below
        raise ExerciseFailed("pass the bytes the run measured, a positive number per stage")
    off = [p / m - 1 for p, m in zip(predicted, measured, strict=True)]
    if not max(abs(x) for x in off) <= 0.02:
        worse = max(range(2), key=lambda s: abs(off[s]))
        hint = (" (which stage keeps the head's activations, and how many micro-batches does "
                "each stage hold at once under 1F1B?)")
        raise ExerciseFailed(f"stage {worse}'s prediction is {off[worse]:+.0%} off what the run "
                             f"kept{hint}")
    own = {"hidden": [{"case": _plain(m, p, hidden=True)}
                      for m, p in _stage_cases(hidden_seed())]}
    hidden = merged(own, {"hidden": data.get("hidden", [])}, ("answer",))["hidden"]
    judge_cases(hidden, _judge_stage_case)  # the hidden cases drawn here, not read
    return (f"correct: both stages within {max(abs(x) for x in off):.1%} of the run "
            f"(m = {drawn['micro_batches']}, context {drawn['context']})")


check_stages = checked("lesson12b.stages", _probe_stages, _judge_stages)
check_stages.__doc__ = """Check ``fn(model, plan)``, each pipeline stage's peak activation bytes,
against a run of the drawn plan: ``check_stages(fn, drawn)``."""


# -- exercise 2: the pairs of plans a prediction puts in the measured order ----------------------

# (predicted, measured) seconds of plans: an earlier run of section 4 on the emulated device
# (one process, data, tensor, pipeline, ZeRO-1, FSDP, data + recomputation; the step less its
# wait), and two made up, with ties on both sides
VISIBLE_RANKINGS = [
    ([0.467, 0.240, 0.261, 0.301, 0.240, 0.248, 0.317],
     [0.467, 0.240, 0.284, 0.300, 0.245, 0.269, 0.290]),
    ([1.0, 1.0, 2.0, 3.0], [1.0, 2.0, 2.0, 3.0]),
    ([0.3, 0.1, 0.2], [0.5, 0.5, 0.5]),
]


def _ranking_cases(seed) -> dict:
    """The visible rankings, and in a graded run three drawn: 4 to 12 plans, times from a
    prediction with noise, some of them tied."""
    cases = {"visible": [{"predicted": p, "measured": m} for p, m in VISIBLE_RANKINGS]}
    if seed is not None:
        import random

        g = random.Random(seed + 1213)
        hidden = []
        for _ in range(3):
            n = g.randint(4, 12)
            predicted = [g.choice([0.1, 0.2, 0.3]) if g.random() < 0.3 else g.uniform(0.1, 1)
                         for _ in range(n)]
            measured = [round(t * g.uniform(0.7, 1.5), 2) for t in predicted]
            hidden.append({"predicted": predicted, "measured": measured})
        cases["hidden"] = hidden
    return cases


def _probe_pairs(pairs_in_order) -> dict:
    data = {}
    for name, cases in _ranking_cases(hidden_seed()).items():
        rows = []
        for case in cases:
            got = pairs_in_order(list(case["predicted"]), list(case["measured"]))
            rows.append(case | {"share": got if got is None or is_number(got) else repr(got)})
        data[name] = rows
    return data


def share_in_order(predicted, measured) -> float | None:
    """Of the pairs of plans whose measured times differ, the share the prediction orders the
    same way, a tie in the prediction counting one half; None if no measured times differ."""
    ### BEGIN SOLUTION
    right, pairs = 0.0, 0
    for i in range(len(measured)):
        for j in range(i + 1, len(measured)):
            if measured[i] == measured[j]:
                continue
            pairs += 1
            same = (predicted[i] - predicted[j]) * (measured[i] - measured[j])
            right += 1.0 if same > 0 else 0.5 if same == 0 else 0.0
    return right / pairs if pairs else None
    ### END SOLUTION


def _pairs_wrong(row) -> str | None:
    share, right = row["share"], share_in_order(row["predicted"], row["measured"])
    if right is None:
        return None if share is None else (f"{len(row['measured'])} plans whose measured times "
                                           f"are all equal: return None, there is no order")
    if share is None or isinstance(share, str) or abs(share - right) > 1e-9:
        return (f"{len(row['measured'])} plans: {share!r} is not the share of pairs in the "
                f"measured order. Count only pairs whose measured times differ; a tie in the "
                f"prediction counts one half")
    return None


def _judge_pairs(data) -> str:
    data = merged(_ranking_cases(hidden_seed()), data, ("share",))  # the times drawn here
    try:
        wrong = next(filter(None, map(_pairs_wrong, data["visible"])), None)
    except NotImplementedError:  # the student edition: the visible shares by their digests
        for row in data["visible"]:
            share = row["share"]
            practice.judge("lesson12b.pairs_in_order", [row["predicted"], row["measured"]],
                           {"share": _rounded(share)}, {"share": share})
        return "correct for the visible rankings (the grader runs your code on rankings of its own)"
    if wrong:
        raise ExerciseFailed(wrong)
    if "hidden" in data and any(map(_pairs_wrong, data["hidden"])):
        raise HiddenTestFailed("a hidden case failed")
    first = data["visible"][0]["share"]
    return (f"correct: in an earlier run on the emulated device (its times typed into the check) "
            f"the planner put {first:.0%} of the pairs of plans in the measured order")


def _rounded(share):
    return share if share is None or isinstance(share, str) else round(share, 9)


practice.register("lesson12b.pairs_in_order", lambda case: {
    "share": [_rounded(share_in_order(*case))]}, cases=[[p, m] for p, m in VISIBLE_RANKINGS])

check_pairs_in_order = checked("lesson12b.pairs_in_order", _probe_pairs, _judge_pairs)
check_pairs_in_order.__doc__ = """Check ``pairs_in_order(predicted, measured)``: of the pairs of
plans whose measured times differ, the share the predicted times order the same way (a predicted
tie counting one half), or None when no measured times differ."""
