"""Where a rank computes and which backend carries its messages: one rule for every lesson.

Lecture: slides part 1 (processors and message passing) and the article's workflow ("prepare
the environment, choose the framework"): the same lesson runs on a laptop's cores, on one GPU,
on a GPU node and on a cluster.

The rule:

* **GPUs for every rank of this node** (NCCL available): rank r computes on ``cuda:LOCAL_RANK``,
  and its process group is ``"cpu:gloo,cuda:nccl"``: CUDA tensors travel over NCCL, CPU tensors
  over gloo, so no collective can fail for want of a backend for its tensor's device;
* **otherwise**: every rank computes on the CPU and the group is gloo.

:func:`device` answers "where do I put my tensors?" on a rank; :func:`choose_backend` answers
"which backend does ``launch`` or ``torchrun`` create?" before any process starts;
:func:`worker_threads` answers "how many CPU threads does each process compute with?" (the same
number for one rank as for many).
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist

BACKENDS = ("auto", "gloo", "nccl")
GLOO = "gloo"
GLOO_AND_NCCL = "cpu:gloo,cuda:nccl"  # CPU tensors over gloo, CUDA tensors over NCCL


def usable_cores() -> int:
    """CPU cores this process may run on (respects taskset / container limits)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def worker_threads(threads: int | None = None) -> int:
    """The CPU threads torch computes with in each process: the notebook's kernel, every rank of
    a ``launch`` and every process under torchrun. ``threads``, or else ``COURSE_LIB_THREADS``
    (default 1): the same number whatever the world size, so that one rank and p ranks are timed
    with the same threads each (sharing the cores out gave one rank every core's threads and
    turned threads into "speedup"). Refuses anything but a whole number >= 1."""
    if threads is None:
        raw = os.environ.get("COURSE_LIB_THREADS", "1")
        try:
            threads = int(raw)
        except ValueError:
            raise ValueError(f"COURSE_LIB_THREADS must be a whole number of threads, at least "
                             f"1, got {raw!r}") from None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a whole number, at least 1 (CPU threads per "
                         f"process), got {threads!r}")
    return threads


def gpu_count() -> int:
    """CUDA devices this process can see (0 on a CPU-only build or machine)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def backend_for(backend: str, world_size: int, gpus: int, nccl_available: bool) -> str:
    """The process-group backend for ``world_size`` ranks on a node with ``gpus`` GPUs.

    ``"auto"``: GPUs and NCCL when every rank gets its own GPU, else gloo on the CPU. ``"nccl"``
    insists on GPUs (a ValueError says why not). With GPUs the group also has gloo for CPU
    tensors. ``"gloo"``: CPU only, even where GPUs exist.
    """
    if backend not in BACKENDS:
        choices = ", ".join(map(repr, BACKENDS))
        raise ValueError(f"unknown backend {backend!r}: use one of {choices}")
    if backend == "gloo":
        return GLOO
    enough = nccl_available and 0 < world_size <= gpus
    if backend == "auto":
        return GLOO_AND_NCCL if enough else GLOO
    if not nccl_available:
        raise ValueError("backend='nccl' asked for, but this PyTorch build has no NCCL "
                         "(a CPU build?). Use backend='gloo' or 'auto'.")
    if not enough:
        raise ValueError(f"backend='nccl' needs one GPU per rank: world_size={world_size} but "
                         f"{gpus} GPU(s) found. Use backend='gloo' (CPU) or fewer ranks.")
    return GLOO_AND_NCCL


def choose_backend(backend: str, world_size: int) -> str:
    """:func:`backend_for` with this machine's GPU count and PyTorch build."""
    return backend_for(backend, world_size, gpu_count(), dist.is_nccl_available())


def uses_gpus(backend: str) -> bool:
    """Does a group with this backend string compute on GPUs?"""
    return "nccl" in str(backend)


def device(group=None) -> torch.device:
    """The device this rank puts its models and tensors on: ``cuda:LOCAL_RANK`` when its process
    group has NCCL, the CPU otherwise (and outside any process group)."""
    if dist.is_available() and dist.is_initialized() and uses_gpus(
            dist.get_backend_config(group)):
        local_rank = os.environ.get("LOCAL_RANK")
        return torch.device("cuda", int(local_rank) if local_rank is not None
                            else torch.cuda.current_device())
    return torch.device("cpu")


def loopback_interface() -> str | None:
    """Name of the loopback network interface ('lo' on Linux, 'lo0' on macOS), if one is found."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return None
