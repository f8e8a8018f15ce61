"""Cost models of model parallelism: a pipeline's bubble and timeline, Megatron's all-reduces,
ZeRO's bytes per rank (GPipe, Megatron-LM, ZeRO). Imported by ``course_lib.cost_models``, the one
vocabulary of the course's predictions (``p``, ``n_bytes``, ``alpha``, ``beta``, ...)."""

import numbers

from course_lib.cost_models.laws import check_count, check_processes, check_sizes
from course_lib.cost_models.messages import all_reduce_bytes


def bubble_fraction(p: int, micro_batches: int, chunks: int = 1) -> float:
    """Idle fraction of a pipeline flush with p stages (GPipe, 1F1B): (p - 1) / (m + p - 1).
    Interleaved 1F1B with ``chunks`` v model chunks per stage cuts the bubble time v-fold:
    ((p - 1) / v) / (m + (p - 1) / v)."""
    if not all(not isinstance(n, bool) and n >= 1 and float(n).is_integer()
               for n in (p, micro_batches, chunks)):
        raise ValueError(f"need p, micro_batches, chunks whole numbers >= 1, got {p}, "
                         f"{micro_batches}, {chunks}")
    bubble = (p - 1) / chunks
    return bubble / (micro_batches + bubble)


def pipeline_timeline(p: int, micro_batches: int, schedule: str = "1F1B",
                      forward=1.0, backward=2.0) -> list:
    """A model (not a measurement) of a pipeline run with p stages: every forward takes
    ``forward`` time units, every backward ``backward`` (each a number, or a list of p numbers:
    one per stage, for stages of unequal work), messages are free. A stage runs its schedule
    (``pipeline_schedules.SCHEDULES``) in order; an action starts when the stage is free and its
    input is there (forward i on stage s needs forward i on s - 1; backward i needs backward i
    on s + 1, or on the last stage its own forward i). Returns Gantt spans."""
    from course_lib.pipeline_schedules import SCHEDULES
    from course_lib.runtime.timing import Span

    check_count("p", p), check_count("micro_batches", micro_batches)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}")

    times = {}
    for kind, value in (("forward", forward), ("backward", backward)):
        many = isinstance(value, list | tuple) or getattr(value, "ndim", 0) > 0  # arrays too
        times[kind] = [float(v) for v in value] if many else [value] * p
        if len(times[kind]) != p:
            raise ValueError(f"{kind} needs one time per stage: {p}, got {len(times[kind])}")
        check_sizes(kind, times[kind])
    if not any(f + b > 0 for f, b in zip(times["forward"], times["backward"], strict=True)):
        raise ValueError("forward and backward take no time on any stage: nothing to schedule")
    orders = [SCHEDULES[schedule](s, p, micro_batches) for s in range(p)]
    done, free, position, spans = {}, [0.0] * p, [0] * p, []  # done: (kind, stage, i) -> end
    while any(position[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if position[s] == len(orders[s]):
                continue
            kind, i = orders[s][position[s]]
            if kind == "forward":
                needs = ("forward", s - 1, i) if s > 0 else None
            else:
                needs = ("backward", s + 1, i) if s < p - 1 else ("forward", s, i)
            if needs is not None and needs not in done:
                continue  # its input is not there yet
            start = max(free[s], done.get(needs, 0.0))
            duration = times[kind][s]
            done[(kind, s, i)] = free[s] = start + duration
            spans.append(Span(s, start, duration, kind))
            position[s] += 1
            progressed = True
        if not progressed:  # pragma: no cover - a schedule that waits for itself
            raise RuntimeError(f"{schedule} deadlocks with p={p}, m={micro_batches}")
    return spans


def idle_fraction(spans, lanes: int) -> float:
    """Idle fraction of a timeline of busy spans: 1 - busy / (lanes x makespan)."""
    if not spans:
        raise ValueError("idle_fraction needs at least one busy span")
    check_count("lanes", lanes)
    if len({lane for lane, *_ in spans}) > lanes:
        raise ValueError(f"the spans use {len({lane for lane, *_ in spans})} lanes, more than "
                         f"lanes = {lanes}")
    check_sizes("each span's start", [s[1] for s in spans])
    check_sizes("each span's duration", [s[2] for s in spans])
    by_lane = {}
    for lane, start, duration, _ in sorted(spans, key=lambda s: (s[0], s[1], s[2])):
        if duration > 0 and start < by_lane.get(lane, 0.0):  # a span of no time overlaps nothing
            raise ValueError(f"spans on lane {lane} overlap at {start}: a lane is busy with one "
                             f"thing at a time")
        by_lane[lane] = start + duration
    makespan = max(start + duration for _, start, duration, _ in spans)
    if not makespan > 0:
        raise ValueError("the spans take no time: an idle fraction needs a makespan above 0")
    return 1.0 - sum(duration for _, _, duration, _ in spans) / (lanes * makespan)


def megatron_all_reduces(blocks: int = 1) -> dict:
    """Megatron-LM's all-reduces per training step of ``blocks`` tensor-parallel MLP or attention
    blocks: one in the forward pass (g) and one in the backward pass (f) for each."""
    if isinstance(blocks, bool) or not isinstance(blocks, numbers.Integral) or blocks < 0:
        raise ValueError(f"blocks must be a whole number, 0 or more, got {blocks!r}")
    return {"forward": blocks, "backward": blocks}


def megatron_bytes(tokens: int, d_model: int, p: int, blocks: int = 1,
                   bytes_per_number: int = 4) -> float:
    """Bytes each rank sends per step: every all-reduce carries a tokens x d_model activation
    (or its gradient) on the efficient ring."""
    tokens, d_model = check_sizes("tokens", tokens), check_sizes("d_model", d_model)
    n = tokens * d_model * check_sizes("bytes_per_number", bytes_per_number)
    calls = sum(megatron_all_reduces(blocks).values())
    return calls * all_reduce_bytes("efficient ring", n, p)


ZERO_STAGES = (0, 1, 2, 3)


def zero_bytes_per_rank(psi: float, p: int, stage: int) -> float:
    """Mixed-precision Adam's bytes per rank (ZeRO): baseline 16 Psi; stage 1 shards the optimizer
    state (4 Psi + 12 Psi / p), 2 the gradients (2 Psi + 14 Psi / p), 3 all (16 Psi / p)."""
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage must be one of {ZERO_STAGES}, got {stage!r}")
    psi = check_sizes("psi", psi)
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / check_processes(p), 2: 2 * psi + 14 * psi / p,
            3: 16 * psi / p}[stage]
