"""Checks for lesson 3's exercises: collectives and the alpha-beta model.

Slides part 3 (all-reduce).
"""

from __future__ import annotations

from course_lib.exercises.common import ExerciseFailed


def check_half_latency_size(half_latency_size) -> str:
    """Check ``half_latency_size(alpha, beta, p)``: the message size n at which the efficient
    ring's latency part 2 (p - 1) alpha equals its bandwidth part 2 (p - 1) / p n beta."""
    for alpha, beta, p in ((1e-3, 1e-9, 2), (5e-5, 2e-10, 8)):
        n = half_latency_size(alpha, beta, p)
        if n is None:
            raise ExerciseFailed("half_latency_size returned None: return the size n in bytes")
        latency, bandwidth = 2 * (p - 1) * alpha, 2 * (p - 1) / p * n * beta
        if abs(latency - bandwidth) > 1e-9 * latency:
            raise ExerciseFailed(f"for alpha={alpha}, beta={beta}, p={p} you gave n = {n:.4g}: "
                                 f"there the latency part is {latency:.3g} s but the bandwidth "
                                 f"part {bandwidth:.3g} s")
    return "correct: at that size both parts cost the same"
