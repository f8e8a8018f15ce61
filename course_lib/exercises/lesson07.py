"""Checks for lesson 7's exercises: loss scaling and stochastic rounding.

Micikevicius et al. 2018; the article's lower precision.
"""

from __future__ import annotations

import torch

from course_lib.exercises.common import ExerciseFailed


def check_update_scale(update_scale) -> str:
    """Check ``update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
    growth_interval) -> (scale, growth_tracker)`` against the rule ``torch.amp.GradScaler``
    runs (``torch._amp_update_scale_``) on a sequence of clean and overflowing steps."""
    flags = [False, False, True, False, False, False, False, True, True, False, False, False]
    rule = dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    scale, tracker = 1024.0, 0
    ref_scale, ref_tracker = torch.tensor([1024.0]), torch.zeros(1, dtype=torch.int32)
    for step, found_inf in enumerate(flags):
        out = update_scale(scale, tracker, found_inf, **rule)
        if not isinstance(out, tuple) or len(out) != 2:
            raise ExerciseFailed(f"update_scale returned {out!r}: return (scale, growth_tracker)")
        scale, tracker = out
        torch._amp_update_scale_(ref_scale, ref_tracker, torch.tensor([float(found_inf)]),
                                 rule["growth_factor"], rule["backoff_factor"],
                                 rule["growth_interval"])
        if (scale, tracker) != (ref_scale.item(), ref_tracker.item()):
            what = "an inf/NaN" if found_inf else "a clean step"
            raise ExerciseFailed(
                f"after step {step} ({what}) you have scale {scale:g}, tracker {tracker}; "
                f"GradScaler has scale {ref_scale.item():g}, tracker {ref_tracker.item()}. "
                f"On an inf: scale x backoff and the tracker back to 0; on a clean step: count "
                f"it, and when the count reaches growth_interval grow and start again from 0.")
    return f"correct: your rule follows GradScaler's for {len(flags)} steps (3 overflows)"


def check_stochastic_round(stochastic_round) -> str:
    """Check ``stochastic_round(x, generator)``: integers, within 1 of x, unbiased, random."""
    x = torch.linspace(-3.0, 3.0, 601, dtype=torch.float64).repeat(200)
    r = stochastic_round(x, torch.Generator().manual_seed(0))
    if r is None or not isinstance(r, torch.Tensor) or r.shape != x.shape:
        raise ExerciseFailed("return a tensor of the same shape as x")
    if not torch.equal(r, torch.round(r)):
        raise ExerciseFailed("some results are not whole numbers: round to an integer")
    worst = (r - x).abs().max().item()
    if worst >= 1:
        raise ExerciseFailed(f"a result is {worst:.3g} away from its input: round to one of "
                             f"the two neighbouring integers")
    if torch.equal(r, torch.round(x)) or torch.equal(r, torch.floor(x)):
        raise ExerciseFailed("that is deterministic rounding: round up with probability equal "
                             "to the fraction, using the generator")
    bias = (r - x).reshape(200, 601).mean(dim=0).abs().max().item()
    if bias > 0.15:
        raise ExerciseFailed(f"biased: averaged over 200 draws, a value is off by {bias:.2f}; "
                             f"round up with probability x - floor(x)")
    return f"correct: integers, within 1, unbiased (largest average error {bias:.3f})"
