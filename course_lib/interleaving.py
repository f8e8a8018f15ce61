"""Pipelines without the bubble: interleaved 1F1B and zero-bubble schedules (lesson 11).

Lecture: model parallelism, pipelines (the bubble (p - 1) / (m + p - 1) of GPipe and 1F1B);
Narayanan et al. 2021 (interleaved 1F1B: v model chunks per rank shrink the bubble v-fold,
``cost_models.bubble_fraction(p, m, chunks=v)``); Qi et al. 2024 (zero bubble: split backward
into its input-gradient half B, which the previous stage waits for, and its weight-gradient half
W, which can fill the gaps).

The model is cut into p v pieces. With the *loop* placement rank r holds pieces r, r + p,
r + 2p, ... (``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``); with the *V*
placement (v = 2) rank r holds pieces r and 2p - 1 - r, so the first and last pieces share rank
0 (``ScheduleZBVZeroBubble``). GPipe and 1F1B (``ONE_PIECE``) hold one piece per rank (v = 1).
:func:`run` runs one step of any of them from ``torch.distributed.pipelining`` and returns each
local piece's gradients; :func:`measure_bubble` times steps of pieces padded to steady
durations, so that every schedule's idle time is measured the same way.
"""

from __future__ import annotations

import numbers
import statistics
import time

import torch
import torch.distributed as dist

from course_lib.cost_models.laws import check_sizes
from course_lib.runtime.devices import device
from course_lib.runtime.timing import synchronize
from course_lib.training import check_whole, is_whole

SCHEDULES = ("interleaved 1F1B", "interleaved zero bubble", "ZBV zero bubble")
ONE_PIECE = ("GPipe", "1F1B")  # lesson 5's schedules, torch's: one piece (stage) per rank


def placement(schedule: str, p: int, v: int) -> list[list[int]]:
    """Which pieces (of p v) each of the p ranks holds, in the order the rank keeps them."""
    check_whole("p", p), check_whole("v", v)
    if schedule not in SCHEDULES + ONE_PIECE:
        raise ValueError(f"unknown schedule {schedule!r}: use one of {SCHEDULES + ONE_PIECE}")
    if schedule in ONE_PIECE:
        if v != 1:
            raise ValueError(f"{schedule} holds one piece per rank, got v = {v}: join each "
                             f"rank's pieces into one")
        return [[r] for r in range(p)]
    if schedule == "ZBV zero bubble":
        if v != 2:
            raise ValueError(f"the V placement has exactly 2 pieces per rank, got v = {v}")
        return [[r, 2 * p - 1 - r] for r in range(p)]
    if v < 1:
        raise ValueError(f"v (pieces per rank) must be at least 1, got {v}")
    return [[r + k * p for k in range(v)] for r in range(p)]


def _schedule_class(schedule: str):
    from torch.distributed.pipelining import (
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
        ScheduleInterleavedZeroBubble,
        ScheduleZBVZeroBubble,
    )

    return {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B,
            "interleaved 1F1B": ScheduleInterleaved1F1B,
            "interleaved zero bubble": ScheduleInterleavedZeroBubble,
            "ZBV zero bubble": ScheduleZBVZeroBubble}[schedule]


def check_micro_batches(batch: int, micro_batches: int) -> None:
    """Refuse, naming both, micro-batches that are not a whole number dividing the batch."""
    if not is_whole(micro_batches) or micro_batches < 1 or batch % micro_batches:
        raise ValueError(f"a batch of {batch} does not divide into {micro_batches!r} equal "
                         f"micro-batches; choose a whole divisor of {batch}")


def build(pieces, micro_batches: int, schedule: str = "interleaved 1F1B", group=None):
    """This rank's part of a pipeline over ``pieces`` (p v consecutive parts of a model):
    its ``PipelineStage`` objects and the schedule that drives them (loss: cross-entropy,
    averaged over micro-batches). Returns (runner, the piece indices, their modules)."""
    from torch.distributed.pipelining import PipelineStage

    rank, p, dev = dist.get_rank(group), dist.get_world_size(group), device(group)
    v = len(pieces) // p
    if v * p != len(pieces):
        raise ValueError(f"{len(pieces)} pieces do not divide over {p} ranks")
    mine = placement(schedule, p, v)[rank]
    modules = [pieces[i].to(dev) for i in mine]
    stages = [PipelineStage(m, i, len(pieces), dev, group=group)
              for m, i in zip(modules, mine, strict=True)]
    runner = _schedule_class(schedule)(stages[0] if schedule in ONE_PIECE else stages,
                                       micro_batches, loss_fn=torch.nn.functional.cross_entropy)
    return runner, mine, modules


def step(runner, mine, n_pieces: int, x, y, group=None) -> list[float]:
    """One training step of a built pipeline on the batch (x, y): the first piece's rank feeds
    x, the last piece's rank y; returns the micro-batches' losses where the last piece lives."""
    dev = device(group)
    losses, args, kwargs = [], [], {}
    if 0 in mine:
        args.append(x.to(dev))
    if n_pieces - 1 in mine:
        kwargs.update(target=y.to(dev), losses=losses)
    runner.step(*args, **kwargs)
    return [loss.item() for loss in losses]


def run(pieces, x, y, micro_batches: int, schedule: str = "interleaved 1F1B",
        group=None) -> dict:
    """One training step of ``pieces`` on every rank of ``group``, following ``schedule`` over
    ``micro_batches`` equal parts of (x, y). Returns this rank's piece indices, their gradients
    and (where the last piece lives) the micro-batches' losses."""
    check_micro_batches(len(x), micro_batches)
    runner, mine, modules = build(pieces, micro_batches, schedule, group)
    for m in modules:
        m.zero_grad()
    losses = step(runner, mine, len(pieces), x, y, group)
    return dict(pieces=mine, grads=[[None if q.grad is None else q.grad.detach().clone()
                                     for q in m.parameters()]  # None: frozen, as in torch
                                    for m in modules], micro_losses=losses)


class _HoldBackward(torch.autograd.Function):
    """Identity forward; its backward sleeps until ``seconds`` have passed since it began."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.clone()  # a new tensor: zero-bubble schedules take gradients of views badly

    @staticmethod
    def backward(ctx, grad):
        start = time.perf_counter()
        out = grad.clone()
        time.sleep(max(0.0, ctx.seconds - (time.perf_counter() - start)))
        return out, None


class Padded(torch.nn.Module):
    """A piece whose forward takes at least ``forward_seconds``, the input-gradient half of its
    backward (B) at least ``backward_seconds`` and the weight-gradient half (W) at least
    ``weight_seconds``: steady stage times on shared cores (lesson 5's padding trick).

    B and W are padded on separate paths -- the output passes through a hold, and is scaled by
    a parameter fixed at 1 whose gradient passes through another -- so a zero-bubble schedule,
    which computes B and W at different times, meets each hold once; other schedules meet both
    in one backward. Sleeping, not spinning: it takes no core from the other ranks."""

    def __init__(self, piece, forward_seconds: float, backward_seconds: float,
                 weight_seconds: float = 0.0):
        super().__init__()
        self.piece, self.forward_seconds = piece, forward_seconds
        self.backward_seconds, self.weight_seconds = backward_seconds, weight_seconds
        dtype = next(piece.parameters(), torch.empty(())).dtype  # a piece without weights
        self.one = torch.nn.Parameter(torch.ones((), dtype=dtype))  # its gradient is not used

    def forward(self, x):
        start = time.perf_counter()
        out = _HoldBackward.apply(self.piece(x), self.backward_seconds)
        if self.weight_seconds:
            out = out * _HoldBackward.apply(self.one, self.weight_seconds)
        time.sleep(max(0.0, self.forward_seconds - (time.perf_counter() - start)))
        return out


def measure_bubble(pieces, x, y, micro_batches: int, schedule: str = "interleaved 1F1B",
                   forward_seconds: float = 0.004, backward_seconds: float = 0.008,
                   weight_seconds: float = 0.0, repeats: int = 3, group=None) -> dict:
    """On every rank: time ``repeats`` steps with every piece :class:`Padded` (after one
    untimed step). Each rank's work per step is known -- micro_batches x its pieces x (forward
    + backward + weight) -- so the idle fraction of a step is 1 - work / wall time. Returns the wall
    times and this rank's work."""
    check_micro_batches(len(x), micro_batches)
    check_whole("repeats", repeats)
    padded = [Padded(piece, forward_seconds, backward_seconds, weight_seconds)
              for piece in pieces]
    p = dist.get_world_size(group)
    work = (micro_batches * (len(pieces) // p)
            * (forward_seconds + backward_seconds + weight_seconds))
    runner, mine, _ = build(padded, micro_batches, schedule, group)
    walls = []
    for i in range(repeats + 1):  # the first step sets up the stages' buffers: untimed
        dist.barrier(group=group)
        start = time.perf_counter()
        step(runner, mine, len(padded), x, y, group)
        synchronize(device(group))
        if i:
            walls.append(time.perf_counter() - start)
    return dict(walls=walls, work=work)


def bubble_of(results) -> float:
    """The measured idle fraction: 1 - work / the median over repeats of the slowest rank's
    wall time (a step ends when its last rank does)."""
    wall = statistics.median(max(ws) for ws in zip(*(r["walls"] for r in results), strict=True))
    return 1.0 - results[0]["work"] / wall


# -- a simulator of the interleaved schedule (a model, not a measurement) ----------------------


def interleaved_order(rank: int, p: int, v: int, m: int) -> list[tuple[str, int, int]]:
    """Rank ``rank``'s actions in interleaved 1F1B (Narayanan et al. 2021, as Megatron-LM runs
    it): ("forward" or "backward", local chunk, micro-batch). Micro-batches go in groups of p;
    within a group every chunk in turn; backward visits the chunks in reverse. A warm-up of
    2 (p - rank - 1) + (v - 1) p forwards, then one forward and one backward in turn."""
    for name, value in (("p", p), ("v", v), ("m", m)):
        check_whole(name, value)
    if isinstance(rank, bool) or not (isinstance(rank, numbers.Integral) and 0 <= rank < p):
        raise ValueError(f"rank must be one of 0 to p - 1 = {p - 1}, got {rank!r}")
    if m % p:
        raise ValueError(f"interleaved 1F1B needs micro-batches in groups of p: m = {m} is not "
                         f"a multiple of p = {p}")
    total = m * v

    def action(k, forward):
        chunk = (k % (p * v)) // p
        return ("forward" if forward else "backward", chunk if forward else v - 1 - chunk,
                (k // (p * v)) * p + k % p)

    warmup = min(total, 2 * (p - rank - 1) + (v - 1) * p)
    order = [action(k, True) for k in range(warmup)]
    for k in range(total - warmup):
        order += [action(k + warmup, True), action(k, False)]
    order += [action(k, False) for k in range(total - warmup, total)]
    return order


def simulate_interleaved(p: int, v: int, m: int, forward: float = 1.0, backward: float = 2.0,
                         overhead: float = 0.0) -> dict:
    """Run :func:`interleaved_order` on p model ranks: every action of a piece takes
    ``forward`` or ``backward`` plus ``overhead`` (what a real step adds per action: sending,
    the schedule's bookkeeping); an action waits for its rank and for its input (forward of the
    previous piece; backward of the next, or the last piece's own forward). Returns the
    ``spans`` (rank, start, duration, kind) and the idle fraction ``bubble``."""
    orders = [interleaved_order(r, check_whole("p", p), v, m) for r in range(p)]
    check_sizes("forward, backward and overhead", [forward, backward, overhead])
    if not forward + backward + overhead > 0:
        raise ValueError("every action takes no time: there is no step to divide the idle by")
    done, free, position, spans = {}, [0.0] * p, [0] * p, []
    last = p * v - 1
    while any(position[r] < len(orders[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            if position[r] == len(orders[r]):
                continue
            kind, chunk, i = orders[r][position[r]]
            piece = chunk * p + r
            if kind == "forward":
                needs = ("forward", piece - 1, i) if piece > 0 else None
            else:
                needs = ("backward", piece + 1, i) if piece < last else ("forward", piece, i)
            if needs is not None and needs not in done:
                continue
            start = max(free[r], done.get(needs, 0.0))
            length = (forward if kind == "forward" else backward) + overhead
            done[(kind, piece, i)] = free[r] = start + length
            spans.append((r, start, length, kind))
            position[r] += 1
            progressed = True
        if not progressed:
            raise RuntimeError("the schedule deadlocked: an action waits for one never run")
    makespan = max(free)
    busy = sum(d for _, _, d, _ in spans)
    return dict(spans=spans, bubble=1 - busy / (p * makespan), makespan=makespan)
