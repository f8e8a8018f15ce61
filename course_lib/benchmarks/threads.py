"""Benchmark: a lesson-sized computation in one thread and in several, on an idle machine and
beside a busy process.

Lecture: slides part 1 (processors and what shares them). Why the kit computes in one thread
(``runtime.machine.use_threads``): a lesson's models are small, so each operation is split over
threads for microseconds at a time, and the threads wait for each other at the end of every
operation. When another process keeps a core busy -- a browser, a second kernel, a shared CI
runner -- one of those threads waits for the operating system to give it the core back, at
every operation, and a thread's turn on a shared core lasts milliseconds. Prints, asserts
nothing:

    python -m course_lib.benchmarks.threads [--repeats 3] [--steps 20]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys

import psutil
import torch

from course_lib.models import digits_cnn
from course_lib.report import progress
from course_lib.runtime.devices import usable_cores
from course_lib.runtime.timing import Timing, measure
from course_lib.runtime.torchrun import positive


def small_steps(steps: int = 20) -> None:
    """``steps`` SGD steps of lesson 4's digits CNN on batches of 64: what a lesson computes
    in the kernel (big enough that torch splits its operations over threads)."""
    torch.manual_seed(0)
    model = digits_cnn(width=32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 1, 8, 8), torch.randint(10, (64,))
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


@contextlib.contextmanager
def busy_process():
    """A process that keeps one core busy at the lowest priority while the block runs.

    It runs in a session of its own, like a browser or another terminal's program beside a
    notebook's kernel (Jupyter starts each kernel in a new session too). On Linux that matters:
    the scheduler shares the cores fairly between sessions first ("autogroups"), so the lowest
    priority only lowers a process against the others of its own session."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        psutil.Process(proc.pid).nice(19 if os.name == "posix" else psutil.IDLE_PRIORITY_CLASS)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def compare_threads(threads=None, repeats: int = 3, steps: int = 20) -> dict:
    """Time :func:`small_steps` with each number of ``threads`` (default: 1 and every usable
    core), idle and beside :func:`busy_process`. Returns {(threads, "idle" | "busy"): Timing};
    this process's own thread setting is restored."""
    threads = threads or sorted({1, usable_cores()})
    before, timings = torch.get_num_threads(), {}
    try:
        for load in progress(("idle", "busy"), "idle, then beside a busy process"):
            with busy_process() if load == "busy" else contextlib.nullcontext():
                for n in threads:
                    torch.set_num_threads(n)
                    timings[n, load] = measure(lambda: small_steps(steps), repeats=repeats,
                                               warmup=1)
    finally:
        torch.set_num_threads(before)
    return timings


def format_threads(timings: dict[tuple, Timing]) -> str:
    rows = [f"{'threads':>7} {'idle':>10} {'busy core beside':>17}   busy / idle"]
    for n in sorted({n for n, _ in timings}):
        idle, busy = timings[n, "idle"], timings[n, "busy"]
        rows.append(f"{n:>7} {idle.median * 1e3:>8.0f}ms {busy.median * 1e3:>15.0f}ms   "
                    f"{busy.median / idle.median:>10.1f}x")
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--repeats", type=positive(int), default=3)
    parser.add_argument("--steps", type=positive(int), default=20)
    args = parser.parse_args(argv)
    timings = compare_threads(repeats=args.repeats, steps=args.steps)
    print(f"{args.steps} SGD steps of the digits CNN, median of {args.repeats} runs")
    print(format_threads(timings))
    return timings


if __name__ == "__main__":
    main()
