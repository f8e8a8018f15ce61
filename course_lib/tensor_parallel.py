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
:class:`ParallelBlock` applies f and g to a whole GPT block (attention's heads split too), as
:mod:`course_lib.train_gpt` runs it.

Lesson 5's Megatron MLP, by hand and with DTensor, against the unsplit block::

    python -m course_lib.tensor_parallel --world-size 2 [--d-model 16 --d-hidden 64]
    torchrun --standalone --nproc-per-node 2 -m course_lib.tensor_parallel
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.models import feed_forward
from course_lib.runtime.devices import device
from course_lib.runtime.torchrun import run_command, run_main
from course_lib.training import check_split, is_whole


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
    back, counted in counter["backward"]. In a group of one rank, the identity both ways."""
    return x if dist.get_world_size(group) == 1 else _F.apply(x, counter, group)


def g_operator(x, counter: dict, group=None):
    """All-reduce over ``group`` now (counted in counter["forward"]); identity on the way
    back. In a group of one rank, the identity both ways."""
    return x if dist.get_world_size(group) == 1 else _G.apply(x, counter, group)


def column_parallel(x, weight, bias, counter: dict, group=None):
    """A linear layer split by its outputs (columns of A): f, then this rank's output units
    (``weight``: its rows of the layer's weight, ``bias``: their biases). No communication
    forward; backward sums the input's gradient over ``group``."""
    return F.linear(f_operator(x, counter, group), weight, bias)


def row_parallel(x, weight, bias, counter: dict, group=None):
    """A linear layer split by its inputs (rows of B): this rank's input units (``weight``:
    its columns of the layer's weight) give a partial output, g sums the partial outputs over
    ``group``, and the bias (whole on every rank) is added once, after g."""
    out = g_operator(x @ weight.T, counter, group)
    return out if bias is None else out + bias


def new_counter() -> dict:
    return {"forward": 0, "backward": 0}


def check_rank(rank: int, world_size: int) -> None:
    """Refuse, naming both, a rank that is not one of ``world_size`` ranks."""
    if not (is_whole(world_size) and is_whole(rank) and 0 <= rank < world_size):
        raise ValueError(f"need world_size >= 1 and rank in 0..world_size - 1, got rank {rank!r} "
                         f"of {world_size!r}")


def part(tensor, index):
    """A new parameter holding ``tensor[index]``, frozen where ``tensor`` is; None stays None."""
    if tensor is None:
        return None
    return torch.nn.Parameter(tensor.detach()[index].clone(), requires_grad=tensor.requires_grad)


def shard_mlp(model, rank: int, world_size: int) -> dict:
    """This rank's pieces of the unsplit MLP: a block of fc1's rows (columns of A) with its bias
    slice, the matching block of fc2's columns (rows of B), and fc2's bias (added once)."""
    hidden = model.fc1.out_features
    check_rank(rank, world_size)
    if hidden % world_size:
        raise ValueError(f"{hidden} hidden units do not split evenly over {world_size} ranks")
    rows = slice(rank * hidden // world_size, (rank + 1) * hidden // world_size)
    return dict(w1=part(model.fc1.weight, rows), b1=part(model.fc1.bias, rows),
                w2=part(model.fc2.weight, (slice(None), rows)), b2=part(model.fc2.bias, ...))


def shard_gradients(shard: dict) -> dict:
    """The gradient of each piece of a shard: None for a frozen or missing one, as in torch."""
    return {k: None if p is None else p.grad for k, p in shard.items()}


def megatron_mlp(x, shard: dict, counter: dict, group=None):
    """Y = g( GeLU( f(X) W1_r^T + b1_r ) W2_r^T ) + b2 on every rank r of ``group``: fc1 split
    by columns (f inside), fc2 by rows (g inside)."""
    hidden = F.gelu(column_parallel(x, shard["w1"], shard["b1"], counter, group))  # my units
    return row_parallel(hidden, shard["w2"], shard["b2"], counter, group)  # partials, summed


def causal_attention(q, k, v):
    """Causal attention of a whole sequence: PyTorch's ``scaled_dot_product_attention``."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class ParallelBlock(torch.nn.Module):
    """This rank's part of one :class:`course_lib.models.Block` over a tensor-parallel group of
    ``tp`` ranks (Megatron-LM): attention's qkv split by columns (the ``rank``-th share of the
    heads' q, k and v) and its projection by rows; the MLP is :func:`megatron_mlp` on this
    rank's :func:`shard_mlp`. LayerNorms and the output biases are whole on every rank.
    ``attend(q, k, v)`` computes attention over (batch, heads, tokens, head width): by default
    :func:`causal_attention`; train_gpt's context parallelism gives ring attention. A block
    whose MLP is experts (``block.mlp``, lesson 13) keeps them whole here as ``experts``: they
    are not split over tensor-parallel ranks (expert parallelism spreads them)."""

    def __init__(self, block, rank: int, tp: int, group=None, attend=causal_attention):
        super().__init__()
        self.attend = attend
        d = block.norm1.normalized_shape[0]
        check_rank(rank, tp)
        if block.heads % tp:
            raise ValueError(f"{block.heads} heads do not split evenly over {tp} ranks")
        self.group, self.heads = group, block.heads // tp
        self.counter = new_counter()
        self.norm1, self.norm2 = block.norm1, block.norm2
        mine = slice(rank * d // tp, (rank + 1) * d // tp)  # this rank's heads' features
        rows = torch.cat([torch.arange(k * d + mine.start, k * d + mine.stop) for k in range(3)])
        self.qkv_w, self.qkv_b = part(block.qkv.weight, rows), part(block.qkv.bias, rows)
        self.proj_w, self.proj_b = part(block.proj.weight, (slice(None), mine)), part(
            block.proj.bias, ...)
        self.experts = block.mlp
        if self.experts is not None and tp > 1:
            raise ValueError("tensor parallelism splits a dense MLP: a block of experts is not "
                             "split over tensor-parallel ranks here; use tp = 1 with experts "
                             "(expert parallelism spreads them over data-parallel ranks)")
        if self.experts is None:
            self.mlp = torch.nn.ParameterDict(shard_mlp(block, rank, tp))

    def forward(self, x):
        b, t, _ = x.shape
        qkv = column_parallel(self.norm1(x), self.qkv_w, self.qkv_b, self.counter, self.group)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in qkv.chunk(3, dim=2))
        a = self.attend(q, k, v).transpose(1, 2)
        x = x + row_parallel(a.reshape(b, t, -1), self.proj_w, self.proj_b, self.counter,
                             self.group)
        if self.experts is not None:
            return x + self.experts(self.norm2(x))
        return x + megatron_mlp(self.norm2(x), self.mlp, self.counter, self.group)


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
    return dict(out=out.detach(), x_grad=x.grad, counter=counter, grads=shard_gradients(shard))


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
    check_split(len(x), data)  # equal shares: the replicas' mean losses then weigh rows alike
    dp_group, tp_group = mesh.get_group("data"), mesh.get_group("tensor")
    dp_rank, tp_rank = mesh.get_local_rank("data"), mesh.get_local_rank("tensor")
    shard = shard_mlp(model.to(dev), tp_rank, tensor)
    counter = new_counter()
    mine = x.to(dev).tensor_split(data)[dp_rank]
    out = megatron_mlp(mine, shard, counter, tp_group)
    loss = torch.nn.functional.mse_loss(out, target.to(dev).tensor_split(data)[dp_rank])
    loss.backward()
    for grad in shard_gradients(shard).values():  # data parallelism: average the replicas'
        if grad is not None:
            dist.all_reduce(grad, group=dp_group)
            grad /= data
    return dict(dp_rank=dp_rank, tp_rank=tp_rank, out=out.detach(), counter=counter,
                grads=shard_gradients(shard))


# -- lesson 5's Megatron MLP, as a command ---------------------------------------------------------


def lesson_setup(d_model: int = 16, d_hidden: int = 64, batch: int = 6, seed: int = 0):
    """The unsplit MLP block (float64) and a batch of inputs and targets for it."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, d_model, generator=g, dtype=torch.float64)
    target = torch.randn(batch, d_model, generator=g, dtype=torch.float64)
    return feed_forward(d_model, d_hidden, seed), x, target


def megatron_and_dtensor(d_model: int = 16, d_hidden: int = 64, batch: int = 6, seed: int = 0,
                         group=None) -> tuple[dict, dict]:
    """Run on every rank of ``group``: the lesson's MLP split by hand and by DTensor."""
    model, x, target = lesson_setup(d_model, d_hidden, batch, seed)
    return run_megatron_mlp(model, x, target, group), run_dtensor_mlp(model, x, group)


def main(argv=None):
    args, results = run_command(
        megatron_and_dtensor, "Lesson 5: the Megatron MLP split over ranks, by hand and with "
        "DTensor, against the unsplit block",
        (("--d-model", int, 16), ("--d-hidden", int, 64), ("--batch", int, 6),
         ("--seed", int, 0)), argv)
    kwargs = dict(d_model=args.d_model, d_hidden=args.d_hidden, batch=args.batch, seed=args.seed)
    if results is not None:  # the launcher, or rank 0 under torchrun
        model, x, target = lesson_setup(**kwargs)
        torch.nn.functional.mse_loss(model(x), target).backward()
        reference = model(x).detach()
        for rank, (ours, dtensor) in enumerate(results):
            h = args.d_hidden // len(results)  # this rank's hidden units: rows of fc1
            rows = model.fc1.weight.grad[rank * h:(rank + 1) * h]
            count = ours["counter"]
            print(f"rank {rank}: |ours - unsplit| = {(ours['out'] - reference).abs().max():.1e}, "
                  f"|DTensor - unsplit| = {(dtensor['out'] - reference).abs().max():.1e}, "
                  f"fc1 gradient gap {(ours['grads']['w1'] - rows).abs().max():.1e}, "
                  f"all-reduces forward/backward = {count['forward']}/{count['backward']}, "
                  f"DTensor shards fc1 {dtensor['fc1_shard']}, fc2 {dtensor['fc2_shard']}")
    return results


if __name__ == "__main__":
    run_main(main)
