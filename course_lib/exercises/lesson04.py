"""Checks for lesson 4's exercises: data parallelism and large batches.

Slides part 3; Goyal et al. 2017.
"""

from __future__ import annotations

from course_lib.exercises.common import ExerciseFailed


def check_large_batch_lr(large_batch_lr) -> str:
    """Check ``large_batch_lr(step, base_lr, base_batch, batch, warmup_steps)``: the linear
    scaling rule's target, reached by a linear warm-up (lesson 4)."""
    from course_lib import data_parallel as dp

    for step, batch, warm in [(0, 256, 10), (5, 256, 10), (10, 256, 10), (50, 512, 10),
                              (3, 64, 0)]:
        target = dp.linear_scaling_lr(0.05, 32, batch)
        right = dp.warmup_lr(step, target, warm, 0.05) if warm else target
        got = large_batch_lr(step, 0.05, 32, batch, warm)
        if got is None or abs(got - right) > 1e-12:
            raise ExerciseFailed(f"step {step}, batch {batch}, warm-up {warm} steps: you gave "
                                 f"{got!r}, the schedule gives {right:.4g} (target "
                                 f"{target:.4g})")
    return "correct: the scaled target, reached by a linear warm-up"
