"""Collectives, and all-reduce written four ways with point-to-point messages.

Slides "Parallel computing for machine learning", part 3: all-reduce (every node gets the
reduced result) via reduce + broadcast, via all-to-all, the naive ring (pass the running sum
around, then pass the result around) and the efficient ring (split each vector into p chunks;
reduce-scatter around the ring, then all-gather), with the step-by-step pictures on 4 GPUs.

Every function here runs on every rank of ``group`` (default: all ranks), sums into a copy of
the input on the rank's device and returns ``(result, bytes_sent)``. Ranks are the group's own
(0 .. p-1), so an all-reduce can run inside any sub-group. Vectors of any length work: the
chunks of the ring differ in size by at most one element.

Lesson 3's check, the four all-reduces against ``dist.all_reduce`` with the bytes each rank sent::

    python -m course_lib.collectives --world-size 4 [--numel 1001]
    torchrun --standalone --nproc-per-node 4 -m course_lib.collectives
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from course_lib.cost_models import all_reduce_bytes
from course_lib.runtime.devices import device
from course_lib.runtime.timing import synchronize
from course_lib.runtime.torchrun import run_command, run_main
from course_lib.training import check_whole, is_whole


def _exchange(send_buf, dst, recv_buf, src, group):
    """Send to ``dst`` while receiving from ``src`` (ranks of ``group``). The send and the
    receive are posted together, as one batch: two neighbours that both send and receive then
    never wait for each other (NCCL needs this; with a plain send first, both could wait in
    their sends for a receive that is never reached)."""
    for request in dist.batch_isend_irecv([
            dist.P2POp(dist.isend, send_buf, group=group, group_peer=dst),
            dist.P2POp(dist.irecv, recv_buf, group=group, group_peer=src)]):
        request.wait()


def _bytes(t) -> int:
    return t.numel() * t.element_size()


def _start(tensor, group):
    """This rank's place in the group and a contiguous copy of its tensor on its device (messages
    send contiguous memory; a transposed gradient is not)."""
    copy = tensor.to(device(group), memory_format=torch.contiguous_format, copy=True)
    return dist.get_rank(group), dist.get_world_size(group), copy


def all_reduce_reduce_broadcast(tensor, group=None):
    """Reduce to rank 0 (it receives every other vector in turn), then broadcast the sum."""
    rank, p, total = _start(tensor, group)
    sent = 0
    if rank == 0:
        incoming = torch.empty_like(total)
        for src in range(1, p):  # reduce: rank 0's link carries p - 1 vectors in
            dist.recv(incoming, group=group, group_src=src)
            total += incoming
        for dst in range(1, p):  # broadcast: and p - 1 vectors out
            dist.send(total, group=group, group_dst=dst)
            sent += _bytes(total)
    else:
        dist.send(total, group=group, group_dst=0)
        sent += _bytes(total)
        dist.recv(total, group=group, group_src=0)
    return total, sent


def all_reduce_all_to_all(tensor, group=None):
    """Every rank sends its whole vector to every other rank and adds up what it receives."""
    rank, p, total = _start(tensor, group)
    mine, sent = total.clone(), 0
    incoming = torch.empty_like(total)
    for shift in range(1, p):  # in round `shift`, send `shift` ranks ahead, hear from behind
        _exchange(mine, (rank + shift) % p, incoming, (rank - shift) % p, group)
        sent += _bytes(mine)
        total += incoming
    return total, sent


def ring_all_reduce_naive(tensor, group=None):
    """The naive ring: the running sum travels 0 -> 1 -> ... -> p-1 (after which p-1 has the
    total), then the total travels on around the ring back to p-2. 2(p-1) steps of n each."""
    rank, p, total = _start(tensor, group)
    sent = 0
    if p == 1:
        return total, sent
    # phase 1: accumulate along the ring
    if rank > 0:
        incoming = torch.empty_like(total)
        dist.recv(incoming, group=group, group_src=rank - 1)
        total += incoming
    if rank < p - 1:
        dist.send(total, group=group, group_dst=rank + 1)
        sent += _bytes(total)
    # phase 2: the last rank's total goes around: p-1 -> 0 -> 1 -> ... -> p-2
    if rank != p - 1:
        dist.recv(total, group=group, group_src=(rank - 1) % p)
    if rank != p - 2:
        dist.send(total, group=group, group_dst=(rank + 1) % p)
        sent += _bytes(total)
    return total, sent


def ring_chunks(tensor, p: int):
    """Views of the p chunks of a flat vector (sizes differ by at most one)."""
    return list(tensor.view(-1).tensor_split(p))


def ring_all_reduce(tensor, group=None, trace: list | None = None):
    """The efficient ring: reduce-scatter, then all-gather, p - 1 steps each.

    Reduce-scatter, step s: rank r sends chunk (r - s) mod p to r + 1 and adds the chunk
    (r - s - 1) mod p it receives from r - 1. After p - 1 steps rank r holds the full sum of
    chunk (r + 1) mod p. All-gather, step s: rank r sends its finished chunk (r + 1 - s) mod p
    on and stores chunk (r - s) mod p from r - 1. Each rank sends 2 (p - 1) / p n numbers.

    With ``trace`` (a list), appends (phase, step, copy of this rank's chunks) after each step.
    """
    rank, p, total = _start(tensor, group)
    sent = 0
    chunks = ring_chunks(total, p)
    nxt, prev = (rank + 1) % p, (rank - 1) % p
    if trace is not None:
        trace.append(("start", 0, [c.clone() for c in chunks]))
    for step in range(p - 1):  # reduce-scatter
        send_id, recv_id = (rank - step) % p, (rank - step - 1) % p
        incoming = torch.empty_like(chunks[recv_id])
        _exchange(chunks[send_id].contiguous(), nxt, incoming, prev, group)
        sent += _bytes(chunks[send_id])
        chunks[recv_id] += incoming
        if trace is not None:
            trace.append(("reduce-scatter", step + 1, [c.clone() for c in chunks]))
    for step in range(p - 1):  # all-gather
        send_id, recv_id = (rank + 1 - step) % p, (rank - step) % p
        incoming = torch.empty_like(chunks[recv_id])
        _exchange(chunks[send_id].contiguous(), nxt, incoming, prev, group)
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


def torch_all_reduce(tensor, group=None):
    """torch.distributed's own all-reduce (gloo's or NCCL's), in the same (result, bytes_sent)
    form; the bytes are the efficient ring's by formula, since the library does not report them."""
    _, p, total = _start(tensor, group)
    dist.all_reduce(total, group=group)
    return total, int(all_reduce_bytes("efficient ring", _bytes(total), p))


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # the exchange is a permutation: its gradient goes back the same way
        out = torch.empty_like(grad, memory_format=torch.contiguous_format)
        dist.all_to_all_single(out, grad.contiguous(), group=ctx.group)
        return out, None


def all_to_all(x, group=None):
    """All-to-all of ``x`` shaped (p, ...): slice s goes to rank s of ``group``, and slice s of
    the result came from rank s. Differentiable: the gradient is exchanged back the same way."""
    p = dist.get_world_size(group)
    if x.shape[0] != p:
        raise ValueError(f"all_to_all needs one slice per rank on dim 0: {p} ranks, "
                         f"shape {tuple(x.shape)}")
    return _AllToAll.apply(x, group)


def subgroups(rows):
    """A process group for each row of ``rows`` (a table of global ranks, every rank in one
    row), made by every rank in the same order; returns this rank's. A rank joins only its own
    group: the others cost it no threads or sockets."""
    me, mine = dist.get_rank(), None
    rows = rows.tolist() if hasattr(rows, "tolist") else [list(row) for row in rows]
    seen = set()  # checked alike on every rank, before any group: all refuse, none waits
    for row in rows:
        if not row or not all(is_whole(r) and 0 <= r < dist.get_world_size() for r in row):
            raise ValueError(f"row {row} of {rows}: a row lists at least one rank, each a whole "
                             f"number from 0 to {dist.get_world_size() - 1}")
        if twice := sorted({r for r in row if r in seen or row.count(r) > 1}):
            raise ValueError(f"rank(s) {twice} appear twice in {rows}: every rank is in one row")
        seen.update(row)
    for row in rows:
        group = dist.new_group(row)
        if me in row:
            mine = group
    if mine is None:
        raise ValueError(f"rank {me} is in no row of {rows}")
    return mine


def time_all_reduce(all_reduce, numels, *, repeats: int = 5, warmup: int = 1,
                    dtype=torch.float32, group=None) -> dict[int, list[float]]:
    """On every rank of ``group``: wall times of ``all_reduce`` for vectors of each length in
    ``numels``, on the rank's device.

    A barrier lines the ranks up before each run, so each time is one collective, not the
    wait for a late peer; the device is synchronised before the clock stops. Returns
    {numel: [seconds, ...]} (this rank's view).
    """
    check_whole("repeats", repeats)
    check_whole("warmup", warmup, least=0)
    for numel in numels:
        check_whole("each length in numels", numel)
    dev, times = device(group), {}
    for numel in numels:
        tensor = torch.ones(numel, dtype=dtype, device=dev)
        for _ in range(warmup):
            all_reduce(tensor, group=group)
        runs = []
        for _ in range(repeats):
            dist.barrier(group=group)
            synchronize(dev)
            start = time.perf_counter()
            all_reduce(tensor, group=group)
            synchronize(dev)
            runs.append(time.perf_counter() - start)
        times[numel] = runs
    return times


# -- lesson 3's check, as a command ----------------------------------------------------------------

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def four_ways(numel: int = 1001, seed: int = 0, group=None) -> dict:
    """Run on every rank of ``group``: each all-reduce of ``ALL_REDUCES`` on this rank's random
    vector (seeded by seed and rank) in float32 and float64. Returns {(name, dtype name):
    (largest |difference| from ``dist.all_reduce``, bytes this rank sent)}."""
    check_whole("numel", numel)
    g = torch.Generator().manual_seed(seed * 1009 + dist.get_rank(group))
    out = {}
    for dtype_name, dtype in DTYPES.items():
        x = torch.randn(numel, generator=g, dtype=dtype).to(device(group))
        reference = x.clone()
        dist.all_reduce(reference, group=group)
        for name, all_reduce in ALL_REDUCES.items():
            result, sent = all_reduce(x, group=group)
            out[name, dtype_name] = ((result - reference).abs().max().item(), sent)
    return out


def main(argv=None):
    args, results = run_command(
        four_ways, "Lesson 3: all-reduce written four ways with send and receive, against "
        "dist.all_reduce",
        (("--numel", int, 1001, {"help": "numbers in each rank's vector"}), ("--seed", int, 0)),
        argv)
    if results is not None:  # the launcher, or rank 0 under torchrun
        n, p = args.numel, len(results)
        print(f"n = {n} numbers on p = {p} ranks; difference to dist.all_reduce (largest over "
              f"ranks)")
        for name in ALL_REDUCES:
            diff32, diff64 = (max(r[name, d][0] for r in results) for d in DTYPES)
            sent = [r[name, "float32"][1] for r in results]
            print(f"  {name:<19} max diff float32 {diff32:.1e}, float64 {diff64:.1e}; bytes sent "
                  f"per rank (float32) {sent}; formula (busiest) "
                  f"{all_reduce_bytes(name, 4 * n, p):.0f}")
    return results


if __name__ == "__main__":
    run_main(main)
