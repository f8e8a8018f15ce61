"""Checks for lesson 13's exercises: merging two blocks' attention from their outputs and
log-sum-exps, and a prediction of the assignments a capacity factor drops, checked against a run.

Milakov & Gimelshein 2018 and FlashAttention (Dao et al. 2022) for the online softmax and the
log-sum-exp a block's result carries; ring attention (Liu et al. 2023) merges such results;
GShard (Lepikhin et al. 2020) and Switch Transformer (Fedus et al. 2021) for the capacity. Each
check is a probe (the student's kernel) and a judge (outside it): see
:mod:`course_lib.exercises.common`. The merge's judge draws its cases itself and takes only the
student's outputs from the data (:mod:`.cases`); it compares them with the whole attention,
computed at once, so the student edition judges the visible cases too. The capacity's judge runs
the drawn router again and counts what it dropped.
"""

from __future__ import annotations

import math

import torch

from course_lib.exercises.cases import merged
from course_lib.exercises.common import (
    ExerciseFailed,
    check_drawn,
    checked,
    hidden_seed,
    is_whole,
    judge_cases,
)

# -- exercise 1: merge two blocks' attention ---------------------------------------------------

TOLERANCE = 1e-9  # relative, float64


def _merge_cases(seed) -> list[dict]:
    """The visible cases (plain; huge scores; a causal split where the second block hides every
    key from the first queries) and, when graded, hidden ones drawn from ``seed``."""
    cases = [dict(heads=2, tokens=6, dim=4, split=3, causal=False, scale=1.0, seed=0,
                  swap=False),
             dict(heads=1, tokens=5, dim=3, split=2, causal=False, scale=2000.0, seed=1,
                  swap=False),
             dict(heads=2, tokens=8, dim=4, split=4, causal=True, scale=1.0, seed=2,
                  swap=False)]
    if seed is not None:
        import random

        g = random.Random(seed + 1300)
        for _ in range(3):
            tokens = g.randint(3, 12)
            cases.append(dict(heads=g.randint(1, 3), tokens=tokens, dim=g.choice([2, 4, 8]),
                              split=g.randint(1, tokens - 1), causal=g.random() < 0.7,
                              scale=g.choice([1.0, 1500.0]), seed=g.randint(0, 10**6),
                              swap=g.random() < 0.5, hidden=True))
    return cases


def _qkv(case):
    g = torch.Generator().manual_seed(case["seed"])
    shape = (case["heads"], case["tokens"], case["dim"])
    q, k, v = (torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(3))
    return q * case["scale"], k, v


def _scores(case):
    q, k, v = _qkv(case)
    s = q @ k.transpose(-2, -1) / math.sqrt(case["dim"])
    if case["causal"]:
        n = case["tokens"]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return s, v


def block_result(case, keys):
    """One block's attention over the key positions ``keys``: (output, log-sum-exp), the output
    0 and the log-sum-exp -inf for a query the block hides every key from."""
    s, v = _scores(case)
    s, v = s[..., keys], v[..., keys, :]
    lse = torch.logsumexp(s, dim=-1)
    seen = torch.isfinite(lse)[..., None]
    weights = torch.where(seen, torch.exp(s - torch.where(seen, lse[..., None], 0.0)), 0.0)
    return weights @ v, lse


def _blocks(case):
    first, second = list(range(case["split"])), list(range(case["split"], case["tokens"]))
    return (second, first) if case["swap"] else (first, second)


def _probe_merge(merge) -> dict:
    out = []
    for case in _merge_cases(hidden_seed()):
        (out_a, lse_a), (out_b, lse_b) = (block_result(case, keys) for keys in _blocks(case))
        got = merge(out_a, lse_a, out_b, lse_b)
        if not (isinstance(got, (tuple, list)) and len(got) == 2
                and all(isinstance(t, torch.Tensor) for t in got)):
            raise ExerciseFailed("return two tensors: (the merged output, its log-sum-exp)")
        out.append(dict(case=case, out=got[0].double(), lse=got[1].double()))
    return {"cases": out}


def _close(got, right) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == right.shape
            and bool(torch.isfinite(got[torch.isfinite(right)]).all())
            and torch.allclose(got, right, rtol=TOLERANCE, atol=TOLERANCE, equal_nan=False))


def _judge_merge_case(item) -> str | None:
    case, got_out, got_lse = item["case"], item["out"], item["lse"]
    s, v = _scores(case)
    right_lse = torch.logsumexp(s, dim=-1)
    right_out = torch.softmax(s, dim=-1) @ v  # the whole attention, at once
    where = (f"{case['heads']} heads, {case['tokens']} tokens split at {case['split']}"
             + (", causal" if case["causal"] else "") + (f", scores x{case['scale']:g}"
                                                         if case["scale"] != 1 else ""))
    if not isinstance(got_out, torch.Tensor) or got_out.shape != right_out.shape:
        return f"{where}: the output must have the blocks' shape {tuple(right_out.shape)}"
    if not isinstance(got_lse, torch.Tensor) or got_lse.shape != right_lse.shape:
        return f"{where}: the log-sum-exp must have shape {tuple(right_lse.shape)}"
    out_ok, lse_ok = _close(got_out, right_out), _close(got_lse, right_lse)
    if out_ok and lse_ok:
        return None
    broken = ~torch.isfinite(got_out).all(dim=-1) | ~torch.isfinite(got_lse)  # per query
    if bool(broken.any()):
        (_, lse_a), (_, lse_b) = (block_result(case, keys) for keys in _blocks(case))
        if bool(torch.isinf(torch.minimum(lse_a, lse_b))[broken].any()):
            return (f"{where}: NaN or inf where a block hides every key from a query (its "
                    f"log-sum-exp is -inf): such a block must add nothing, not exp(-inf - "
                    f"-inf)")
        return (f"{where}: NaN or inf: exp of a log-sum-exp this large overflows; weigh each "
                f"block by exp(its lse minus the larger one)")
    if not lse_ok:
        return (f"{where}: the output is {'right' if out_ok else 'wrong too'}, the log-sum-exp "
                f"is not: it is the log of the sum of both blocks' sums of exponentials")
    return (f"{where}: the output is off by up to "
            f"{(got_out - right_out).abs().max().item():.3g}: each block's output is already "
            f"normalised by its own sum; weigh it by its share of the whole sum")


def _judge_merge(data) -> str:
    own = {"cases": [{"case": case} for case in _merge_cases(hidden_seed())]}
    data = merged(own, data, ("out", "lse"))  # the cases drawn here, not read
    judge_cases(data["cases"], _judge_merge_case)
    return (f"correct: the merge equals the whole attention, output and log-sum-exp, in all "
            f"{len(data['cases'])} cases (huge scores and hidden blocks included)")


check_merge = checked("lesson13.merge", _probe_merge, _judge_merge)
check_merge.__doc__ = """Check ``merge(out_a, lse_a, out_b, lse_b)``: two blocks' attention
results over disjoint keys (outputs normalised within each block, and the log-sum-exp of each
query's scores, -inf where a block hides every key) merged into the attention over both:
returns (output, log-sum-exp)."""

# -- exercise 2: the assignments a capacity factor drops, predicted, then run -------------------

TOKENS, D_MODEL, EXPERTS = 50, 8, 4  # 50 tokens: f x 50 k / 4 is often not whole: rounding counts


def draw_capacity(rng) -> list:
    """Exercise 2's router and capacity ``[seed, k, factor]``: ``common.drawn("lesson13.capacity",
    draw_capacity)`` in the notebook (fresh every run; the grader's run seeds it)."""
    return [int(rng.integers(10**6)), int(rng.choice([1, 2])),
            float(rng.choice([0.5, 0.75, 1.0, 1.25]))]


def capacity_run(seed: int, k: int, factor: float):
    """The exercise's mixture (``experts.MixtureOfExperts``, 4 experts) and batch of 50 tokens,
    built from the drawn seed: (layer, tokens). ``layer(tokens)`` runs it."""
    from course_lib.experts import MixtureOfExperts

    layer = MixtureOfExperts(D_MODEL, 16, EXPERTS, k, factor, seed=seed, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    return layer, torch.randn(TOKENS, D_MODEL, generator=g, dtype=torch.float64)


def _probe_capacity(dropped, seed, k, factor) -> dict:
    """``dropped``: the student's prediction; ``seed``, ``k``, ``factor``: the run's draw."""
    return {"answer": dropped, "seed": seed, "k": k, "factor": factor}


def _capacity_hint(answer: int, load, k: int, factor: float, right: int) -> str | None:
    """What a wrong count most likely did (the student edition leaves this out: the wrong
    counts it recomputes are one step from the right one)."""
    ### BEGIN SOLUTION
    floor = max(1, math.floor(factor * TOKENS * k / EXPERTS))
    without_k = max(1, math.ceil(factor * TOKENS / EXPERTS))
    hints = {sum(max(0, n - floor) for n in load): "round the capacity up, not down",
             sum(max(0, n - without_k) for n in load): "the capacity counts k assignments per "
                                                       "token: factor x tokens x k / experts",
             TOKENS * k - right: "that is how many were kept"}
    return hints.get(answer)
    ### END SOLUTION


def _judge_capacity(data) -> str:
    from course_lib.experts import capacity

    answer, seed, k, factor = (data[key] for key in ("answer", "seed", "k", "factor"))
    check_drawn("lesson13.capacity", draw_capacity, [seed, k, factor])
    if not (is_whole(seed) and seed >= 0 and k in (1, 2) and factor in (0.5, 0.75, 1.0, 1.25)):
        raise ExerciseFailed("pass the seed, k and factor the exercise cell drew")
    if not is_whole(answer):
        raise ExerciseFailed(f"give the dropped assignments as a whole number, not {answer!r}")
    layer, x = capacity_run(int(seed), k, factor)
    with torch.no_grad():
        layer(x)
    right, load = layer.stats["dropped"], layer.stats["tokens_per_expert"]
    cap = capacity(TOKENS, EXPERTS, k, factor)
    if int(answer) == right:
        return (f"correct: each expert takes {cap} of the {TOKENS * k} assignments' slots; the "
                f"load {load} drops {right}")
    try:
        hint = _capacity_hint(int(answer), load, k, factor, right)
    except NotImplementedError:  # the student edition: the hints are near the answer
        hint = None
    hint = hint or (f"an expert keeps at most ceil(factor x tokens x k / experts) = {cap} "
                    f"assignments: count what is over it, expert by expert")
    raise ExerciseFailed(f"{int(answer)} is not what the run dropped (k = {k}, factor "
                         f"{factor:g}, load {load}): {hint}")


check_capacity_drops = checked("lesson13.capacity_drops", _probe_capacity, _judge_capacity)
check_capacity_drops.__doc__ = """Check the number of assignments the exercise's router drops at
its drawn capacity factor: ``check_capacity_drops(dropped, seed, k, factor)``."""
