"""Synchronous parallel AGD with a parameter server, over real worker processes.

Lecture note "Parallel computing for empirical risk minimization", sections 2-3, and slides
part 1 (MapReduce: broadcast, map, reduce; the costs of computation, communication and
synchronisation). One iteration:

    broadcast w -> each worker computes its local gradient g~_k -> aggregate -> server updates

Rank 0 is the server and also worker 0 (as when a server shares a machine with a worker).
Messages are point-to-point ``dist.send`` / ``dist.recv`` along a schedule: a **star** (every
worker talks to the server) or a binomial **tree** (messages hop in log2 m rounds). Every word
sent is counted.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from course_lib.erm import ERMProblem, partition_rows

TOPOLOGIES = ("star", "tree")


# -- who sends to whom -----------------------------------------------------------------------------


def broadcast_schedule(m: int, topology: str) -> list[list[tuple[int, int]]]:
    """Rounds of (sender, receiver) messages that bring w from rank 0 to all m ranks.

    Star: the server sends to each worker in turn (its link carries them one after another:
    m - 1 rounds). Tree (binomial): in round k every rank that has w sends it 2^k ranks further,
    so ceil(log2 m) rounds suffice.
    """
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}: use one of {TOPOLOGIES}")
    if topology == "star":
        return [[(0, r)] for r in range(1, m)]
    rounds, reach = [], 1
    while reach < m:
        rounds.append([(r, r + reach) for r in range(reach) if r + reach < m])
        reach *= 2
    return rounds


def reduce_schedule(m: int, topology: str) -> list[list[tuple[int, int]]]:
    """Rounds that sum every rank's vector into rank 0: the broadcast run backwards."""
    return [[(dst, src) for src, dst in round_]
            for round_ in reversed(broadcast_schedule(m, topology))]


def words_per_iteration(m: int, d: int, topology: str) -> dict:
    """Words (numbers) one iteration moves, from the schedules: in total, through the server's
    link, and along the critical path (the rounds that must happen one after another)."""
    rounds = broadcast_schedule(m, topology) + reduce_schedule(m, topology)
    messages = [msg for round_ in rounds for msg in round_]
    return dict(total=len(messages) * d,
                server=sum(d for src, dst in messages if 0 in (src, dst)),
                critical_path=len(rounds) * d)


def words_formula(m: int, d: int, topology: str) -> int:
    """The lecture's orders: O(dm) words through the server on a star, O(d log m) on a tree
    (counted both ways, broadcast and aggregation)."""
    if topology == "star":
        return 2 * d * (m - 1)
    return 2 * d * math.ceil(math.log2(m)) if m > 1 else 0


# -- one worker's part -----------------------------------------------------------------------------


def _take(mine, received):
    return received.clone()


def _run_schedule(rounds, rank, buffer, words, combine):
    """Carry out the rounds this rank takes part in; ``combine`` folds a received vector in."""
    incoming = torch.empty_like(buffer)
    for round_ in rounds:
        for src, dst in round_:
            if rank == src:
                dist.send(buffer, dst)
                words["sent"] += buffer.numel()
            elif rank == dst:
                dist.recv(incoming, src)
                buffer = combine(buffer, incoming)
    return buffer


def parallel_agd(problem: ERMProblem, alpha: float, beta: float, iterations: int, *,
                 topology: str = "star", delays: dict | None = None, warmup: int = 0,
                 threads: int = 1) -> dict:
    """Run on every rank (through ``launch``): synchronous parallel AGD with rank 0 as server.

    Rank k holds rows ``partition_rows(n, m)[k]`` of the data. ``delays`` maps a rank to extra
    seconds it sleeps after computing its gradient (a straggler on purpose). ``warmup``
    iterations run first and are not recorded. Each rank uses ``threads`` CPU threads, so
    m workers use m cores whatever m is.

    Returns, per rank: ``words_sent`` per iteration, and per recorded iteration its wall-clock
    ``start``/``end`` and the ``compute`` span; rank 0 also returns the iterates.
    """
    torch.set_num_threads(threads)
    rank, m = dist.get_rank(), dist.get_world_size()
    rows = partition_rows(problem.n, m)[rank]
    X, y = problem.X[rows].contiguous(), problem.y[rows].contiguous()
    local = ERMProblem(X, y, problem.lam, problem.kind)
    delay = (delays or {}).get(rank, 0.0)
    broadcast, reduce = broadcast_schedule(m, topology), reduce_schedule(m, topology)
    w = torch.zeros(problem.d, dtype=problem.X.dtype)
    v = torch.zeros_like(w)
    iterates, log = [w.clone()], dict(start=[], end=[], compute=[], words_sent=[])
    for it in range(warmup + iterations):
        words = {"sent": 0}
        t0 = time.time()
        w = _run_schedule(broadcast, rank, w, words, combine=_take)  # 1. broadcast w
        c0 = time.time()
        g = local.gradient_sum(w)  # 2. map: the local gradient
        if delay:
            time.sleep(delay)
        c1 = time.time()
        g = _run_schedule(reduce, rank, g, words, combine=torch.add)  # 3. reduce
        if rank == 0:  # 4. the server's update
            v = beta * v + g / problem.n + problem.lam * w
            w = w - alpha * v
        t1 = time.time()
        if it >= warmup:
            iterates.append(w.clone())
            log["start"].append(t0)
            log["end"].append(t1)
            log["compute"].append((c0, c1))
            log["words_sent"].append(words["sent"])
    log["rank"] = rank
    if rank == 0:
        log["iterates"] = torch.stack(iterates)
    return log


def iteration_times(logs) -> list[float]:
    """Seconds per iteration as the server saw them (rank 0's start to end)."""
    return [end - start for start, end in zip(logs[0]["start"], logs[0]["end"], strict=True)]


def timeline_spans(logs, iterations=None) -> list[tuple]:
    """(worker, start, duration, kind) spans of a measured run for a Gantt chart: "compute"
    while a worker computes its gradient, "communicate / wait" for the rest of each iteration.
    Times are relative to the first recorded iteration."""
    t_zero = min(log["start"][0] for log in logs)
    spans = []
    for log in logs:
        rows = list(zip(log["start"], log["end"], log["compute"], strict=True))[:iterations]
        for start, end, (c0, c1) in rows:
            spans.append((log["rank"], start - t_zero, c0 - start, "communicate / wait"))
            spans.append((log["rank"], c0 - t_zero, c1 - c0, "compute"))
            spans.append((log["rank"], c1 - t_zero, end - c1, "communicate / wait"))
    return spans


def bsp_timeline(compute_times, communication: float, iterations: int = 3) -> list[tuple]:
    """A model of bulk-synchronous iterations: each worker computes for its own time, everyone
    waits for the slowest, then one communication step. Returns Gantt spans."""
    spans, t = [], 0.0
    slowest = max(compute_times)
    for _ in range(iterations):
        for k, c in enumerate(compute_times):
            spans.append((k, t, c, "compute"))
            if slowest > c:
                spans.append((k, t + c, slowest - c, "idle (waiting for the straggler)"))
            spans.append((k, t + slowest, communication, "communicate / wait"))
        t += slowest + communication
    return spans


def probability_any_fails(m, p: float):
    """P(at least one of m independent workers fails) = 1 - (1 - p)^m."""
    return 1.0 - (1.0 - p) ** torch.as_tensor(m, dtype=torch.float64)
