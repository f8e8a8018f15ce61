"""What a training step spends its time on, from ``torch.profiler`` (lesson 10).

Lecture: the seed workflow's last stage, "monitor and evaluate"; the DDP paper's figure of a
step's backward pass overlapping its all-reduces. The profiler records every operator with its
thread and time; :func:`profile` runs a function under it, and the helpers turn the recording
into what the lesson draws and measures:

* :func:`step_spans`: the step's phases (the ``record_function`` labels ``forward``,
  ``backward``, ``wait``, ``optimizer``) on one lane and every all-reduce (gloo's worker threads'
  ``gloo:all_reduce``, or NCCL's kernels on a GPU) on another, as :class:`Span` bars;
* :func:`hidden_fraction`: the share of communication time that lies under the backward pass;
* :func:`operator_table` and :func:`export_trace`: the top operators and a trace for Perfetto.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, record_function

from course_lib.runtime.timing import Span

PHASES = ("forward", "backward", "wait", "optimizer")
COMM = "all-reduce"
GPU_COMPUTE = "GPU compute"
# kineto prints "profiler_start/stop" markers at every level below 6: keep them out of the lesson
os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def profile(fn, *, memory: bool = False):
    """Run ``fn()`` under the profiler (CPU, and CUDA where torch has it); return the profiler
    (its ``events()``, ``key_averages()``, ``export_chrome_trace``) and fn's result."""
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, profile_memory=memory,
                                record_shapes=False) as prof:
        result = fn()
    return prof, result


def phase(name: str):
    """Label a part of a step for :func:`step_spans` (``with phase("backward"): ...``)."""
    return record_function(name)


def _kind(event) -> str | None:
    """What an event is on the lesson's timeline: a labelled phase, an all-reduce, a GPU kernel
    of computation, or nothing to draw (None)."""
    device = event.device_type.name
    name = event.name.lower()
    if device == "CPU":
        if name.startswith("gloo:all_reduce"):  # runs on one of gloo's own threads
            return COMM
        return event.name if event.name in PHASES else None
    if device == "CUDA":  # NCCL runs as kernels on its own stream, beside the compute kernels
        return COMM if "nccl" in name else GPU_COMPUTE
    return None


def step_spans(prof, lane: int = 0) -> list[Span]:
    """One step as bars, in seconds from the step's first labelled phase: the phases (and GPU
    compute kernels) on lane ``2 lane``, the all-reduces on lane ``2 lane + 1``.

    The ``backward`` phase is cut where autograd's last operator ends: DDP (and a GPU) wait for
    outstanding all-reduces inside ``backward()``, and that time is drawn as ``wait``.
    """
    events = prof.events()
    phases = [e for e in events if _kind(e) in PHASES]
    if not phases:
        raise ValueError("no labelled phase in this profile: wrap the step's parts in "
                         "profiling.phase('forward') etc.")
    origin = min(e.time_range.start for e in phases)
    autograd_ends = [e.time_range.end for e in events
                     if e.name.startswith("autograd::engine::evaluate_function")]
    spans = []

    def add(lane_, start, end, kind):  # the profiler counts microseconds
        if end > start:
            spans.append(Span(lane_, (start - origin) / 1e6, (end - start) / 1e6, kind))

    for e in events:
        kind = _kind(e)
        if kind is None:
            continue
        start, end = e.time_range.start, e.time_range.end
        if kind == "backward" and autograd_ends:
            computed = max([t for t in autograd_ends if start <= t <= end], default=end)
            add(2 * lane, start, computed, "backward")
            add(2 * lane, computed, end, "wait")
        else:
            add(2 * lane + (kind == COMM), start, end, kind)
    return sorted(spans, key=lambda s: s.start)


def interval_union(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def hidden_fraction(spans, lane: int = 0) -> float:
    """The fraction of rank ``lane``'s communication time (union of its all-reduce bars) that
    lies within its backward computation (on a GPU: its compute kernels): communication hidden
    under computation. NaN without any communication."""
    comm = interval_union((s.start, s.start + s.duration) for s in spans
                  if s.lane == 2 * lane + 1 and s.kind == COMM)
    backward = interval_union((s.start, s.start + s.duration) for s in spans
                      if s.lane == 2 * lane and s.kind in ("backward", GPU_COMPUTE))
    total = sum(end - start for start, end in comm)
    if total == 0:
        return float("nan")
    hidden = sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in comm for s2, e2 in backward)
    return hidden / total


def lane_names(ranks: int) -> dict[int, str]:
    """Row labels for :func:`step_spans` lanes of ``ranks`` ranks."""
    return {2 * r + c: f"rank {r} {'all-reduce' if c else 'compute'}" for r in range(ranks)
            for c in (0, 1)}


def operator_table(prof, top: int = 10) -> str:
    """The ``top`` operators by self time (time in the operator itself, not in what it calls)."""
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=top, max_name_column_width=48)


def export_trace(prof, name: str = "step") -> Path:
    """Write the trace (Chrome trace JSON: open it in https://ui.perfetto.dev or
    chrome://tracing) to a fresh temporary folder; return its path."""
    path = Path(tempfile.mkdtemp(prefix="course_lib_trace_")) / f"{name}.json"
    prof.export_chrome_trace(str(path))
    return path
