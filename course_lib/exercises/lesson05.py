"""Checks for lesson 5's exercises: pipeline schedules.

The article's model parallelism; Narayanan et al. 2021 (1F1B).
"""

from __future__ import annotations

from course_lib.exercises.common import ExerciseFailed


def check_1f1b_order(one_f_one_b) -> str:
    """Check ``one_f_one_b(stage, stages, micro_batches)`` against the 1F1B schedule: the
    first action that differs, and what it should be (lesson 5)."""
    from course_lib import pipeline as pp

    for stages, micro_batches in [(2, 4), (4, 8), (4, 2), (3, 1)]:
        for stage in range(stages):
            got = one_f_one_b(stage, stages, micro_batches)
            right = pp.one_f_one_b_schedule(stage, stages, micro_batches)
            if got != right:
                got = list(got or [])
                pairs = enumerate(zip(got, right, strict=False))
                first = next((k for k, (a, b) in pairs if a != b), min(len(got), len(right)))
                should = right[first] if first < len(right) else "nothing"
                is_ = got[first] if first < len(got) else "missing"
                raise ExerciseFailed(f"stage {stage} of {stages}, m = {micro_batches}: action "
                                     f"{first} should be {should} but is {is_} (right order: "
                                     f"{right})")
    return "correct: every stage's 1F1B order matches"
