"""Synchronous and asynchronous SGD with a parameter server, over point-to-point messages.

Slides "Parallel computing for machine learning", part 2: the parameter server (Li et al., OSDI
2014) is client-server and message passing. Each worker **pulls** w, computes a gradient on its
own data and **pushes** it; the server applies it. Synchronous (bulk-synchronous) training
waits for every worker and averages; asynchronous training applies each gradient as it arrives,
so some gradients were computed on old parameters: their **staleness** is

    tau = (server version when the gradient is applied) - (version it was computed on).

One protocol serves every mode; only the server's rule for "when may a worker go on" differs:

* ``"sync"``  — collect one gradient from every worker, apply their average, release everyone;
* ``"async"`` — apply each gradient at once, release its worker at once;
* ``"ssp"``   — stale-synchronous parallel (Ho et al. 2013): like async, but a worker that has
  pushed more than ``bound`` gradients more than the slowest worker waits for it.

Rank 0 is the server; ranks 1..m are the workers (worker k = rank k).
:func:`simulate_parameter_server` replays the same server logic with simulated compute times, in
one process, for sweeps.
"""

from __future__ import annotations

import heapq
import math
import time

import torch
import torch.distributed as dist

from course_lib.erm import ERMProblem
from course_lib.erm_simulators import local_gradient

MODES = ("sync", "async", "ssp")


# -- data: each worker's shard and its mini-batches ------------------------------------------------


def shard_rows(n: int, m: int, seed: int = 0) -> list[torch.Tensor]:
    """Shuffle rows 0..n-1 once (seeded) and cut them into m shards of near-equal size: worker k
    (k = 1..m) owns shard k - 1, so every worker sees the same kind of data (IID)."""
    if not 1 <= m <= n:
        raise ValueError(f"need 1 <= m <= n to give every worker data, got m={m}, n={n}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return list(order.tensor_split(m))


def batch_rows(shard: torch.Tensor, batch: int, seed: int, worker: int, step: int):
    """The rows of worker ``worker``'s ``step``-th mini-batch: ``batch`` rows of its shard drawn
    without replacement. Seeded by (seed, worker, step), so a real run, the simulator and the
    sequential reference all draw the same batches."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + worker * 10_007 + step)
    return shard[torch.randperm(len(shard), generator=g)[:batch]]


# -- the server's learning rate --------------------------------------------------------------------


def fixed_lr(alpha: float, staleness: int) -> float:
    """The same step whatever the staleness."""
    return alpha


def staleness_aware_lr(alpha: float, staleness: int) -> float:
    """Zhang et al. 2016: divide the learning rate by the staleness, alpha / tau (alpha when
    tau = 0), so that an old gradient moves w less."""
    return alpha / max(staleness, 1)


def sequential_sgd(problem: ERMProblem, shards, batch: int, lr: float, steps: int,
                   seed: int = 0) -> torch.Tensor:
    """Mini-batch SGD on one process, step t using the union of every worker's t-th batch:
    what synchronous training with a parameter server must reproduce. Returns the iterates."""
    w = torch.zeros(problem.d, dtype=problem.X.dtype)
    iterates = [w.clone()]
    for step in range(steps):
        grads = [local_gradient(problem, batch_rows(shard, batch, seed, k, step), w)
                 for k, shard in enumerate(shards, start=1)]
        w = w - lr * torch.stack(grads).mean(dim=0)
        iterates.append(w.clone())
    return torch.stack(iterates)


# -- the server's rules, shared by the real run and the simulator ----------------------------------


class ServerState:
    """What the server holds (w, its version, each worker's clock) and its rules.

    ``push`` takes one arriving gradient and returns the workers that may now pull w. The server
    owes a reply to every worker whose gradient has arrived; it sends it when the mode allows.
    """

    def __init__(self, w, workers, mode, bound, lr, lr_rule, gradients, seconds, start):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: use one of {MODES}")
        if mode == "ssp" and (bound is None or bound < 0):
            raise ValueError("mode 'ssp' needs a staleness bound >= 0 (bound=...)")
        self.w, self.version, self.mode = w.clone(), 0, mode
        self.bound = {"sync": 0, "async": math.inf, "ssp": bound}[mode]
        self.lr, self.lr_rule = lr, lr_rule
        self.clock = dict.fromkeys(workers, 0)  # gradients each worker has pushed
        self.owed: list[int] = []  # pushed, waiting for w
        self.round: list[torch.Tensor] = []  # sync: this round's gradients
        self.gradients, self.seconds, self.start = gradients, seconds, start
        self.applied = 0
        self.log = dict(time=[], worker=[], staleness=[], lr=[], iterates=[self.w.clone()],
                        iterate_times=[0.0], iterate_gradients=[0])

    def done(self, now) -> bool:
        return (self.applied >= self.gradients
                or (self.seconds is not None and now - self.start >= self.seconds))

    def _apply(self, step, now):
        self.w = self.w - step
        self.version += 1
        self.log["iterates"].append(self.w.clone())
        self.log["iterate_times"].append(now - self.start)
        self.log["iterate_gradients"].append(self.applied)

    def push(self, worker: int, g, computed_on: int, now: float) -> list[int]:
        staleness = self.version - computed_on
        self.clock[worker] += 1
        self.owed.append(worker)
        lr = self.lr if self.mode == "sync" else self.lr_rule(self.lr, staleness)
        for key, value in zip(("time", "worker", "staleness", "lr"),
                              (now - self.start, worker, staleness, lr), strict=True):
            self.log[key].append(value)
        if self.mode == "sync":  # wait for every worker, then one step along the average
            self.round.append(g)
            if len(self.round) < len(self.clock):
                return []
            self.applied += len(self.round)
            self._apply(self.lr * torch.stack(self.round).mean(dim=0), now)
            self.round = []
        else:  # apply each gradient as it arrives
            self.applied += 1
            self._apply(lr * g, now)
        if self.done(now):
            return []
        slowest = min(self.clock.values())
        released = [k for k in self.owed if self.clock[k] - slowest <= self.bound]
        self.owed = [k for k in self.owed if k not in released]
        return released


# -- the real thing: rank 0 serves, ranks 1..m work ------------------------------------------------


def parameter_server(problem: ERMProblem, *, mode: str = "async", bound: int | None = None,
                     lr: float = 0.1, lr_rule=fixed_lr, batch: int = 16, gradients: int = 200,
                     seconds: float | None = None, compute_seconds: float = 0.0,
                     slowdown: dict | None = None, seed: int = 0) -> dict:
    """Run on every rank (through ``launch``): SGD with rank 0 as parameter server.

    Worker k computes its gradient on a mini-batch of ``batch`` rows of its shard, and pads it
    to take ``compute_seconds * slowdown.get(k, 1)`` seconds (sleeping: a model of a bigger
    model or a slower machine, and cheap on a small laptop). The run stops after ``gradients``
    applied gradients or ``seconds`` of wall-clock. ``lr_rule(lr, staleness)`` sets each
    asynchronous step; synchronous steps use ``lr`` on the average.

    Returns on rank 0 the server's log: per arriving gradient its ``time`` (seconds since the
    start), ``worker``, ``staleness`` and ``lr``; the ``iterates`` after every update with their
    ``iterate_times`` and ``iterate_gradients``. On a worker: its ``spans`` for a timeline.
    """
    torch.set_num_threads(1)
    rank, m = dist.get_rank(), dist.get_world_size() - 1
    if m < 1:
        raise ValueError("a parameter server needs a server and at least one worker: "
                         "launch with world_size >= 2")
    w = torch.zeros(problem.d, dtype=problem.X.dtype)
    message = torch.empty(problem.d + 1, dtype=w.dtype)  # a vector, and its version at the end
    dist.barrier()  # start together: the times of all ranks share one origin
    start = time.time()
    if rank == 0:
        state = ServerState(w, range(1, m + 1), mode, bound, lr, lr_rule, gradients, seconds,
                            start)
        for k in range(1, m + 1):  # everyone pulls version 0
            dist.send(torch.cat([state.w, torch.zeros(1, dtype=w.dtype)]), k)
        while not state.done(time.time()):
            src = dist.recv(message)  # from whichever worker pushes first
            g, computed_on = message[:-1].clone(), int(message[-1])
            for k in state.push(src, g, computed_on, time.time()):
                dist.send(torch.cat([state.w, torch.tensor([float(state.version)])]), k)
        stop = torch.cat([state.w, torch.tensor([-1.0])])  # version -1: stop
        for k in state.owed:
            dist.send(stop, k)
        for _ in range(m - len(state.owed)):  # the others are computing: take their last push
            dist.send(stop, dist.recv(message))
        return state.log
    shard = shard_rows(problem.n, m, seed)[rank - 1]
    pad = compute_seconds * (slowdown or {}).get(rank, 1.0)
    spans, step = [], 0
    dist.recv(message, 0)
    while message[-1] >= 0:
        c0 = time.time()
        rows = batch_rows(shard, batch, seed, rank, step)
        g = local_gradient(problem, rows, message[:-1])
        time.sleep(max(0.0, pad - (time.time() - c0)))
        c1 = time.time()
        dist.send(torch.cat([g, message[-1:]]), 0)
        dist.recv(message, 0)
        spans += [(rank, c0 - start, c1 - c0, "compute"),
                  (rank, c1 - start, time.time() - c1, "wait for the server")]
        step += 1
    return dict(spans=spans, steps=step)


# -- the simulator ---------------------------------------------------------------------------------


def simulate_parameter_server(problem: ERMProblem, workers: int, *, mode: str = "async",
                              bound: int | None = None, lr: float = 0.1, lr_rule=fixed_lr,
                              batch: int = 16, gradients: int = 200,
                              seconds: float | None = None, compute_seconds: float = 0.01,
                              slowdown: dict | None = None, jitter: float = 0.0,
                              latency: float = 0.0, seed: int = 0) -> dict:
    """A **simulator** of :func:`parameter_server`: one process, simulated time.

    Same arguments, same server rules (:class:`ServerState`), same batches and the same log, with
    ``spans`` for every worker added. Worker k's gradient takes ``compute_seconds *
    slowdown.get(k, 1)`` times a random factor in [1 - jitter, 1 + jitter]; a message takes
    ``latency``. Cheap enough to sweep 64 workers, which real processes on a laptop cannot.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    shards = shard_rows(problem.n, workers, seed)
    noise = torch.Generator().manual_seed(seed)
    state = ServerState(torch.zeros(problem.d, dtype=problem.X.dtype), range(1, workers + 1),
                        mode, bound, lr, lr_rule, gradients, seconds, 0.0)
    events, steps, spans, pushed_at = [], dict.fromkeys(range(1, workers + 1), 0), [], {}

    def pull(k, now):  # worker k receives w and starts computing at once
        rows = batch_rows(shards[k - 1], batch, seed, k, steps[k])
        g = local_gradient(problem, rows, state.w)
        factor = 1.0 + jitter * (2 * torch.rand((), generator=noise).item() - 1)
        took = compute_seconds * (slowdown or {}).get(k, 1.0) * factor
        spans.append((k, now, took, "compute"))
        steps[k] += 1
        heapq.heappush(events, (now + took + latency, k, g, state.version))

    for k in range(1, workers + 1):
        pull(k, latency)
    while events and not state.done(events[0][0]):
        now, k, g, computed_on = heapq.heappop(events)
        pushed_at[k] = now
        for released in state.push(k, g, computed_on, now):
            spans.append((released, pushed_at[released], now + latency - pushed_at[released],
                          "wait for the server"))
            pull(released, now + latency)
    return state.log | dict(spans=spans)


# -- reading a run ---------------------------------------------------------------------------------


def server_log(results) -> dict:
    """The server's log from what ``launch(parameter_server, ...)`` returned, with every worker's
    timeline spans added under ``spans``."""
    return results[0] | dict(spans=[s for r in results[1:] for s in r["spans"]])


def losses(problem: ERMProblem, log) -> list[float]:
    """The objective after every update of a run (real or simulated)."""
    return [problem.loss(w) for w in log["iterates"]]


def convergence(problem: ERMProblem, log, best: float = 0.0) -> dict:
    """A run as ``plot_convergence`` takes it: objective minus ``best`` against gradients applied
    ("step") and against seconds ("time")."""
    return dict(step=log["iterate_gradients"], time=log["iterate_times"],
                loss=[loss - best for loss in losses(problem, log)])


def spans_until(log, seconds: float) -> list[tuple]:
    """The timeline spans of a run that start in its first ``seconds``, cut at ``seconds``."""
    return [(k, start, min(duration, seconds - start), kind)
            for k, start, duration, kind in log["spans"] if start < seconds]


def staleness_counts(log, largest: int | None = None) -> torch.Tensor:
    """How many applied gradients had staleness 0, 1, 2, ... (up to ``largest``)."""
    tau = torch.tensor(log["staleness"], dtype=torch.long)
    size = (int(tau.max()) if largest is None else largest) + 1
    return torch.bincount(tau.clamp(max=size - 1), minlength=size)
