"""Benchmark for lesson 13: does ring attention hide its messages, and do the experts'
all-to-alls take the alpha-beta model's time? Prints, asserts nothing:

    python -m course_lib.benchmarks.long_sequences [--repeats 15] [--busy]

:func:`time_ring_forward` runs ring attention's forward (Liu et al. 2023) on two ranks on the
emulated device (``runtime.emulation``): a block of attention takes the time a device would
need, the messages between the ranks stay real. It runs once with the next block travelling
while this one computes (overlap) and once waiting for it first. Two CPU cores cannot show
the overlap without it: a rank's compute and gloo's sends would share the cores.

:func:`time_expert_parallel` times the dispatch and combine all-to-alls of a mixture of experts
spread over the ranks (GShard, Lepikhin et al. 2020), for several batch sizes, as they happen
inside the layer's forward.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time

import torch
import torch.distributed as dist

from course_lib import cost_models
from course_lib.benchmarks.threads import busy_process
from course_lib.collectives import time_all_reduce
from course_lib.context_parallel import OnlineSoftmax, block_scores, ring_attention, split_sequence
from course_lib.experts import ExpertParallel, MixtureOfExperts, capacity
from course_lib.runtime.devices import device
from course_lib.runtime.emulation import EmulatedDevice, check_cpu_rank, flops_of, paced_step
from course_lib.runtime.launching import launch
from course_lib.runtime.torchrun import positive
from course_lib.training import check_whole


def slowest(seconds: list, group=None) -> list:
    """Each repeat's time on the slowest rank of ``group`` (the same list on every rank)."""
    t = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def last_arrival(seconds: list, group=None) -> list:
    """Each collective's time on the rank that reached it last, the shortest of the ranks' times
    (a rank that came earlier also waited for that one): the message's own time."""
    t = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return t.tolist()


def time_ring_forward(q, k, v, *, ratio: float = 0.5, repeats: int = 7, group=None) -> dict:
    """Ring attention's forward (no mask) on an emulated device, with and without overlap, in
    turn ``repeats`` times after one counted run. The device's rate makes a block compute in
    the message's time / ``ratio`` (its median, the slowest rank's), or in 3 x this CPU's own
    work on the block if that is longer: the CPU must stay free for gloo's threads most of the
    time, as a GPU's host is. Returns, on every rank: ``message`` and ``block`` seconds, each
    repeat's forward seconds (the slowest rank's) ``with overlap`` and ``waiting first``, and
    ``host``: the seconds per forward of work without FLOPs, which the device does not model."""
    if isinstance(ratio, bool) or not 0 < ratio < math.inf:
        raise ValueError(f"ratio (a message's time over a block's) must be positive, got {ratio!r}")
    p, r, dev = dist.get_world_size(group), dist.get_rank(group), device(group)
    check_whole("repeats", repeats), check_whole("ranks of a ring", p, 2), check_cpu_rank(dev)
    mine = [split_sequence(x, p, r).to(dev) for x in (q, k, v)]
    kv, pos = torch.stack(mine[1:]), torch.arange(mine[0].shape[-2])

    def message():  # the block to the next rank, the previous rank's block from it
        incoming = torch.empty_like(kv)
        dist.barrier(group=group)
        start = time.perf_counter()
        for req in (dist.isend(kv, group=group, group_dst=(r + 1) % p),
                    dist.irecv(incoming, group=group, group_src=(r - 1) % p)):
            req.wait()
        return time.perf_counter() - start

    def block():
        OnlineSoftmax(mine[0]).add(block_scores(mine[0], mine[1], pos, pos, False)[0], mine[2])

    flops, _ = flops_of(block)
    cpu = []
    for _ in range(repeats + 1):
        start = time.thread_time()
        block()
        cpu.append(time.thread_time() - start)
    message_s = statistics.median(slowest([message() for _ in range(repeats + 1)][1:], group))
    cpu_s = statistics.median(slowest(cpu[1:], group))
    rate = flops / max(message_s / ratio, 3 * cpu_s)  # the CPU busy a third of a block at most
    modes = {"with overlap": True, "waiting first": False}
    stands_for = f"a block takes {flops / rate / message_s:.1f} x its message"
    devices = {mode: EmulatedDevice(rate, stands_for) for mode in modes}
    times = {mode: [] for mode in modes}
    with torch.no_grad():
        for i in range(repeats + 1):  # the first run counts each device's FLOPs
            for mode, emulated in devices.items():
                dist.barrier(group=group)
                start = time.perf_counter()
                with paced_step(emulated):
                    ring_attention(*mine, group=group, emulated=emulated, overlap=modes[mode])
                if i:
                    times[mode].append(time.perf_counter() - start)
    host = slowest([d.unmodelled / repeats for d in devices.values()], group)
    return {"p": p, "message": message_s, "block": flops / rate, "label": devices[mode].label,
            **{mode: slowest(times[mode], group) for mode in modes},
            "host": dict(zip(modes, host, strict=True))}


def time_expert_parallel(moe: MixtureOfExperts, tokens, *, repeats: int = 7, seed: int = 0,
                         group=None) -> dict:
    """On each rank: ``moe``'s forward with its experts spread over the ranks of ``group``
    (:class:`~course_lib.experts.ExpertParallel`), for each count in ``tokens`` of this rank's
    random tokens, ``repeats`` times after one warm-up; then the alpha-beta model's ``alpha`` and
    ``beta``, fitted in the same run (:func:`alpha_beta_of_all_to_all`). Returns them and
    ``times``: {count: (bytes of one rank's dispatch buffer, the seconds of its dispatch and
    combine in each repeat)}, each all-to-all's time that of the rank that reached it last
    (:func:`last_arrival`: the ranks route different tokens, so one waits for the other)."""
    dev, rank = device(group), dist.get_rank(group)
    check_whole("repeats", repeats)
    if not tokens:
        raise ValueError("tokens is empty: give at least one count of tokens a rank")
    for n in tokens:
        check_whole("a count of tokens", n)
    layer = ExpertParallel(moe.to(dev), group)
    d, dtype = moe.router.in_features, moe.router.weight.dtype
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    times = {}
    with torch.no_grad():
        for n in tokens:
            x = torch.randn(n, d, generator=g, dtype=dtype).to(dev)
            for _ in range(repeats + 1):
                dist.barrier(group=group)
                layer(x)
            calls = torch.tensor(last_arrival(layer.sent["seconds"][-2 * repeats:], group))
            cap = capacity(n, moe.num_experts, moe.k, moe.capacity_factor)
            times[n] = (moe.num_experts * cap * d * x.element_size(),
                        calls.reshape(repeats, 2).sum(dim=1).tolist())
    alpha, beta = alpha_beta_of_all_to_all(repeats, group)
    return {"times": times, "alpha": alpha, "beta": beta}


def flat_all_to_all(tensor, group=None):
    """An all-to-all of a rank's vector, one equal slice for each rank of ``group``, in the
    form ``collectives.time_all_reduce`` times (it times any collective)."""
    out = torch.empty_like(tensor)
    dist.all_to_all_single(out, tensor, group=group)
    return out


def alpha_beta_of_all_to_all(repeats: int = 7, group=None) -> tuple[float, float]:
    """Alpha and beta of an all-to-all's messages among the ranks of ``group``: all-to-alls of
    1 KB to 2 MB a rank, each after a barrier (``collectives.time_all_reduce``), the median over
    ``repeats`` of the time of the rank that reached it last, fitted to (p - 1) (alpha + beta n
    / p)."""
    p = check_whole("ranks of an all-to-all", dist.get_world_size(group), 2)
    check_whole("repeats", repeats)
    numels = [p * (2**k // p) for k in (8, 12, 15, 17, 19)]  # equal slices
    timed = time_all_reduce(flat_all_to_all, numels, repeats=repeats, group=group)
    seconds = [statistics.median(last_arrival(timed[n], group)) for n in numels]
    return all_to_all_model([4 * n for n in numels], seconds, p)  # float32


def all_to_all_model(n_bytes, seconds, p: int) -> tuple[float, float]:
    """Alpha and beta of (p - 1) (alpha + beta n / p), fitted to all-to-alls among ``p`` ranks
    of ``n_bytes`` a rank (its whole buffer) that took ``seconds``. Refused when the times do
    not grow with the bytes (a busy machine can hide it): beta would be 0."""
    a, b = cost_models.fit_alpha_beta(n_bytes, seconds)
    if b <= 0:
        raise ValueError(f"the all-to-alls did not take longer with more bytes ({list(seconds)} s "
                         f"for {list(n_bytes)} bytes): no beta to fit; was the machine busy? "
                         f"Run them again")
    return float(a) / (p - 1), float(b) * p / (p - 1)  # the fit's slope is per byte of n


def both(repeats: int = 15, group=None) -> dict:
    """What :func:`main` prints: the ring's two forwards, and the experts' all-to-alls with the
    alpha-beta model's prediction for them."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(128, 16, 1024, generator=g) for _ in range(3))  # wide, short
    moe = MixtureOfExperts(64, 128, 4, k=2, capacity_factor=1.0, seed=0)
    return {"ring": time_ring_forward(q, k, v, repeats=repeats, group=group),
            "experts": time_expert_parallel(moe, [64, 256, 1024, 4096], repeats=repeats,
                                            group=group)}


def report(result: dict) -> str:
    """:func:`both`'s result as lines: each measured median next to its model's time."""
    ring, p = result["ring"], result["ring"]["p"]
    m, c = ring["message"], ring["block"]
    model = {"with overlap": c + (p - 1) * max(c, m), "waiting first": p * c + (p - 1) * m}
    lines = [f"ring attention forward on {p} ranks, {ring['label']}: a message "
             f"{m * 1e3:.2f} ms, a block {c * 1e3:.2f} ms"]
    for mode, modelled in model.items():
        lines.append(f"  {mode:14s} {statistics.median(ring[mode]) * 1e3:6.2f} ms median; "
                     f"model {modelled * 1e3:6.2f} ms + host work without FLOPs "
                     f"{ring['host'][mode] * 1e3:.2f} ms")
    experts = result["experts"]
    alpha, beta = experts["alpha"], experts["beta"]
    bandwidth = f"{1 / beta / 1e9:.2f} GB/s" if beta > 0 else "unbounded"
    lines.append(f"experts' dispatch and combine (alpha {alpha * 1e6:.0f} us, 1/beta {bandwidth}):")
    for n, (n_bytes, seconds) in experts["times"].items():
        modelled = cost_models.expert_parallel_time(n_bytes, p, alpha, beta)
        lines.append(f"  {n:5d} tokens a rank, {n_bytes / 1e3:7.0f} kB: "
                     f"{statistics.median(seconds) * 1e3:6.2f} ms median, model "
                     f"{modelled * 1e3:6.2f} ms")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--repeats", type=positive(int), default=15)
    parser.add_argument("--busy", action="store_true", help="beside a busy process")
    args = parser.parse_args(argv)
    check_whole("--repeats", args.repeats)
    torch.set_num_threads(1)
    with busy_process() if args.busy else contextlib.nullcontext():
        # gloo: the emulated device stands in for a GPU on CPU ranks
        result = launch(both, 2, kwargs=dict(repeats=args.repeats), backend="gloo")[0]
    print("beside a busy process" if args.busy else "idle machine")
    print(report(result))
    return result


if __name__ == "__main__":
    main()
