"""Data parallelism: from scratch (broadcast, all-reduce the gradients) to DDP.

Slides "Parallel computing for machine learning", part 3: a small CNN trained with a mirrored
(all-reduce) strategy, per-replica batch b, global batch b x m; and the DDP paper's mechanics (Li
et al., VLDB 2020: gradient buckets, overlap, ``no_sync`` for accumulation). Every training
function runs on every rank of ``group`` (default: all ranks), keeps its replica and batches on
the rank's device, and returns the final parameters to compare with one process.

Lesson 4's check, the digits CNN trained by hand, with DDP and with DDP accumulating two local
batches, each against one process on the global batch::

    python -m course_lib.data_parallel --world-size 2 [--epochs 2] [--local-batch 16]
    torchrun --standalone --nproc-per-node 2 -m course_lib.data_parallel
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from course_lib.runtime.devices import device
from course_lib.runtime.emulation import catch_up, paced_step
from course_lib.runtime.timing import synchronize
from course_lib.runtime.torchrun import run_command, run_main
from course_lib.training import check_steps, check_whole, loss_fn, parameters_to_average


def sampler_global_batches(n: int, world_size: int, local_batch: int, seed: int = 0,
                           epoch: int = 0) -> list[torch.Tensor]:
    """The global batches that ``DistributedSampler(shuffle=True, drop_last=True)`` and a
    DataLoader of ``local_batch`` on each of ``world_size`` ranks feed in one epoch. The sampler
    permutes all indices with seed + epoch and gives rank r every world_size-th one starting at
    r; so step t of all ranks together covers one contiguous block of the permutation: exactly
    what one process would use with the global batch."""
    steps = check_steps(n, world_size, local_batch)  # at least one, or a clear error
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
    return [perm[t * world_size * local_batch:(t + 1) * world_size * local_batch]
            for t in range(steps)]


def parameters_vector(model) -> torch.Tensor:
    """All parameters as one flat vector (to compare two models)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def train_one_process(model, x, y, global_batches, lr: float):
    """The baseline: plain SGD on one process, one step per global batch (the rows of each, in
    the order the ranks' samplers dealt them)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for idx in global_batches:
        opt.zero_grad()
        loss = loss_fn(model, x[idx], y[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def average_gradients(model, group=None, find_unused: bool = False) -> None:
    """The heart of data parallelism: sum every gradient over the ranks, divide by their
    number. Afterwards every rank holds the gradient of the mean loss over the global batch.
    Which gradients: :func:`course_lib.training.parameters_to_average` (frozen ones never; one
    without a gradient is refused, or with ``find_unused`` left out where no rank used it)."""
    world_size = dist.get_world_size(group)
    params = parameters_to_average(model, group, find_unused)
    for p in params:
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
    for p in params:  # then divide: gloo's all-reduces run faster back to back (lesson 10)
        p.grad /= world_size


def train_from_scratch(model_fn, x, y, local_batch: int, lr: float, epochs: int = 1,
                       seed: int = 0, group=None, find_unused: bool = False) -> dict:
    """Data parallelism by hand: broadcast rank 0's initial weights, then per step: forward and
    backward on this rank's part of the global batch, average the gradients, step.
    ``find_unused``: as :func:`average_gradients`."""
    rank, world_size, dev = dist.get_rank(group), dist.get_world_size(group), device(group)
    model = model_fn().to(dev)
    x, y = x.to(dev), y.to(dev)
    for p in model.parameters():  # every replica starts from rank 0's weights
        dist.broadcast(p.data, group=group, group_src=0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for epoch in range(check_whole("epochs", epochs, least=0)):
        for idx in sampler_global_batches(len(y), world_size, local_batch, seed, epoch):
            mine = idx[rank::world_size].to(dev)  # this rank's share, as DistributedSampler deals
            opt.zero_grad()
            loss = loss_fn(model, x[mine], y[mine])
            loss.backward()
            average_gradients(model, group, find_unused)
            opt.step()
            losses.append(loss.item())
    return dict(params=parameters_vector(model), losses=losses)


def ddp_model(model, group=None, **options) -> DDP:
    """``model`` on this rank's device, wrapped in DistributedDataParallel over ``group``."""
    dev = device(group)
    ids = [dev.index] if dev.type == "cuda" else None
    return DDP(model.to(dev), device_ids=ids, process_group=group, **options)


def ddp_loader(x, y, local_batch: int, seed: int = 0, group=None):
    """A DataLoader over this rank's share: DistributedSampler deals the indices out."""
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(group),
                                 rank=dist.get_rank(group), shuffle=True, seed=seed,
                                 drop_last=True)
    return DataLoader(dataset, batch_size=local_batch, sampler=sampler, drop_last=True), sampler


def train_ddp(model_fn, x, y, local_batch: int, lr: float, epochs: int = 1, seed: int = 0,
              accumulate: int = 1, comm_hook=None, bucket_cap_mb: float | None = None,
              group=None, find_unused: bool = False) -> dict:
    """The same with DistributedDataParallel and DistributedSampler.

    ``accumulate`` > 1 sums gradients over that many local batches inside ``no_sync`` (no
    all-reduce) and synchronises on the last one: one optimizer step for a batch that many times
    larger. ``comm_hook`` is registered on the model (e.g. fp16 compression). ``find_unused``:
    DDP's ``find_unused_parameters`` (a parameter the loss does not use is then left out).
    """
    check_steps(len(y), dist.get_world_size(group), local_batch, accumulate)
    options = {"find_unused_parameters": find_unused} | (
        {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb})
    model = ddp_model(model_fn(), group, **options)  # broadcasts rank 0's weights itself
    dev = device(group)
    if comm_hook is not None:
        model.register_comm_hook(group, comm_hook)  # the hook gets the group as its state
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loader, sampler = ddp_loader(x, y, local_batch, seed, group)
    losses = []
    for epoch in range(check_whole("epochs", epochs, least=0)):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        batches = [(xb.to(dev), yb.to(dev)) for xb, yb in loader]
        for start in range(0, len(batches) - accumulate + 1, accumulate):
            opt.zero_grad()
            for i, (xb, yb) in enumerate(batches[start:start + accumulate]):
                last = i == accumulate - 1
                context = model.no_sync() if not last else contextlib.nullcontext()
                with context:  # no all-reduce until the last micro-batch
                    loss = loss_fn(model, xb, yb) / accumulate
                    loss.backward()
            opt.step()
            losses.append(loss.item() * accumulate)
    return dict(params=parameters_vector(model.module), losses=losses, model=model.module)


def time_ddp_steps(model_fn, x, y, local_batch: int, steps: int = 10, warmup: int = 2,
                   threads: int = 1, bucket_cap_mb: float | None = None, group=None,
                   emulated=None) -> dict:
    """Per-step wall times of DDP training on every rank, ``with_sync`` (forward, backward with
    the all-reduce overlapped, optimizer) and ``no_sync`` (inside ``no_sync``: the difference is
    what synchronising adds), alternating step by step so that a machine getting slower shows up
    in neither; ``threads`` CPU threads a rank. ``emulated``: at an emulated device's pace."""
    check_whole("steps", steps), check_whole("local_batch", local_batch)
    counts = emulated is not None and emulated.pieces is None  # its first step is not paced
    check_whole("warmup" + " (an emulated device's first step counts FLOPs, unpaced)" * counts,
                warmup, least=int(counts))
    torch.set_num_threads(threads)
    options = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    model = ddp_model(model_fn(), group, **options)
    if emulated is not None:
        emulated.pace_gradients(model)
    dev = device(group)
    x, y = x.to(dev), y.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(dist.get_rank(group))
    out = {"with_sync": [], "no_sync": []}
    for step in range(warmup + steps):
        for mode, times in out.items():
            idx = torch.randint(0, len(y), (local_batch,), generator=g).to(dev)
            dist.barrier(group=group)
            synchronize(dev)
            start = time.perf_counter()
            with paced_step(emulated):
                opt.zero_grad()
                context = model.no_sync() if mode == "no_sync" else contextlib.nullcontext()
                with context:
                    loss = loss_fn(model, x[idx], y[idx])
                    catch_up(emulated)
                    loss.backward()
                    catch_up(emulated)
                opt.step()
                catch_up(emulated)
            synchronize(dev)
            if step >= warmup:
                times.append(time.perf_counter() - start)
    return out


def compression_hook(dtype, log: list | None = None):
    """A DDP communication hook that all-reduces each gradient bucket in ``dtype`` (e.g.
    torch.float16; None: in the gradients' own dtype) and records the bytes it sends; its state
    is the process group (None: all ranks). What torch's ``fp16_compress_hook`` does, written
    out: cast the bucket down, divide by the world size (the sum overflows less), all-reduce, cast
    back."""
    if dtype is not None and not getattr(dtype, "is_floating_point", False):
        raise ValueError(f"compression_hook sends the gradients in a floating-point dtype (e.g. "
                         f"torch.float16 or torch.bfloat16) or None (as they are), got {dtype!r}")

    def hook(group, bucket):
        buffer = bucket.buffer()
        message = buffer if dtype is None else buffer.to(dtype)
        message.div_(dist.get_world_size(group))
        if log is not None:
            log.append(message.numel() * message.element_size())
        future = dist.all_reduce(message, group=group, async_op=True).get_future()

        def unpack(fut):
            if message is not buffer:  # the sum is in message, in place: back into the bucket
                buffer.copy_(message)
            return buffer

        return future.then(unpack)

    return hook


def linear_scaling_lr(base_lr: float, base_batch: int, batch: int) -> float:
    """Goyal et al. 2017: multiply the batch by k, multiply the learning rate by k."""
    return base_lr * check_whole("batch", batch) / check_whole("base_batch", base_batch)


def warmup_lr(step: int, target_lr: float, warmup_steps: int, start_lr: float) -> float:
    """Gradual warm-up: rise linearly from ``start_lr`` to ``target_lr`` over ``warmup_steps``,
    then stay at ``target_lr``."""
    done = check_whole("step", step, least=0) >= check_whole("warmup_steps", warmup_steps, least=0)
    return target_lr if done else start_lr + (target_lr - start_lr) * step / warmup_steps


def lesson_setup(samples: int = 256, width: int = 4, seed: int = 3):
    """Lesson 4's check, as a command (:func:`main`): its small problem, the first ``samples``
    training digits in float64 and a float64 digits CNN of ``width`` channels (the same weights
    for the same seed)."""
    from course_lib.data import load_digits
    from course_lib.models import digits_cnn
    check_whole("samples", samples)
    digits = load_digits(images=True)
    return (lambda: digits_cnn(seed=seed, width=width, dtype=torch.float64),
            digits.x_train[:samples].double(), digits.y_train[:samples])


def three_ways(local_batch: int = 16, lr: float = 0.1, epochs: int = 2, samples: int = 256,
               width: int = 4, seed: int = 3, group=None) -> dict:
    """Run on every rank of ``group``: lesson 4's CNN trained from scratch, with DDP and with DDP
    accumulating 2 local batches (one epoch). Returns each one's final parameters."""
    model_fn, x, y = lesson_setup(samples, width, seed)
    return {"from scratch": train_from_scratch(model_fn, x, y, local_batch, lr, epochs,
                                               group=group)["params"],
            "DDP": train_ddp(model_fn, x, y, local_batch, lr, epochs, group=group)["params"],
            "DDP, accumulate 2": train_ddp(model_fn, x, y, local_batch, lr, accumulate=2,
                                           group=group)["params"]}


def one_process(model_fn, x, y, world_size: int, local_batch: int, lr: float, epochs: int):
    """The same steps on one process, global batch world_size x local_batch: the parameters."""
    model = model_fn()
    for epoch in range(check_whole("epochs", epochs, least=0)):
        batches = sampler_global_batches(len(y), world_size, local_batch, epoch=epoch)
        train_one_process(model, x, y, batches, lr)
    return parameters_vector(model)


@torch.no_grad()
def loss_of(model_fn, params, x, y) -> float:
    """The mean loss on (x, y) of ``model_fn``'s network with the parameters ``params``."""
    model = model_fn()
    torch.nn.utils.vector_to_parameters(params.to(x.device), model.parameters())
    return loss_fn(model, x, y).item()


def main(argv=None):
    args, results = run_command(
        three_ways, "Lesson 4: the digits CNN trained with data parallelism, against one "
        "process on the global batch",
        (("--local-batch", int, 16), ("--lr", float, 0.1), ("--epochs", int, 2),
         ("--samples", int, 256), ("--width", int, 4), ("--seed", int, 3)), argv)
    if results is not None:  # the launcher, or rank 0 under torchrun
        p, b = len(results), args.local_batch
        model_fn, x, y = lesson_setup(args.samples, args.width, args.seed)
        print(f"p = {p} ranks, local batch {b}, {args.samples} digits, SGD with lr {args.lr}")
        for name, (batch, epochs) in {"from scratch": (b, args.epochs), "DDP": (b, args.epochs),
                                      "DDP, accumulate 2": (2 * b, 1)}.items():
            want = one_process(model_fn, x, y, p, batch, args.lr, epochs)
            gap = max((r[name] - want).abs().max().item() for r in results)
            print(f"{name:>18}: final loss {loss_of(model_fn, results[0][name], x, y):.10f} "
                  f"(one process {loss_of(model_fn, want, x, y):.10f}), equal to one process "
                  f"on the global batch of {p * batch} to {gap:.1e} (max |parameters - one "
                  f"process's|)")
    return results


if __name__ == "__main__":
    run_main(main)
