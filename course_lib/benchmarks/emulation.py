"""Benchmark: does a paced step take the emulated device's modelled time?

Lecture: slides part 1 (a device computes while its host communicates). The emulated device
(``runtime.emulation``) runs a step's real computation, then sleeps until the step has taken
FLOPs / rate. This times paced steps of matrix products, with the rate set so that the device is
``slower`` x this CPU, and prints wall / modelled (1.00 is exact; the sleep's wake-up and the
bookkeeping add a little, and a busy machine more). Prints, asserts nothing:

    python -m course_lib.benchmarks.emulation [--repeats 9] [--slower 4] [--busy]

``--busy`` runs it beside a process that keeps one core busy (a browser, a second kernel).

:func:`time_after_compute` times all-reduces as a step on the emulated device sends them, right
after the device's compute (lesson 12 fits the emulated cluster's link to them).
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from course_lib.benchmarks.threads import busy_process
from course_lib.runtime.emulation import EmulatedDevice
from course_lib.runtime.timing import Timing, measure
from course_lib.runtime.torchrun import positive


def matrix_products(a: torch.Tensor, n: int = 20) -> torch.Tensor:
    """``n`` products of ``a`` with itself (tanh keeps the values finite): a step's compute."""
    for _ in range(n):
        a = torch.tanh(a @ a / len(a))
    return a


def time_after_compute(all_reduce, numels, emulated: EmulatedDevice, *, products: int = 8,
                       size: int = 256, repeats: int = 5, warmup: int = 1,
                       group=None) -> dict[int, list[float]]:
    """On every CPU rank of ``group``: what each ``all_reduce`` of a vector of each length in
    ``numels`` adds to a step on the emulated device, where a message comes after the device's
    compute, not right after another message. Each repetition queues ``products`` matrix
    products of ``size`` x ``size`` on ``emulated``, then all-reduces; its time is the wall
    time less the device's modelled time for the products (the host sleeps until the device is
    done, then sends). Returns {numel: [seconds, ...]} (this rank's view)."""
    a, times = torch.randn(size, size, generator=torch.Generator().manual_seed(0)), {}
    with emulated.queued():
        for numel in numels:
            tensor, runs = torch.ones(numel), []
            for r in range(warmup + repeats):
                start, before = time.perf_counter(), emulated.device_seconds
                matrix_products(a, products)
                all_reduce(tensor, group=group)
                if r >= warmup:
                    runs.append(time.perf_counter() - start - (emulated.device_seconds - before))
            times[numel] = runs
    return times


def paced_steps(size: int = 300, slower: float = 4.0, repeats: int = 9) -> dict:
    """Time ``repeats`` paced steps of :func:`matrix_products` on an emulated device whose
    rate makes a step ``slower`` x this CPU's (one thread) time for it.

    Returns dict(modelled=seconds, paced=Timing of the paced steps, cpu=Timing of the same
    step unpaced)."""
    if not slower > 1:
        raise ValueError(f"slower must be > 1 (the device must be slower than this CPU's work "
                         f"for the sleep to make up the difference), got {slower!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the emulated device measures one thread's work
    try:
        a = torch.randn(size, size, generator=torch.Generator().manual_seed(0))
        cpu = measure(lambda: matrix_products(a), repeats=repeats, warmup=1)
        device = EmulatedDevice(1.0, "this benchmark")
        with device.counting():
            matrix_products(a)
            device.catch_up()
        device.flops_per_second = device.step_flops / (slower * cpu.median)

        def step():
            device.start()
            matrix_products(a)
            device.catch_up()

        paced = measure(step, repeats=repeats, warmup=1)
    finally:
        torch.set_num_threads(before)
    return dict(modelled=device.step_flops / device.flops_per_second, paced=paced, cpu=cpu)


def format_paced(result: dict) -> str:
    modelled, paced = result["modelled"], result["paced"]
    ratios = Timing([t / modelled for t in paced.times])
    return "\n".join([
        f"this CPU, unpaced:   {result['cpu']}",
        f"modelled (emulated device): {modelled * 1e3:.1f} ms",
        f"paced steps:         {paced}",
        f"wall / modelled:     median {ratios.median:.3f} (min {min(ratios.times):.3f}, "
        f"max {max(ratios.times):.3f})",
    ])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive(int), default=9)
    parser.add_argument("--slower", type=positive(float), default=4.0)
    parser.add_argument("--busy", action="store_true", help="beside a busy process")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    with busy_process() if args.busy else contextlib.nullcontext():
        result = paced_steps(slower=args.slower, repeats=args.repeats)
    print("beside a busy process" if args.busy else "idle machine")
    print(format_paced(result))
    print(f"({time.perf_counter() - start:.1f} s)")
    return result


if __name__ == "__main__":
    main()
