"""Checks for lesson 12's exercises: two choices the planner lacks, recomputing only as many
layers as the memory needs, and splitting the layers over pipeline stages by their cost.

Korthikanti et al. 2022 (full, selective and partial recomputation); BLOOM (2022) and Llama 3
(Dubey et al. 2024) gave their first and last stages fewer layers. The planner recomputes all
layers or none and splits the layers by count; both answers are the exercise's, so their references
sit between solution markers and the student edition of the library leaves them out. Each check
is a probe (the student's kernel) and a judge (outside it): see :mod:`course_lib.exercises.common`.
The judges draw their cases themselves and take only the answers from the data (:mod:`.cases`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from course_lib import planner as P
from course_lib.exercises import practice
from course_lib.exercises.cases import digest, merged
from course_lib.exercises.common import (
    ExerciseFailed,
    HiddenTestFailed,
    checked,
    hidden_seed,
    judge_cases,
)

# -- exercise 1: recompute as few layers as fit ------------------------------------------------


def fewest_layers_to_recompute(model: P.Transformer, plan: P.Plan, budget: float) -> int | None:
    """Reference: the fewest of the model's last layers (nearest the head; a plan without
    pipelining) whose activations must be recomputed -- each keeps only its input, as with full
    recomputation -- for a GPU to fit in ``budget`` bytes; None if recomputing them all does not
    fit either. Recomputing the last k >= 1 layers saves k (full - kept) bytes, but backward
    recomputes the top one first, while every layer below still holds what it kept: k - 1 of
    them count. (Megatron-LM's "block" method recomputes the first k instead: lesson 12's
    question 4.)"""
    ### BEGIN SOLUTION
    none = P.memory(model, replace(plan, recompute=False))["total"]
    if none <= budget:
        return 0
    full = P.activation_bytes_per_layer(model, replace(plan, recompute=False))
    kept = P.activation_bytes_per_layer(model, replace(plan, recompute=True))
    for k in range(1, model.layers + 1):
        if none - (k - 1) * (full - kept) <= budget:
            return k
    return None
    ### END SOLUTION


def block_recompute_bytes(model: P.Transformer, plan: P.Plan, k: int) -> float:
    """A GPU's predicted bytes with k of the layers recomputed (0 <= k <= layers, no pipeline),
    for the judge's explanations (the exercise asks the inverse, so this too is an answer)."""
    ### BEGIN SOLUTION
    without = P.memory(model, replace(plan, recompute=False))["total"]
    if k == 0:
        return without
    saved = (P.activation_bytes_per_layer(model, replace(plan, recompute=False))
             - P.activation_bytes_per_layer(model, replace(plan, recompute=True)))
    return without - (k - 1) * saved
    ### END SOLUTION


GPT_13B_LONG = P.Transformer(layers=40, hidden=5120, heads=40, seq=8192, vocab=51_200,
                             global_batch=256)


def _block_cases(seed):
    gib = 2**30
    gpt_7b = P.Transformer(layers=32, hidden=4096, heads=32, seq=2048, vocab=51_200,
                           global_batch=512)
    cases = [(GPT_13B_LONG, P.Plan(dp=4, tp=8, pp=1, zero=1, micro_batches=64), 80 * gib),
             (gpt_7b, P.Plan(dp=8, tp=1, pp=1, zero=3, micro_batches=16), 40 * gib),
             (gpt_7b, P.Plan(dp=8, tp=1, pp=1, zero=3, micro_batches=64, attention="flash"),
              80 * gib),
             (gpt_7b, P.Plan(dp=2, tp=4, pp=1, zero=0, micro_batches=1), 40 * gib)]
    if seed is not None:
        import random

        g = random.Random(seed + 1200)
        heads = g.choice([16, 24, 32])
        model = P.Transformer(layers=g.choice([12, 24, 36]), hidden=heads * 128, heads=heads,
                              seq=g.choice([2048, 4096]), vocab=32_000, global_batch=64)
        plan = P.Plan(dp=2, tp=g.choice([2, 4, 8]), pp=1, zero=g.choice([1, 2, 3]),
                      micro_batches=g.choice([1, 4]), attention=g.choice(["stored", "flash"]),
                      sequence_parallel=g.random() < 0.5)
        none, every = (P.memory(model, replace(plan, recompute=r))["total"]
                       for r in (False, True))
        cases.append((model, plan, every + g.random() * (none - every)))
    return cases


# the visible cases' answers by their digests: the student edition judges them without them
BLOCK_DIGESTS = (
    "2c624232cdd221771294dfbb310aca000a0df6ac8b66b696d90ef06fdefb64a3",
    "670671cd97404156226e507973f2ab8330d3022ca96e0c93bdbdb320c41adcaf",
    "5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9",
    "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b",
)


def _plain(model, plan, hidden=False, **extra):
    return dict(model=dict(model.__dict__), plan=plan.as_dict(), hidden=hidden, **extra)


def _probe_block(fn) -> dict:
    out = []
    for i, (model, plan, budget) in enumerate(_block_cases(hidden_seed())):
        value = fn(model, plan, budget)
        whole = value is None or (isinstance(value, int) and not isinstance(value, bool))
        out.append(dict(case=_plain(model, plan, hidden=i >= 4, budget=budget),
                        answer=value if whole else repr(value)))
    return dict(cases=out)


def _judge_block_case(item):
    model, plan = P.Transformer(**item["case"]["model"]), P.Plan(**item["case"]["plan"])
    budget, answer = item["case"]["budget"], item["answer"]
    right = fewest_layers_to_recompute(model, plan, budget)
    if answer == right:
        return None
    where = f"{model.layers} layers {model.hidden} wide, {plan}, {P.size(budget)}"
    if not (answer is None or isinstance(answer, int)) or (
            answer is not None and not 0 <= answer <= model.layers):
        return (f"for {where} the function returned {answer!r}: return a number of layers "
                f"from 0 to {model.layers}, or None if recomputing all does not fit")
    if answer is None:
        return f"for {where} recomputing {right} layers fits: None is for when none does"
    if right is None:
        return f"for {where} even recomputing every layer does not fit: return None"
    if answer > right:
        return f"for {where} {right} recomputed layers already fit: recompute as few as fit"
    need = block_recompute_bytes(model, plan, answer)
    hint = (" (while backward recomputes a layer, that layer's whole activations are back)"
            if answer == right - 1 else "")
    return (f"for {where}, with {answer} layers recomputed a GPU needs {P.size(need)}, more "
            f"than the budget{hint}")


def _judge_block(data) -> str:
    own = {"cases": [{"case": _plain(model, plan, hidden=i >= 4, budget=budget)}
                     for i, (model, plan, budget) in enumerate(_block_cases(hidden_seed()))]}
    cases = merged(own, data, ("answer",))["cases"]  # the cases drawn here
    try:
        judge_cases(cases, _judge_block_case)
    except NotImplementedError:  # the student edition: the visible answers by their digests
        for i, (item, right) in enumerate(zip(cases, BLOCK_DIGESTS, strict=False)):
            if digest(item["answer"]) != right:
                model, plan = item["case"]["model"], P.Plan(**item["case"]["plan"])
                where = (f"{model['layers']} layers {model['hidden']} wide, {plan}, "
                         f"{P.size(item['case']['budget'])}")
                raise ExerciseFailed(f"visible case {i + 1} ({where}): {item['answer']!r} is "
                                     f"not the fewest layers that fit") from None
        return (f"recorded: right on the {len(BLOCK_DIGESTS)} visible cases; the grader judges "
                f"hidden ones")
    return ("correct: each recomputed layer saves its activations but its input, and one of "
            "them is whole again while backward recomputes it")


check_block_recompute = checked("lesson12.block_recompute", _probe_block, _judge_block)
check_block_recompute.__doc__ = """Check ``fn(model, plan, budget)``: the fewest layers to
recompute for one GPU of ``plan`` (no pipeline) to fit in ``budget`` bytes, or None."""

# -- exercise 2: split the layers so that the busiest stage is as light as it can be -------------

# units in order (the embedding, the blocks, the head), each its compute time; exact binary
# fractions, so that every stage's sum is exact and the student edition can compare digests
VISIBLE_SPLITS = [([1.0] * 8 + [3.0], 4),  # eight blocks and a head worth three
                  ([0.5] + [1.0] * 14 + [2.5], 4),  # an embedding, 14 blocks, a heavy head
                  ([4.0, 1.0, 1.0, 1.0, 4.0, 1.0, 1.0, 1.0, 4.0], 3),
                  ([2.0, 0.25, 0.25, 0.25, 0.25, 3.0], 1)]


def _split_cases(seed) -> dict:
    """The visible splits, and in a graded run three drawn: 6 to 40 units of 1/4 to 4 (in
    sixteenths), over 2 to 8 stages."""
    cases = {"visible": [{"costs": c, "p": p} for c, p in VISIBLE_SPLITS]}
    if seed is not None:
        import random

        g = random.Random(seed + 1212)
        hidden = []
        for _ in range(3):
            n = g.randint(6, 40)
            hidden.append({"costs": [g.randint(4, 64) / 16 for _ in range(n)],
                           "p": g.randint(2, min(8, n))})
        cases["hidden"] = hidden
    return cases


def _probe_split(split_stages) -> dict:
    data = {}
    for name, cases in _split_cases(hidden_seed()).items():
        rows = []
        for case in cases:
            got = split_stages(list(case["costs"]), case["p"])
            rows.append(case | {"split": list(got) if isinstance(got, (list, tuple)) else
                                repr(got)})
        data[name] = rows
    return data


def lightest_busiest_stage(costs, p: int) -> float:
    """The smallest possible time of the busiest of ``p`` stages of contiguous units (each at
    least one), by dynamic programming over where the last stage starts."""
    ### BEGIN SOLUTION
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    best = [prefix[j] for j in range(n + 1)]  # one stage holds units 0..j-1
    for stages in range(2, p + 1):
        best = [math.inf] * stages + [min(max(best[i], prefix[j] - prefix[i])
                                          for i in range(stages - 1, j))
                                      for j in range(stages, n + 1)]
    return best[n]
    ### END SOLUTION


def busiest_stage(costs, split) -> tuple[int, float]:
    """The busiest stage of ``split`` (units per stage) and its time, summed in order."""
    times, start = [], 0
    for size in split:
        times.append(sum(costs[start:start + size]))
        start += size
    return max(range(len(times)), key=times.__getitem__), max(times)


def _split_wrong(row) -> str | None:
    costs, p, split = row["costs"], row["p"], row["split"]
    if shape := _split_shape(row):
        return shape
    stage, busiest = busiest_stage(costs, split)
    if busiest > lightest_busiest_stage(costs, p) * (1 + 1e-9):
        return (f"{len(costs)} units over {p} stages: your busiest stage, stage {stage}, takes "
                f"{busiest:g}; another split has a lighter busiest stage. Try every size of the "
                f"last stage, and the best split of what is left over one stage fewer")
    return None


def _judge_split(data) -> str:
    data = merged(_split_cases(hidden_seed()), data, ("split",))  # the costs drawn here
    try:
        wrong = next(filter(None, map(_split_wrong, data["visible"])), None)
    except NotImplementedError:  # the student edition: the visible optima by their digests
        for row in data["visible"]:
            if shape := _split_shape(row):
                raise ExerciseFailed(shape) from None
            busiest = busiest_stage(row["costs"], row["split"])[1]
            try:
                practice.judge("lesson12.split_stages", [row["costs"], row["p"]],
                               {"busiest": busiest})
            except ExerciseFailed:
                raise ExerciseFailed(f"{len(row['costs'])} units over {row['p']} stages: your "
                                     f"busiest stage takes {busiest:g}; another split has a "
                                     f"lighter one") from None
        return "correct for the visible costs (the grader runs your code on costs of its own)"
    if wrong:
        raise ExerciseFailed(wrong)
    if "hidden" in data and any(map(_split_wrong, data["hidden"])):
        raise HiddenTestFailed("a hidden case failed")
    return ("correct: your splits make the busiest stage as light as it can be; where the "
            "embedding and the head cost less or more than a block, the end stages hold more or "
            "fewer blocks")


def _split_shape(row) -> str | None:
    """What is wrong with a split's shape (no reference needed), or None."""
    costs, p, split = row["costs"], row["p"], row["split"]
    if not (isinstance(split, list) and len(split) == p and all(
            isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in split)):
        return (f"{len(costs)} units over {p} stages: the function returned {split!r}; return "
                f"a list of {p} whole numbers, each stage's units (at least one)")
    if sum(split) != len(costs):
        return f"{len(costs)} units over {p} stages: the stages hold {sum(split)} units"
    return None


practice.register("lesson12.split_stages",
                  lambda case: {"busiest": [lightest_busiest_stage(*case)]},
                  cases=[[c, p] for c, p in VISIBLE_SPLITS])

check_split_stages = checked("lesson12.split_stages", _probe_split, _judge_split)
check_split_stages.__doc__ = """Check ``split_stages(costs, p)``: the units per stage (in order,
each at least one) that make the busiest of ``p`` contiguous stages as light as it can be."""
