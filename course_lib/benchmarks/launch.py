"""Benchmark: how long it takes to start workers and do one all-reduce, four ways.

Lecture: slides part 1 (the costs of a parallel step: computation, communication,
synchronisation; starting the workers is paid before any of them). Prints, asserts nothing:

    python -m course_lib.benchmarks.launch [--repeats 5] [--warmup 1]

Each way runs the same job, ``one_all_reduce``, on 2 ranks, from a process that has already
imported torch: :func:`course_lib.launch` warm (workers forked by its fork server, which the
warm-up run starts) and cold (``warm=False``: new interpreters); ``torchrun --standalone
--nproc-per-node=2`` (a new command, as a student would type it); ``torch.multiprocessing.spawn``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from course_lib.report import progress
from course_lib.runtime.devices import loopback_interface
from course_lib.runtime.launching import LOOPBACK, launch
from course_lib.runtime.timing import Timing, measure_interleaved
from course_lib.runtime.torchrun import number, positive


def one_all_reduce() -> float:
    """The job: sum [1.0] over all ranks."""
    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()


def _torchrun_worker():
    dist.init_process_group("gloo")
    one_all_reduce()
    dist.barrier()
    dist.destroy_process_group()


def run_with_torchrun(world_size: int = 2) -> None:
    """Start ``torchrun --standalone`` on this module's worker entry and wait for it."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={world_size}", "-m", "course_lib.benchmarks.launch",
           "--torchrun-worker"]
    env = dict(os.environ)
    iface = loopback_interface()
    if iface:
        env.setdefault("GLOO_SOCKET_IFNAME", iface)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun failed ({done.returncode}):\n{done.stderr[-2000:]}")


def _spawn_entry(rank, world_size, port):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    store = dist.TCPStore(LOOPBACK, port, world_size, is_master=False,
                          timeout=datetime.timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    one_all_reduce()
    dist.barrier()
    dist.destroy_process_group()


def run_with_spawn(world_size: int = 2) -> None:
    """``torch.multiprocessing.spawn`` with a store held by this process (no fixed port)."""
    store = dist.TCPStore(LOOPBACK, 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=120))
    mp.spawn(_spawn_entry, args=(world_size, store.port), nprocs=world_size, join=True)
    del store


def run_with_launch(world_size: int = 2, warm: bool = True) -> None:
    # gloo, as the torchrun and spawn runs use: on a GPU node "auto" would time NCCL's start-up
    launch(one_all_reduce, world_size=world_size, backend="gloo", timeout=120, warm=warm)


def compare_launchers(world_size: int = 2, repeats: int = 5, warmup: int = 1,
                      ways=("launch, warm", "launch, cold", "torchrun", "mp.spawn")
                      ) -> dict[str, Timing]:
    """Time each way of running the job, the ways in turn in every round (a slow spell of the
    machine falls on all of them alike); returns name -> Timing."""
    runners = {"launch, warm": run_with_launch,
               "launch, cold": lambda p: run_with_launch(p, warm=False),
               "torchrun": run_with_torchrun, "mp.spawn": run_with_spawn}
    unknown = set(ways) - set(runners)
    if unknown:
        raise ValueError(f"unknown launchers {sorted(unknown)}: choose from {sorted(runners)}")
    fns = {name: lambda name=name: runners[name](world_size) for name in ways}
    # a bar in a notebook (nothing in a script): the cold launchers take seconds each
    rounds = [measure_interleaved(fns, repeats=1, warmup=warmup if i == 0 else 0)
              for i in progress(range(repeats), "rounds of every launcher")]
    return {name: Timing([t for r in rounds for t in r[name].times]) for name in ways}


def format_comparison(timings: dict[str, Timing], reference: str = "torchrun") -> str:
    """A table of medians and spreads, with each median as a ratio of the reference's."""
    ref = timings[reference].median if reference in timings else None
    rows = [f"{'launcher':<13} {'median':>9} {'IQR':>8} {'runs':>5}  ratio to {reference}"]
    for name, t in timings.items():
        ratio = f"{t.median / ref:.2f}" if ref else "n/a"
        rows.append(f"{name:<13} {t.median:>8.2f}s {t.spread:>7.2f}s {len(t.times):>5}  {ratio}")
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive(int), default=5)
    parser.add_argument("--warmup", type=number(int, 0), default=1)
    parser.add_argument("--world-size", type=positive(int), default=2)
    parser.add_argument("--torchrun-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torchrun_worker:
        return _torchrun_worker()
    print(f"{args.world_size} ranks, one all-reduce each; {args.warmup} warm-up and "
          f"{args.repeats} timed runs per launcher")
    timings = compare_launchers(args.world_size, args.repeats, args.warmup)
    print(format_comparison(timings))
    return timings


if __name__ == "__main__":
    main()
