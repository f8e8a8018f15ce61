"""Honest timing: warm-up, repeats, median and spread, with the GPU synchronised.

Lecture: "Parallel computing for empirical risk minimization", section 3 (the speedup ratio is a
ratio of measured times, so the times must be trustworthy). The first call of anything pays for
imports, allocations and caches, and single runs on a shared machine vary by tens of percent:
report the median of several runs and how far they spread.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch


def synchronize(device=None) -> None:
    """Wait for queued GPU work (CUDA kernels run asynchronously); nothing to do on the CPU."""
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device is None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@dataclass
class Timing:
    """Wall times of repeated runs, in seconds."""

    times: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def quartiles(self) -> tuple[float, float]:
        """First and third quartile (both equal the single time when there is one run)."""
        if len(self.times) < 2:
            return self.times[0], self.times[0]
        q = statistics.quantiles(self.times, n=4, method="inclusive")
        return q[0], q[2]

    @property
    def spread(self) -> float:
        """Interquartile range: how far the middle half of the runs lie apart."""
        low, high = self.quartiles
        return high - low

    def __str__(self):
        scale, unit = (1e3, "ms") if self.median < 1 else (1.0, "s")
        return (f"{self.median * scale:.3g} {unit} median, IQR {self.spread * scale:.2g} {unit} "
                f"(min {min(self.times) * scale:.3g}, max {max(self.times) * scale:.3g}, "
                f"{len(self.times)} runs)")


def measure(fn, *, repeats: int = 5, warmup: int = 1, device=None) -> Timing:
    """Call ``fn()`` ``warmup`` times untimed, then ``repeats`` times timed.

    With a CUDA ``device`` (or CUDA in use when ``device`` is None) the GPU is synchronised
    before and after each run, so the time covers the work and not only its launch.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return Timing(times)
