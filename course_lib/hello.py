"""The first launch: every rank says hello, then all ranks take part in one all-reduce.

Lecture: slides part 3, "all-reduce: every node gets the reduced result". Runs as

    python -m course_lib.hello --world-size 2
    torchrun --standalone --nproc-per-node=2 -m course_lib.hello
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist

from course_lib.runtime.devices import device, uses_gpus
from course_lib.runtime.torchrun import check_backend, experiment_parser, run_experiment, run_main


def carrier(group=None) -> str:
    """The backend that carries this group's tensors: ``"gloo"`` for a gloo group, whatever
    the device, and ``"cpu:gloo,cuda:nccl"`` only when NCCL is in the group (gloo then carries
    the CPU tensors, NCCL the GPU ones). ``dist.get_backend_config`` says ``"cpu:gloo,cuda:gloo"``
    for plain gloo, which reads as if GPU tensors were involved when there are none."""
    config = dist.get_backend_config(group)
    if uses_gpus(config):
        return config
    backends = {part.split(":")[-1] for part in config.split(",")}
    return backends.pop() if len(backends) == 1 else config


def hello_all_reduce(group=None) -> dict:
    """Say hello from this rank, then all-reduce (sum) the tensor [rank + 1] over ``group``."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    backend, dev = carrier(group), device(group)
    print(f"hello from rank {rank} of {world_size} on {socket.gethostname()} "
          f"(pid {os.getpid()}, backend {backend}, device {dev})")
    value = torch.tensor([float(rank + 1)], device=dev)
    dist.all_reduce(value, op=dist.ReduceOp.SUM, group=group)
    return dict(rank=rank, world_size=world_size, host=socket.gethostname(), pid=os.getpid(),
                backend=backend, device=str(dev), all_reduce_sum=value.item())


def expected_sum(world_size: int) -> float:
    """What the all-reduce must give: 1 + 2 + ... + world_size."""
    return world_size * (world_size + 1) / 2


def main(argv=None):
    parser = experiment_parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    check_backend(parser, args.backend, args.world_size)
    results = run_experiment(hello_all_reduce, world_size=args.world_size,
                             backend=args.backend, timeout=args.timeout)
    if results is not None:  # the launcher, or rank 0 under torchrun
        n = len(results)
        print(f"all-reduce over {n} ranks gave {[r['all_reduce_sum'] for r in results]}; "
              f"expected {expected_sum(n):g} on every rank")
    return results


if __name__ == "__main__":
    run_main(main)
