"""Synchronous and asynchronous SGD: staleness, its remedies, and a simulator for sweeps.

Slides "Parallel computing for machine learning", part 2: asynchronous training applies each
gradient as it arrives, so some gradients were computed on old parameters; their **staleness** is

    tau = (server version when the gradient is applied) - (version it was computed on).

The real runs use :func:`course_lib.parameter_server.parameter_server` (rank 0 serves, ranks
1..m work) in mode ``"sync"``, ``"async"`` or ``"ssp"``. Here: the staleness-aware learning
rate (Zhang et al. 2016), the sequential mini-batch SGD that synchronous training must
reproduce, :func:`simulate_parameter_server` -- the same server rules
(:class:`~course_lib.parameter_server.ServerState`) with simulated compute times, in one
process, for sweeps -- and readers of a run's log.

Lesson 6's experiment, one protocol synchronous and asynchronous on the breast cancer problem:
the synchronous server against sequential mini-batch SGD, the asynchronous one's staleness
against the theory m - 1 (``--slowdown k`` makes the last worker k times slower)::

    python -m course_lib.async_sgd --world-size 3 [--gradients 80] [--slowdown 4]
    torchrun --standalone --nproc-per-node 3 -m course_lib.async_sgd
"""

from __future__ import annotations

import heapq
import math
import numbers
import statistics

import torch
import torch.distributed as dist

from course_lib.cost_models import async_staleness
from course_lib.data import batch_rows, shard_rows
from course_lib.erm import ERMProblem, breast_cancer_problem
from course_lib.erm_simulators import local_gradient
from course_lib.parameter_server import ServerState, parameter_server, sgd
from course_lib.runtime.timing import Span
from course_lib.runtime.torchrun import run_command, run_main
from course_lib.training import check_whole


def staleness_aware_lr(lr: float, staleness: int) -> float:
    """Zhang et al. 2016: divide the learning rate by the staleness, lr / tau (lr when
    tau = 0), so that an old gradient moves w less."""
    return lr / max(staleness, 1)


def sequential_sgd(problem: ERMProblem, shards, batch: int, lr: float, steps: int,
                   seed: int = 0) -> torch.Tensor:
    """Mini-batch SGD on one process, step t using the union of every worker's t-th batch:
    what synchronous training with a parameter server must reproduce. Returns the iterates."""
    check_whole("steps", steps, least=0)
    if not len(shards):
        raise ValueError("shards: give at least one worker's rows (a step averages their batches)")
    w = torch.zeros(problem.d, dtype=problem.X.dtype)
    iterates = [w.clone()]
    for step in range(steps):
        grads = [local_gradient(problem, batch_rows(shard, batch, seed, k, step), w)
                 for k, shard in enumerate(shards, start=1)]
        w = w - lr * torch.stack(grads).mean(dim=0)
        iterates.append(w.clone())
    return torch.stack(iterates)


def simulate_parameter_server(problem: ERMProblem, workers: int, optimizer, *,
                              mode: str = "async", bound: int | None = None, batch: int = 16,
                              gradients: int = 200, seconds: float | None = None,
                              pad=0.01, jitter: float = 0.0, latency: float = 0.0,
                              seed: int = 0) -> dict:
    """A **simulator** of :func:`~course_lib.parameter_server.parameter_server` on a star: one
    process, simulated time.

    The same server rules, the same batches and the same log, with ``spans`` for every worker.
    Worker k's gradient takes ``pad`` seconds (or ``pad[k]``, a dict with every worker) times a
    random factor in [1 - jitter, 1 + jitter]; a message takes ``latency``. Cheap enough to
    sweep 64 workers, which real processes on a laptop cannot.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    pads = list(pad.values()) if isinstance(pad, dict) else [pad]
    if not all(isinstance(t, numbers.Real) for t in [*pads, jitter, latency]):
        raise ValueError(f"pad (seconds, or {{worker: seconds}}), jitter and latency are numbers, "
                         f"got pad={pad!r}, jitter={jitter!r}, latency={latency!r}")
    if not (all(0 <= t < math.inf for t in pads) and 0 <= jitter <= 1 and 0 <= latency < math.inf):
        raise ValueError(f"compute times and latency are zero or more and jitter is in [0, 1] (a "
                         f"time never goes negative; nor is it infinite), got pad={pad}, "
                         f"jitter={jitter}, latency={latency}")
    if isinstance(pad, dict) and set(pad) != set(range(1, workers + 1)):
        raise ValueError(f"pad as a dict needs a time for every worker 1..{workers}, got keys "
                         f"{sorted(pad)}")
    if seconds is not None and not (isinstance(seconds, numbers.Real) and 0 < seconds < math.inf):
        raise ValueError(f"seconds, the time limit, must be a positive finite number (or None: "
                         f"gradients only), got {seconds!r}")
    # time never moves on: every worker takes no time, or (async; ssp, up to its bound) one does
    stuck = max(pads) == 0 or (mode != "sync" and min(pads) == 0)
    if seconds is not None and latency == 0 and stuck:
        raise ValueError("a seconds limit needs time to pass: with no latency, a worker whose "
                         "gradient takes no time (pad 0) pushes at one instant as often as the "
                         "mode lets it (async: forever; ssp: bound + 1 times); give pad or "
                         "latency a value above zero, or limit gradients only")
    shards = shard_rows(problem.n, workers, seed)
    noise = torch.Generator().manual_seed(seed)
    state = ServerState(torch.zeros(problem.d, dtype=problem.X.dtype), range(1, workers + 1),
                        mode, bound, optimizer, gradients, seconds, 0.0)
    events, steps, spans, pushed_at = [], dict.fromkeys(range(1, workers + 1), 0), [], {}

    def pull(k, now):  # worker k receives w and starts computing at once
        rows = batch_rows(shards[k - 1], batch, seed, k, steps[k])
        g = local_gradient(problem, rows, state.w)
        factor = 1.0 + jitter * (2 * torch.rand((), generator=noise).item() - 1)
        took = (pad[k] if isinstance(pad, dict) else pad) * factor
        spans.append(Span(k, now, took, "compute"))
        steps[k] += 1
        heapq.heappush(events, (now + took + latency, k, len(rows) * g, len(rows),
                                state.version))

    for k in range(1, workers + 1):
        pull(k, latency)
    while events and not state.done(events[0][0]):
        now, k, total, rows, computed_on = heapq.heappop(events)
        pushed_at[k] = now
        for released in state.push(k, total, rows, 1, computed_on, now):
            spans.append(Span(released, pushed_at[released], now + latency - pushed_at[released],
                              "communicate / wait"))
            pull(released, now + latency)
    return state.log | dict(spans=spans)


# -- reading a run (real or simulated) -------------------------------------------------------------


def losses(problem: ERMProblem, log) -> list[float]:
    """The objective after every update of a run."""
    return [problem.loss(w) for w in log["iterates"]]


def convergence(problem: ERMProblem, log, best: float = 0.0) -> dict:
    """A run as ``plot_convergence`` takes it: objective minus ``best`` against gradients applied
    ("step") and against seconds ("time")."""
    return dict(step=log["iterate_gradients"], time=log["iterate_times"],
                loss=[loss - best for loss in losses(problem, log)])


def staleness_counts(log, largest: int | None = None) -> torch.Tensor:
    """How many applied gradients had staleness 0, 1, 2, ... (up to ``largest``; none applied:
    an empty count)."""
    tau = torch.tensor(log["staleness"], dtype=torch.long)
    if largest is not None and largest < 0:
        raise ValueError(f"largest is a staleness, 0 or more, got {largest}")
    if largest is None:
        if not len(tau):
            return torch.zeros(0, dtype=torch.long)
        largest = int(tau.max())
    return torch.bincount(tau.clamp(max=largest), minlength=largest + 1)


# -- lesson 6's experiment, as a command -----------------------------------------------------------


def sync_and_async(gradients: int = 80, batch: int = 16, lr: float = 0.5,
                   compute_ms: float = 5.0, slowdown: float = 4.0, seed: int = 0,
                   group=None) -> dict:
    """Run on every rank of ``group``: the parameter server (rank 0) with m workers in mode
    "sync", then "async", each until ``gradients`` are applied; every gradient padded to
    ``compute_ms``, the last worker's to ``slowdown`` times that. The server's logs, by mode."""
    m = dist.get_world_size(group) - 1
    pad = {k: compute_ms / 1e3 * (slowdown if k == m else 1.0) for k in range(1, m + 1)}
    problem, keep = breast_cancer_problem(), ("iterates", "staleness", "worker", "time")
    return {mode: {k: v for k, v in parameter_server(
        problem, sgd(lr), mode=mode, batch=batch, gradients=gradients, pad=pad, seed=seed,
        group=group).items() if k in keep} for mode in ("sync", "async")}


def main(argv=None):
    args, results = run_command(
        sync_and_async, "Lesson 6: one parameter server, synchronous and asynchronous",
        (("--gradients", int, 80), ("--batch", int, 16), ("--lr", float, 0.5),
         ("--compute-ms", float, 5.0), ("--slowdown", float, 4.0, {"least": 1}),
         ("--seed", int, 0)),
        argv, world_size=3)
    if results is not None:  # the launcher, or rank 0 under torchrun
        problem, m, log = breast_cancer_problem(), len(results) - 1, results[0]["async"]
        steps = len(results[0]["sync"]["iterates"]) - 1
        reference = sequential_sgd(problem, shard_rows(problem.n, m, seed=args.seed),
                                   args.batch, args.lr, steps, seed=args.seed)
        gap = (torch.stack(results[0]["sync"]["iterates"]) - reference).abs().max().item()
        print(f"m = {m} workers, mini-batches of {args.batch} rows, lr {args.lr}; every "
              f"gradient padded to {args.compute_ms:g} ms, worker {m}'s {args.slowdown:g}x")
        print(f"sync: {steps} synchronous steps: max |parameter server - sequential SGD| = "
              f"{gap:.1e}; objective {problem.loss(reference[-1]):.10f}")
        print(f"async: {len(log['staleness'])} gradients applied, each one a step")
        slow = [t for t, w in zip(log["staleness"], log["worker"], strict=True) if w == m]
        print(f"async (measured): mean staleness {statistics.mean(log['staleness']):.2f}, the "
              f"theory m - 1 = {async_staleness(m):g}; worker {m}'s median "
              f"{statistics.median(slow) if slow else float('nan'):g}, the theory k(m - 1) = "
              f"{async_staleness(m, args.slowdown):g}; objective "
              f"{problem.loss(log['iterates'][-1]):.6f}")
        seconds = results[0]["sync"]["time"][-1], log["time"][-1]
        print(f"seconds for these gradients (measured): sync {seconds[0]:.3f}, async "
              f"{seconds[1]:.3f}: async {seconds[0] / seconds[1]:.1f}x as fast")
    return results


if __name__ == "__main__":
    run_main(main)
