"""Benchmark for lessons 3-4: our ring against the library's, and DDP's speedup on two workers.

Slides part 3 (ring all-reduce; data-parallel training of a small CNN). Prints, asserts nothing:

    python -m course_lib.benchmarks.data_parallel [--repeats 5] [--steps 10]

1. Bus bandwidth of the hand-written efficient ring and of torch.distributed's all-reduce
   (gloo's, or NCCL's on GPUs) at 16 MiB on two ranks, and their ratio.
2. Time per DDP training step of a compute-bound CNN (global batch fixed: strong scaling) on 1
   and on 2 workers of one thread each, in the same run, and the speedup.
"""

from __future__ import annotations

import argparse
import functools
import statistics

from course_lib import collectives as C
from course_lib import data_parallel as dp
from course_lib.benchmarks import overlap as overlap_bench
from course_lib.benchmarks.systems import gpt3_xl_data_parallel
from course_lib.cost_models import bus_bandwidth, fit_alpha_beta
from course_lib.data import load_digits
from course_lib.models import digits_cnn
from course_lib.runtime import device, launch
from course_lib.runtime.devices import usable_cores
from course_lib.runtime.emulation import EmulatedDevice, rate_for, reachable_ratio
from course_lib.runtime.timing import median_of_slowest
from course_lib.runtime.torchrun import positive
from course_lib.training import check_whole

MIB = 2**20


def _ring_and_gloo(numel, repeats):
    return {name: C.time_all_reduce(fn, [numel], repeats=repeats)[numel]
            for name, fn in (("torch", C.torch_all_reduce), ("efficient ring", C.ring_all_reduce))}


def ring_vs_gloo(size_bytes: int = 16 * MIB, repeats: int = 5) -> dict[str, float]:
    """Bus bandwidth (bytes/s) of each all-reduce at ``size_bytes`` (float32) on two ranks."""
    runs = launch(_ring_and_gloo, world_size=2, args=(size_bytes // 4, repeats))
    return {name: bus_bandwidth(size_bytes, median_of_slowest([r[name] for r in runs]), 2)
            for name in runs[0]}


def ddp_step_times(world_sizes=(1, 2), global_batch: int = 256, width: int = 32,
                   steps: int = 10, warmup: int = 3) -> dict[int, list[float]]:
    """Per-step seconds (slowest rank, with communication) of DDP on each world size, with the
    global batch fixed and one thread per worker."""
    split = load_digits(images=True)
    model_fn = functools.partial(digits_cnn, seed=0, width=width)
    times = {}
    for world_size in world_sizes:
        runs = launch(dp.time_ddp_steps, world_size=world_size,
                      args=(model_fn, split.x_train, split.y_train, global_batch // world_size),
                      kwargs=dict(steps=steps, warmup=warmup))
        times[world_size] = [max(step) for step in zip(*(r["with_sync"] for r in runs),
                                                       strict=True)]
    return times


def lesson_system() -> dict:
    """What lesson 4's emulated device stands for: GPT-3 XL on one DGX A100 (8 GPUs on NVLink),
    16 sequences per GPU (``benchmarks.systems.gpt3_xl_data_parallel``)."""
    return gpt3_xl_data_parallel(8, 16)


def _similarity(model_fn, x, y, group=None):
    model, dev = model_fn().to(device(group)), device(group)
    out = overlap_bench.calibrate(model, x.to(dev), y.to(dev), group, dev)
    out["gradient_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    out["messages"] = overlap_bench.message_times(  # for alpha and beta: DDP's one bucket
        [*overlap_bench.MESSAGE_BYTES, out["gradient_bytes"]], 5, group, dev)
    return out


def emulated_strong_scaling(model_fn, x, y, workers=(1, 2, 3, 4), ratio: float | None = None,
                            steps: int = 6, warmup: int = 2) -> dict:
    """Strong scaling on an emulated device (``runtime.emulation``): the global batch (x, y)
    split over each number of ``workers``, every rank's compute paced by one device whose rate
    gives one worker's whole-batch step the ``ratio`` (default :func:`lesson_system`'s) of
    communication -- the gradients' all-reduce on two ranks, measured here -- to compute. The
    ranks share this machine's cores, which is allowed when the device leaves them mostly
    idle: the device is never faster than the busiest count allows with 3/4 of the cores free,
    so a small model's fast all-reduce can give a smaller ratio than asked (``achieved``).
    Returns the per-step seconds ``times[m]`` (the slowest rank's, with and without
    synchronising, as ``data_parallel.time_ddp_steps`` gives them), the ``rate``, the
    ``ratio`` asked and ``achieved``, the ``similarity`` (with ``gradient_bytes``) and the
    ``alpha`` and ``beta`` of all-reduces on two ranks (least squares in seconds)."""
    ratio = lesson_system()["ratio"] if ratio is None else ratio
    if isinstance(ratio, bool) or not ratio > 0:
        raise ValueError(f"ratio must be positive, got {ratio!r}")
    check_whole("steps", steps)
    check_whole("warmup (an emulated device's first step counts FLOPs, unpaced)", warmup)
    runs = launch(_similarity, 2, args=(model_fn, x, y), backend="gloo")
    similarity = runs[0]
    sent = [(n, max(ts)) for n in similarity["messages"]  # each message, the slower rank's time
            for ts in zip(*(r["messages"][n] for r in runs), strict=True)]
    alpha, beta = fit_alpha_beta(*zip(*sent, strict=True), relative=False)
    least = max(2.0, 4 * max(workers) / usable_cores())  # the busiest count: a quarter busy
    comm, cpu = similarity["communication"], similarity["compute_cpu"]
    achieved = reachable_ratio(ratio, comm, cpu, least)
    rate = rate_for(achieved, comm, similarity["flops"], cpu, least)
    times = {}
    for m in workers:
        runs = launch(dp.time_ddp_steps, world_size=m, backend="gloo",
                      args=(model_fn, x, y, len(y) // m),
                      kwargs=dict(steps=steps, warmup=warmup, emulated=EmulatedDevice(rate)))
        times[m] = {mode: [max(step) for step in zip(*(r[mode] for r in runs), strict=True)]
                    for mode in ("with_sync", "no_sync")}
    return dict(times=times, rate=rate, ratio=ratio, similarity=similarity,
                achieved=achieved, alpha=alpha, beta=beta)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive(int), default=5)
    parser.add_argument("--steps", type=positive(int), default=10)
    args = parser.parse_args(argv)
    bw = ring_vs_gloo(repeats=args.repeats)
    print(f"all-reduce of 16 MiB on 2 ranks, bus bandwidth (median of {args.repeats}): "
          f"torch.distributed {bw['torch'] / 1e9:.2f} GB/s, hand-written ring "
          f"{bw['efficient ring'] / 1e9:.2f} GB/s; ratio ring / torch = "
          f"{bw['efficient ring'] / bw['torch']:.2f}")
    times = ddp_step_times(steps=args.steps)
    t1, t2 = statistics.median(times[1]), statistics.median(times[2])
    print(f"DDP step, digits CNN (width 32), global batch 256, one thread per worker, median of "
          f"{args.steps}: 1 worker {t1 * 1e3:.1f} ms, 2 workers {t2 * 1e3:.1f} ms; "
          f"speedup {t1 / t2:.2f}x (ideal 2)")
    return bw, times


if __name__ == "__main__":
    main()
