"""Sharding the training state: ZeRO's memory formulas and FSDP2, measured.

Course article: model parallelism and memory; ZeRO (Rajbhandari et al. 2020) and PyTorch's
fully sharded data parallelism (``fully_shard``, FSDP2). With mixed-precision Adam a model of
Psi parameters needs 16 Psi bytes of training state (2 fp16 weights, 2 fp16 gradients, 12 of
fp32 master weights, momentum and variance). Data parallelism copies all of it to every rank;
ZeRO shards it over the N_d data-parallel ranks, stage by stage.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

ZERO_STAGES = (0, 1, 2, 3)


def zero_bytes_per_rank(psi: float, n_d: int, stage: int) -> float:
    """Bytes of training state per rank: baseline 16 Psi; stage 1 shards the optimizer state
    (4 Psi + 12 Psi / N_d); stage 2 also the gradients (2 Psi + 14 Psi / N_d); stage 3 also
    the parameters (16 Psi / N_d)."""
    if stage not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage must be one of {ZERO_STAGES}, got {stage!r}")
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / n_d, 2: 2 * psi + 14 * psi / n_d,
            3: 16 * psi / n_d}[stage]


def fsdp_parameter_bytes(model_fn) -> dict:
    """On every rank: wrap a fresh model with ``fully_shard`` and count the parameter bytes this
    rank holds, against the whole model's bytes. Also runs one forward and backward, to show
    the sharded model still trains."""
    from torch.distributed.fsdp import fully_shard

    model = model_fn()
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for layer in model:  # shard layer by layer (each unsharded only while it computes), then all
        if any(True for _ in layer.parameters()):
            fully_shard(layer)
    fully_shard(model)
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    x = torch.randn(4, model[0].in_features)
    model(x).sum().backward()
    n = dist.get_world_size()
    # each gradient is sharded like its parameter: at most ceil(numel / N) entries here
    grads_sharded = all(p.grad.to_local().numel() <= -(-p.numel() // n)
                        for p in model.parameters())
    return dict(rank=dist.get_rank(), local_bytes=local, total_bytes=total,
                grads_sharded=grads_sharded)
