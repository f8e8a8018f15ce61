"""Collectives, and all-reduce written four ways with point-to-point messages.

Slides "Parallel computing for machine learning", part 3: all-reduce (every node gets the
reduced result) via reduce + broadcast, via all-to-all, the naive ring (pass the running sum
around, then pass the result around) and the efficient ring (split each vector into p chunks;
reduce-scatter around the ring, then all-gather), with the step-by-step pictures on 4 GPUs.

Every function here runs on every rank (through ``launch``), sums in place into a copy of the
input and returns ``(result, bytes_sent)``. Vectors of any length work: the chunks of the ring
differ in size by at most one element.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _exchange(send_buf, dst, recv_buf, src):
    """Send to ``dst`` while receiving from ``src``: posting the send first (non-blocking) means
    two neighbours that both send and receive never wait for each other forever."""
    request = dist.isend(send_buf, dst)
    dist.recv(recv_buf, src)
    request.wait()


def _bytes(t) -> int:
    return t.numel() * t.element_size()


def all_reduce_reduce_broadcast(tensor):
    """Reduce to rank 0 (it receives every other vector in turn), then broadcast the sum."""
    rank, p = dist.get_rank(), dist.get_world_size()
    total, sent = tensor.clone(), 0
    if rank == 0:
        incoming = torch.empty_like(total)
        for src in range(1, p):  # reduce: rank 0's link carries p - 1 vectors in
            dist.recv(incoming, src)
            total += incoming
        for dst in range(1, p):  # broadcast: and p - 1 vectors out
            dist.send(total, dst)
            sent += _bytes(total)
    else:
        dist.send(total, 0)
        sent += _bytes(total)
        dist.recv(total, 0)
    return total, sent


def all_reduce_all_to_all(tensor):
    """Every rank sends its whole vector to every other rank and adds up what it receives."""
    rank, p = dist.get_rank(), dist.get_world_size()
    total, sent = tensor.clone(), 0
    incoming = torch.empty_like(total)
    for shift in range(1, p):  # in round `shift`, send `shift` ranks ahead, hear from behind
        _exchange(tensor, (rank + shift) % p, incoming, (rank - shift) % p)
        sent += _bytes(tensor)
        total += incoming
    return total, sent


def ring_all_reduce_naive(tensor):
    """The naive ring: the running sum travels 0 -> 1 -> ... -> p-1 (after which p-1 has the
    total), then the total travels on around the ring back to p-2. 2(p-1) steps of n each."""
    rank, p = dist.get_rank(), dist.get_world_size()
    total, sent = tensor.clone(), 0
    if p == 1:
        return total, sent
    # phase 1: accumulate along the ring
    if rank > 0:
        incoming = torch.empty_like(total)
        dist.recv(incoming, rank - 1)
        total += incoming
    if rank < p - 1:
        dist.send(total, rank + 1)
        sent += _bytes(total)
    # phase 2: the last rank's total goes around: p-1 -> 0 -> 1 -> ... -> p-2
    if rank != p - 1:
        dist.recv(total, (rank - 1) % p)
    if rank != p - 2:
        dist.send(total, (rank + 1) % p)
        sent += _bytes(total)
    return total, sent


def ring_chunks(tensor, p: int):
    """Views of the p chunks of a flat vector (sizes differ by at most one)."""
    return list(tensor.view(-1).tensor_split(p))


def ring_all_reduce(tensor, trace: list | None = None):
    """The efficient ring: reduce-scatter, then all-gather, p - 1 steps each.

    Reduce-scatter, step s: rank r sends chunk (r - s) mod p to r + 1 and adds the chunk
    (r - s - 1) mod p it receives from r - 1. After p - 1 steps rank r holds the full sum of
    chunk (r + 1) mod p. All-gather, step s: rank r sends its finished chunk (r + 1 - s) mod p
    on and stores chunk (r - s) mod p from r - 1. Each rank sends 2 (p - 1) / p n numbers.

    With ``trace`` (a list), appends (phase, step, copy of this rank's chunks) after each step.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    total, sent = tensor.clone(), 0
    chunks = ring_chunks(total, p)
    nxt, prev = (rank + 1) % p, (rank - 1) % p
    if trace is not None:
        trace.append(("start", 0, [c.clone() for c in chunks]))
    for step in range(p - 1):  # reduce-scatter
        send_id, recv_id = (rank - step) % p, (rank - step - 1) % p
        incoming = torch.empty_like(chunks[recv_id])
        _exchange(chunks[send_id].contiguous(), nxt, incoming, prev)
        sent += _bytes(chunks[send_id])
        chunks[recv_id] += incoming
        if trace is not None:
            trace.append(("reduce-scatter", step + 1, [c.clone() for c in chunks]))
    for step in range(p - 1):  # all-gather
        send_id, recv_id = (rank + 1 - step) % p, (rank - step) % p
        incoming = torch.empty_like(chunks[recv_id])
        _exchange(chunks[send_id].contiguous(), nxt, incoming, prev)
        sent += _bytes(chunks[send_id])
        chunks[recv_id].copy_(incoming)
        if trace is not None:
            trace.append(("all-gather", step + 1, [c.clone() for c in chunks]))
    return total, sent


ALL_REDUCES = {
    "reduce + broadcast": all_reduce_reduce_broadcast,
    "all-to-all": all_reduce_all_to_all,
    "naive ring": ring_all_reduce_naive,
    "efficient ring": ring_all_reduce,
}


def bytes_formula(name: str, n_bytes: int, p: int) -> float:
    """Bytes the busiest rank sends in one all-reduce of ``n_bytes`` on p ranks."""
    if p == 1:
        return 0
    return {"reduce + broadcast": (p - 1) * n_bytes,  # rank 0 sends the sum to everyone
            "all-to-all": (p - 1) * n_bytes,  # everyone sends to everyone
            "naive ring": 2 * n_bytes if p > 2 else n_bytes,  # one full vector per phase
            "efficient ring": 2 * (p - 1) / p * n_bytes}[name]


# -- the alpha-beta cost model ---------------------------------------------------------------------


def gloo_all_reduce(tensor):
    """The library's own all-reduce, in the same (result, bytes_sent) form; the bytes are the
    ring's by formula, since the library does not report them."""
    total = tensor.clone()
    dist.all_reduce(total)
    p = dist.get_world_size()
    return total, int(bytes_formula("efficient ring", _bytes(total), p))


def time_all_reduce(all_reduce, numels, *, repeats: int = 5, warmup: int = 1,
                    dtype=torch.float32) -> dict[int, list[float]]:
    """On every rank: wall times of ``all_reduce`` for vectors of each length in ``numels``.

    A barrier lines the ranks up before each run, so each time is one collective, not the
    wait for a late peer. Returns {numel: [seconds, ...]} (this rank's view).
    """
    import time

    times = {}
    for numel in numels:
        tensor = torch.ones(numel, dtype=dtype)
        for _ in range(warmup):
            all_reduce(tensor)
        runs = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            all_reduce(tensor)
            runs.append(time.perf_counter() - start)
        times[numel] = runs
    return times


def fit_alpha_beta(n_bytes, seconds) -> tuple[float, float]:
    """Fit t = alpha + beta n to measured times, in relative terms (each point's error divided
    by its time), so that the small messages fix alpha and the large ones fix beta."""
    n = torch.as_tensor(n_bytes, dtype=torch.float64)
    t = torch.as_tensor(seconds, dtype=torch.float64)
    design = torch.stack([1 / t, n / t], dim=1)
    solution = torch.linalg.lstsq(design, torch.ones_like(t).unsqueeze(1)).solution.squeeze(1)
    alpha, beta = solution.tolist()
    return max(alpha, 0.0), max(beta, 0.0)


def ring_time(n_bytes, p: int, alpha: float, beta: float):
    """The efficient ring's cost: 2 (p - 1) alpha + 2 (p - 1) / p n beta."""
    n = torch.as_tensor(n_bytes, dtype=torch.float64)
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta


def bus_bandwidth(n_bytes: float, seconds: float, p: int, op: str = "all_reduce") -> float:
    """Bus bandwidth in bytes/s as nccl-tests report it: algbw = bytes / time, times 2(p-1)/p
    for all-reduce and (p-1)/p for all-gather and reduce-scatter, to compare across p."""
    factor = {"all_reduce": 2 * (p - 1) / p, "all_gather": (p - 1) / p,
              "reduce_scatter": (p - 1) / p}
    if op not in factor:
        raise ValueError(f"unknown op {op!r}: use one of {sorted(factor)}")
    return n_bytes / seconds * factor[op]


def median_of_slowest(runs_per_rank) -> float:
    """A collective ends when its last rank does: for each repeat take the slowest rank's time,
    then the median over repeats. ``runs_per_rank[r][i]`` is rank r's time of repeat i."""
    import statistics

    return statistics.median(max(runs) for runs in zip(*runs_per_rank, strict=True))
