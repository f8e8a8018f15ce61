"""Tensor parallelism: the Megatron-LM MLP, split across ranks inside each layer.

Course article: model parallelism; Megatron-LM (Shoeybi et al. 2019). The MLP Y = GeLU(X A) B
is split so that no communication is needed between its two matrix products: A by columns
(each rank computes a slice of the hidden units), B by rows (each rank's slice of hidden units
gives a partial output). Two operators glue it together:

* f: identity in the forward pass, all-reduce of the gradient in the backward pass;
* g: all-reduce in the forward pass, identity in the backward pass.

One all-reduce per MLP forward (g), one per backward (f) (``cost_models.megatron_all_reduces``).
In PyTorch's convention Z = X W^T, so "columns of A" are rows of ``fc1.weight`` and "rows of B"
are columns of ``fc2.weight``. The unsplit block is ``models.feed_forward``. Every function
that runs on ranks takes ``group`` (default: all ranks) and computes on the rank's device.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.runtime.devices import device


class _F(torch.autograd.Function):
    """f: forward identity, backward all-reduce."""

    @staticmethod
    def forward(ctx, x, counter, group):
        ctx.counter, ctx.group = counter, group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        ctx.counter["backward"] += 1
        return grad, None, None


class _G(torch.autograd.Function):
    """g: forward all-reduce, backward identity."""

    @staticmethod
    def forward(ctx, x, counter, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        counter["forward"] += 1
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def f_operator(x, counter: dict, group=None):
    """Identity now; all-reduce the gradient over ``group`` (default: all ranks) on the way
    back, counted in counter["backward"]."""
    return _F.apply(x, counter, group)


def g_operator(x, counter: dict, group=None):
    """All-reduce over ``group`` now (counted in counter["forward"]); identity on the way
    back."""
    return _G.apply(x, counter, group)


def new_counter() -> dict:
    return {"forward": 0, "backward": 0}


def shard_mlp(model, rank: int, world_size: int) -> dict:
    """This rank's pieces of the unsplit MLP: a block of fc1's rows (columns of A) with its bias
    slice, the matching block of fc2's columns (rows of B), and fc2's bias (added once)."""
    hidden = model.fc1.out_features
    if hidden % world_size:
        raise ValueError(f"{hidden} hidden units do not split evenly over {world_size} ranks")
    rows = slice(rank * hidden // world_size, (rank + 1) * hidden // world_size)
    take = lambda t: torch.nn.Parameter(t.detach()[rows].clone())  # noqa: E731
    return dict(w1=take(model.fc1.weight), b1=take(model.fc1.bias),
                w2=torch.nn.Parameter(model.fc2.weight.detach()[:, rows].clone()),
                b2=torch.nn.Parameter(model.fc2.bias.detach().clone()))


def megatron_mlp(x, shard: dict, counter: dict, group=None):
    """Y = g( GeLU( f(X) W1_r^T + b1_r ) W2_r^T ) + b2 on every rank r of ``group``."""
    x = f_operator(x, counter, group)  # the input's gradient is summed on the way back
    hidden = torch.nn.functional.gelu(x @ shard["w1"].T + shard["b1"])  # this rank's units
    partial = hidden @ shard["w2"].T  # a partial sum of the output
    return g_operator(partial, counter, group) + shard["b2"]


def run_megatron_mlp(model, x, target, group=None) -> dict:
    """On every rank of ``group``: forward and backward of the split MLP on the whole batch x
    (replicated), on the rank's device.

    Returns the output, the gradients of this rank's shard and of x, and how many all-reduces
    the forward and the backward pass made.
    """
    dev = device(group)
    shard = shard_mlp(model.to(dev), dist.get_rank(group), dist.get_world_size(group))
    counter = new_counter()
    x = x.to(dev, copy=True).requires_grad_(True)
    out = megatron_mlp(x, shard, counter, group)
    torch.nn.functional.mse_loss(out, target.to(dev)).backward()
    return dict(out=out.detach(), x_grad=x.grad, counter=counter,
                grads={k: p.grad for k, p in shard.items()})


def run_dtensor_mlp(model, x, group=None) -> dict:
    """The same split with DTensor: fc1 ColwiseParallel, fc2 RowwiseParallel on a 1-D mesh of
    ``group``'s ranks. Returns the output and the shape of this rank's fc1 and fc2 shards."""
    import copy

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    dev = device(group)
    mesh = DeviceMesh.from_group(group or dist.group.WORLD, dev.type)
    split = parallelize_module(copy.deepcopy(model).to(dev), mesh,
                               {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    out = split(x.to(dev))
    out = out.wait() if hasattr(out, "wait") else out  # an async collective's result
    return dict(out=out.detach(), fc1_shard=tuple(split.fc1.weight.to_local().shape),
                fc2_shard=tuple(split.fc2.weight.to_local().shape))


def run_hybrid_data_tensor(model, x, target, mesh=None) -> dict:
    """Data x tensor parallelism on a 2-D device mesh with dimensions ("data", "tensor").

    Ranks in the same row of the mesh form a tensor-parallel group that splits the MLP as
    Megatron does; the rows are data-parallel replicas, each with its share of the batch, and
    their shard gradients are averaged over the column (data-parallel) group. ``mesh=None``:
    a 2 x 2 mesh of the whole job (4 processes). A mesh makes new groups, which every rank of
    the job must create together, so a bigger job builds its mesh on all its ranks and passes
    it (``init_device_mesh(..., mesh_dim_names=("data", "tensor"))``): the 2-D counterpart of
    the ``group`` argument of the other functions.
    """
    from torch.distributed.device_mesh import init_device_mesh

    dev = device()
    if mesh is None:
        mesh = init_device_mesh(dev.type, (2, 2), mesh_dim_names=("data", "tensor"))
    data, tensor = mesh["data"].size(), mesh["tensor"].size()
    dp_group, tp_group = mesh.get_group("data"), mesh.get_group("tensor")
    dp_rank, tp_rank = mesh.get_local_rank("data"), mesh.get_local_rank("tensor")
    shard = shard_mlp(model.to(dev), tp_rank, tensor)
    counter = new_counter()
    mine = x.to(dev).tensor_split(data)[dp_rank]
    out = megatron_mlp(mine, shard, counter, tp_group)
    loss = torch.nn.functional.mse_loss(out, target.to(dev).tensor_split(data)[dp_rank])
    loss.backward()
    for p in shard.values():  # data parallelism: average the replicas' gradients
        dist.all_reduce(p.grad, group=dp_group)
        p.grad /= data
    return dict(dp_rank=dp_rank, tp_rank=tp_rank, out=out.detach(), counter=counter,
                grads={k: p.grad for k, p in shard.items()})
