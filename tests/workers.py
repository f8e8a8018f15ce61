"""Functions the launcher tests run on the workers (importable, like a lesson's module)."""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")


def rank_and_size():
    return dist.get_rank(), dist.get_world_size()


def environment():
    return {k: os.environ.get(k) for k in ENV_KEYS} | {"threads": torch.get_num_threads(),
                                                       "backend": dist.get_backend()}


def all_reduce_of(tensors):
    """Sum this rank's tensor over all ranks."""
    t = tensors[dist.get_rank()].clone()
    dist.all_reduce(t)
    return t


def echo(*args, **kwargs):
    return dist.get_rank(), args, kwargs


def record_pid(pid_dir):
    # written beside, then renamed: a reader never sees the file empty (a race CI once lost)
    part = Path(pid_dir, f"{dist.get_rank()}.pid.part")
    part.write_text(str(os.getpid()))
    part.rename(part.with_suffix(""))


def raise_on_rank_1(pid_dir, time_file):
    """Rank 1 raises at once; rank 0 waits in a collective that rank 1 never joins."""
    record_pid(pid_dir)
    if dist.get_rank() == 1:
        time.sleep(1.0)  # let rank 0 reach the collective
        Path(time_file).write_text(repr(time.time()))
        raise ValueError("boom on purpose")
    dist.all_reduce(torch.ones(1))


def exit_on_rank_1(pid_dir, how):
    """Rank 1 ends its process abruptly; rank 0 sleeps."""
    record_pid(pid_dir)
    if dist.get_rank() == 1:
        if how == "os._exit":
            os._exit(3)
        if how == "sigkill":
            os.kill(os.getpid(), 9)
        if how == "segfault":
            import ctypes
            ctypes.string_at(0)
        if how == "sys.exit":
            raise SystemExit(0)
    time.sleep(120)


def stuck_in_collective(pid_dir, op="all_reduce"):
    """Rank 0 waits in an all-reduce (or a barrier) that rank 1 never calls: rank 1 returns at
    once."""
    record_pid(pid_dir)
    if dist.get_rank() == 0:
        dist.barrier() if op == "barrier" else dist.all_reduce(torch.ones(1))


def endless_loop(pid_dir):
    record_pid(pid_dir)
    while True:
        pass


def print_then_sleep(seconds):
    print(f"first line from rank {dist.get_rank()}", flush=True)
    time.sleep(seconds)
    return time.time()


def return_unpicklable():
    import threading
    return threading.Lock()


def has_module(name):
    import sys
    return name in sys.modules


def data_loader_and_fork_sums(n):
    """A DataLoader with two worker processes, then a child of multiprocessing's "fork": both
    fork this rank while its threads (the launcher's watchdog among them) run."""
    import multiprocessing

    from torch.utils.data import DataLoader

    loaded = sorted(int(x) for batch in DataLoader(list(range(n)), batch_size=2, num_workers=2)
                    for x in batch)
    queue = multiprocessing.get_context("fork").SimpleQueue()
    child = multiprocessing.get_context("fork").Process(target=queue.put, args=(sum(loaded),))
    child.start()
    child.join(60)
    return loaded, queue.get() if child.exitcode == 0 else child.exitcode
