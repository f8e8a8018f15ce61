"""Honest timing: warm-up, repeats, median and spread, with the GPU synchronised; timelines.

Lecture: "Parallel computing for empirical risk minimization", section 2.4 (the speedup ratio is a
ratio of measured times, so the times must be trustworthy). The first call of anything pays for
imports, allocations and caches, and single runs on a shared machine vary by tens of percent:
report the median of several runs and how far they spread.

Slides part 2 draw timelines of workers (compute, communicate, wait). Every Gantt chart of the
course is a list of :class:`Span`; a rank records what it did with a :class:`Timeline`, and
:func:`to_spans` turns the ranks' records into spans on one clock.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import NamedTuple

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

    def __post_init__(self):
        self.times = list(self.times)
        if not self.times or not all(0 <= t < float("inf") for t in self.times):
            raise ValueError(f"a Timing needs one or more times, each finite and zero or more; got "
                             f"{self.times[:10]}")

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


def _check_counts(repeats, warmup) -> None:
    """Refuse, naming them, repeats that are not a whole number >= 1 or warmups not >= 0."""
    for name, value, least in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be a whole number of at least {least}, got {value!r}")


def measure(fn, *, repeats: int = 5, warmup: int = 1, device=None) -> Timing:
    """Call ``fn()`` ``warmup`` times untimed, then ``repeats`` times timed.

    With a CUDA ``device`` (or CUDA in use when ``device`` is None) the GPU is synchronised
    before and after each run, so the time covers the work and not only its launch.
    """
    _check_counts(repeats, warmup)
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


def measure_interleaved(fns: dict, *, repeats: int = 5, warmup: int = 1,
                        device=None) -> dict:
    """Time several variants of one computation (name -> ``fn``) fairly: warm each up, then run
    them in turn, ``repeats`` rounds, so that a slow spell of the machine (another process, a
    clock change) falls on every variant alike instead of on whichever ran during it."""
    _check_counts(repeats, warmup)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return {name: Timing(t) for name, t in times.items()}


def median_of_slowest(runs_per_rank) -> float:
    """A collective (or a parallel step) ends when its last rank does: for each repeat take the
    slowest rank's time, then the median over repeats. ``runs_per_rank[r][i]`` is rank r's time
    of repeat i."""
    return statistics.median(max(runs) for runs in zip(*runs_per_rank, strict=True))


# -- timelines ------------------------------------------------------------------------------------


def to_spans(timelines, origin: float | None = None) -> list[Span]:
    """Spans of several ranks' :class:`Timeline` on one clock, time 0 at ``origin`` (default:
    the earliest record). A record that began before ``origin`` is cut there; one that ended
    before it is left out."""
    timelines = list(timelines)
    if origin is None:
        if not any(t.records for t in timelines):
            raise ValueError("no timeline holds a record: pass the ranks' Timelines after a run")
        origin = min(start for t in timelines for _, start, _ in t.records)
    spans = []
    for t in timelines:
        for kind, start, end in t.records:
            start = max(start, origin)
            if end > start:
                spans.append(Span(t.lane, start - origin, end - start, kind))
    return spans


def spans_until(spans, seconds: float) -> list[Span]:
    """The spans that start in the first ``seconds``, cut at ``seconds``."""
    return [Span(lane, start, min(duration, seconds - start), kind)
            for lane, start, duration, kind in spans if start < seconds]


class Span(NamedTuple):
    """One bar of a Gantt chart: on ``lane`` (a worker, rank or stage), from ``start`` for
    ``duration`` (seconds, or a model's time units), doing ``kind``."""

    lane: int
    start: float
    duration: float
    kind: str


@dataclass
class Timeline:
    """What one rank did and when: ``records`` of (kind, start, end) in wall-clock seconds
    (``time.time()``, one clock for all processes of a machine)."""

    lane: int
    records: list = field(default_factory=list)

    def add(self, kind: str, start: float, end: float | None = None) -> None:
        self.records.append((kind, start, time.time() if end is None else end))

    @contextlib.contextmanager
    def span(self, kind: str, device=None):
        """Record the time the ``with`` block takes as a ``kind`` span (the GPU synchronised
        at its end, so the span covers the work and not only its launch)."""
        start = time.time()
        try:
            yield
        finally:
            synchronize(device)
            self.add(kind, start)

    def busy(self, idle=("idle", "wait")) -> float:
        """Seconds spent in records whose kind is not one of ``idle``."""
        return sum(end - start for kind, start, end in self.records if kind not in idle)
