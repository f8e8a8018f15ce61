"""Sharding the training state: FSDP2, measured against ZeRO's memory formulas.

Course article: model parallelism and memory; ZeRO (Rajbhandari et al. 2020) and PyTorch's
fully sharded data parallelism (``fully_shard``, FSDP2). With mixed-precision Adam a model of
Psi parameters needs 16 Psi bytes of training state (2 fp16 weights, 2 fp16 gradients, 12 of
fp32 master weights, momentum and variance). Data parallelism copies all of it to every rank;
ZeRO shards it over the p data-parallel ranks, stage by stage
(``cost_models.zero_bytes_per_rank``); FSDP2 is ZeRO stage 3.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.runtime.devices import device


def fsdp_parameter_bytes(model_fn, group=None) -> dict:
    """On every rank of ``group``: wrap a fresh model with ``fully_shard`` (on a mesh of the
    group's ranks, on the rank's device) and count the parameter bytes this rank holds, against
    the whole model's bytes. Also runs one forward and backward, to show the sharded model still
    trains."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    dev = device(group)
    mesh = DeviceMesh.from_group(group or dist.group.WORLD, dev.type)
    model = model_fn().to(dev)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for layer in model:  # shard layer by layer (each unsharded only while it computes), then all
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    x = torch.randn(4, model[0].in_features, device=dev)
    model(x).sum().backward()
    n = dist.get_world_size(group)
    # each gradient is sharded like its parameter: at most ceil(numel / N) entries here
    grads_sharded = all(p.grad.to_local().numel() <= -(-p.numel() // n)
                        for p in model.parameters())
    return dict(rank=dist.get_rank(group), local_bytes=local, total_bytes=total,
                grads_sharded=grads_sharded)
