"""Sharding the training state: FSDP2, measured against ZeRO's memory formulas.

Course article: model parallelism and memory; ZeRO (Rajbhandari et al. 2020) and PyTorch's
fully sharded data parallelism (``fully_shard``, FSDP2). With mixed-precision Adam a model of
Psi parameters needs 16 Psi bytes of training state (2 fp16 weights, 2 fp16 gradients, 12 of
fp32 master weights, momentum and variance). Data parallelism copies all of it to every rank;
ZeRO shards it over the p data-parallel ranks, stage by stage
(``cost_models.zero_bytes_per_rank``); FSDP2 is ZeRO stage 3.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from course_lib.overlap import all_reduce_as_one_bucket
from course_lib.runtime.devices import device
from course_lib.training import check_split, step_loop


def fsdp_parameter_bytes(model_fn, group=None, example=None) -> dict:
    """On every rank of ``group``: wrap a fresh model with ``fully_shard`` (on a mesh of the
    group's ranks, on the rank's device) and count the parameter bytes this rank holds, against
    the whole model's bytes. Also runs one forward and backward on ``example`` (default: 4 random
    rows, where the model's first layer is a ``Linear``), to show the sharded model still
    trains."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    dev = device(group)
    mesh = DeviceMesh.from_group(group or dist.group.WORLD, dev.type)
    model = model_fn().to(dev)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if example is None:
        if not isinstance(first := next(model.children(), None), torch.nn.Linear):
            raise ValueError("give example=, an input batch for the model: its first layer is "
                             "not a Linear to read the input's width from")
        example = torch.randn(4, first.in_features)
    for layer in model.children():  # shard layer by layer (unsharded only while it computes)
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    model(example.to(dev)).sum().backward()
    n = dist.get_world_size(group)
    # each gradient is sharded like its parameter: FSDP2 cuts dim 0, ceil(rows / N) rows here
    grads_sharded = all(p.grad.to_local().shape == p.to_local().shape
                        and p.to_local().shape[0] <= -(-p.shape[0] // n)
                        for p in model.parameters() if p.grad is not None)  # None: frozen
    return dict(rank=dist.get_rank(group), local_bytes=local, total_bytes=total,
                grads_sharded=grads_sharded)


def local_bytes(tensors) -> int:
    """Bytes this rank holds of ``tensors``: a DTensor's local shard, a plain tensor whole
    (``None`` entries, such as a missing gradient, count nothing)."""
    return sum((t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size()
               for t in tensors if t is not None)


def fully_shard_blocks(model, mesh, reshard_after_forward: bool = True, mp_policy=None,
                       keep_whole=()):
    """FSDP2's usual wrapping: every child that holds parameters (a transformer's blocks, an
    MLP's layers) is its own unit -- gathered just before it computes, freed after -- then the
    root for whatever is left (embeddings, the head). ``mp_policy``: FSDP2's
    ``MixedPrecisionPolicy`` (e.g. bf16 parameters for compute, float32 gradient reductions);
    None: every unit in its parameters' dtype. ``keep_whole``: module types (e.g.
    ``torch.nn.LayerNorm``) whose small parameters stay whole on every rank, in their own dtype
    (FSDP2's ``ignored_params``); FSDP does not reduce their gradients: average them yourself
    (:func:`train_fsdp` does)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kept = whole_parameters(model, keep_whole)
    options = dict(mesh=mesh, reshard_after_forward=reshard_after_forward,
                   mp_policy=mp_policy or MixedPrecisionPolicy())
    children = list(model.blocks) if hasattr(model, "blocks") else list(model.children())
    for unit in [c for c in children if any(True for _ in c.parameters())] + [model]:
        fully_shard(unit, **options, ignored_params={p for p in unit.parameters() if p in kept}
                    or None)
    return model


def whole_parameters(model, types) -> set:
    """The parameters of ``model``'s modules of the given ``types`` (a tuple; () for none)."""
    return {p for m in model.modules() if isinstance(m, tuple(types)) for p in m.parameters()}


def train_fsdp(model_fn, x, y, global_batch: int, steps: int, lr: float = 1e-2, seed: int = 0,
               reshard_after_forward: bool = True, group=None, keep_whole=()) -> dict:
    """Adam on a model sharded with FSDP2 (``fully_shard``: ZeRO stage 3) over ``group``; each
    step every rank takes every world_size-th row of the step's global batch. Returns this
    rank's ``losses`` and ``seconds`` per step, the full final ``params`` (gathered), and the
    bytes this rank held of parameters, gradients and optimizer state (``state``, as
    train_gpt names it) against the whole model's (``unsharded``). ``keep_whole``: module
    types left whole on every rank (:func:`fully_shard_blocks`); their gradients are averaged
    after backward in one all-reduce."""
    from torch.distributed.device_mesh import DeviceMesh

    dev = device(group)
    check_split(global_batch, dist.get_world_size(group))  # before the model is sharded
    mesh = DeviceMesh.from_group(group or dist.group.WORLD, dev.type)
    # the head's output is a view (a linear layer on 3-d input); nothing here changes it in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
    model = fully_shard_blocks(model_fn().to(dev), mesh, reshard_after_forward,
                               keep_whole=keep_whole)
    kept = [p for p in model.parameters() if p in whole_parameters(model, keep_whole)]
    opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
    seconds = []  # FSDP2 reduce-scatters each unit's gradients in backward, averaged
    sync = (lambda: all_reduce_as_one_bucket(kept, group)) if kept else None
    losses = step_loop(model, opt, x, y, global_batch, steps, sync, seed, group,
                       on_step=lambda step, took: seconds.append(took))

    params = list(model.parameters())
    held = dict(params=local_bytes(params), grads=local_bytes(p.grad for p in params),
                optimizer=local_bytes(t for s in opt.state.values() for k, t in s.items()
                                      if k != "step"))
    whole = sum(p.numel() for p in params) * params[0].element_size()
    full = torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).reshape(-1)
                      for p in params])
    return dict(losses=losses, params=full, state=held, seconds=seconds,
                unsharded=dict(params=whole, grads=whole, optimizer=2 * whole))
