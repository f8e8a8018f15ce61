"""Making data parallelism fast: start each all-reduce while the backward pass still runs.

Lecture: slides "Parallel computing for machine learning", part 3 (data parallelism: all-reduce
the gradients after backward), and the DDP paper (Li et al., VLDB 2020, section 3.2: gradient
bucketing and overlapping communication with computation). Three ways to synchronise one step:

* (a) :func:`all_reduce_after_backward`: lesson 4's -- backward, then every gradient's all-reduce;
* (b) :class:`PerParameterAllReduce`: a hook on each parameter starts an asynchronous all-reduce
  the moment its gradient is ready, so the last layers' gradients travel while the first
  layers' are still being computed; the step waits for all of them;
* (c) :class:`BucketedAllReduce`: the same, but gradients are packed into buckets of about
  ``bucket_mb`` megabytes and each full bucket goes as one message (fewer, larger messages: a
  latency alpha per message instead of per tensor) -- what DDP does.

Each leaves in every ``.grad`` the mean of the ranks' gradients, as one process on the global
batch would compute it. :func:`train` runs any of them (or DDP itself) on ``group``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.data_parallel import ddp_model, parameters_vector
from course_lib.runtime.devices import device

MB = 2**20
SYNCS = ("after backward", "per parameter", "buckets", "DDP")


def all_reduce_after_backward(model, group=None) -> None:
    """(a) After backward: sum every gradient over the ranks, divide by their number."""
    world_size = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad /= world_size


class PerParameterAllReduce:
    """(b) One asynchronous all-reduce per parameter, started by
    ``register_post_accumulate_grad_hook`` as soon as autograd has written its gradient.
    Call :meth:`wait` after ``backward()`` and before the optimizer step."""

    def __init__(self, model, group=None):
        self.group, self.world_size = group, dist.get_world_size(group)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.pending = []
        self.handles = [p.register_post_accumulate_grad_hook(self._ready) for p in self.params]

    def _ready(self, p):
        p.grad /= self.world_size  # divide first: the sum then is the mean, as DDP does
        self.pending.append((p, dist.all_reduce(p.grad, group=self.group, async_op=True)))

    def wait(self) -> None:
        started = {id(p) for p, _ in self.pending}
        for _, work in self.pending:
            work.wait()
        self.pending.clear()
        missing = [i for i, p in enumerate(self.params) if id(p) not in started]
        if missing:  # the other ranks may have sent them: say so rather than hang or diverge
            raise RuntimeError(f"rank {dist.get_rank()}: parameters {missing} got no gradient "
                               f"in this backward pass, so their all-reduce never started; use "
                               f"every parameter in the loss (or freeze it: requires_grad=False)")

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def assign_buckets(params, bucket_mb: float) -> list[list[int]]:
    """Parameter indices grouped into buckets of at least ``bucket_mb`` MB (the last may be
    smaller), in **reverse** order of ``params``: backward produces the last layer's gradients
    first, so the first bucket fills first (DDP's rule; it also keeps its first bucket small)."""
    if not bucket_mb > 0:
        raise ValueError(f"bucket_mb must be positive, got {bucket_mb}")
    buckets, current, size = [], [], 0
    for i in reversed(range(len(params))):
        current.append(i)
        size += params[i].numel() * params[i].element_size()
        if size >= bucket_mb * MB:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class BucketedAllReduce:
    """(c) Gradients packed into buckets (:func:`assign_buckets`); when a bucket's last gradient
    arrives, the bucket is flattened into one buffer and all-reduced asynchronously.
    :meth:`wait` waits for every bucket and copies the means back into ``.grad``."""

    def __init__(self, model, bucket_mb: float = 25.0, group=None):
        self.group, self.world_size = group, dist.get_world_size(group)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buckets = assign_buckets(self.params, bucket_mb)
        self.bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket}
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.ready = [0] * len(self.buckets)
        self.pending = []
        self.handles = [p.register_post_accumulate_grad_hook(self._ready) for p in self.params]

    def _ready(self, p):
        b = self.bucket_of[self.index[id(p)]]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):  # the bucket is full: send it
            grads = [self.params[i].grad for i in self.buckets[b]]
            buffer = torch.cat([g.reshape(-1) for g in grads]) / self.world_size
            work = dist.all_reduce(buffer, group=self.group, async_op=True)
            self.pending.append((b, buffer, work))

    def wait(self) -> None:
        for b, buffer, work in self.pending:
            work.wait()
            offset = 0
            for i in self.buckets[b]:  # unpack the mean into each gradient
                g = self.params[i].grad
                g.copy_(buffer[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        sent = {b for b, _, _ in self.pending}
        self.pending.clear()
        unsent = [b for b in range(len(self.buckets)) if b not in sent]
        self.ready = [0] * len(self.buckets)
        if unsent:
            raise RuntimeError(f"rank {dist.get_rank()}: buckets {unsent} never filled: some of "
                               f"their parameters got no gradient in this backward pass; use "
                               f"every parameter in the loss (or freeze it)")

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def synchronizer(model, sync: str, bucket_mb: float = 25.0, group=None):
    """A callable to run after ``backward()`` that leaves the mean gradient in ``.grad``, and
    the model to train (DDP's wrapper for "DDP"). ``sync`` is one of :data:`SYNCS`, or "none"
    (no communication: the local step, to measure what synchronising adds)."""
    if sync == "after backward":
        return model, lambda: all_reduce_after_backward(model, group)
    if sync == "per parameter":
        return model, PerParameterAllReduce(model, group).wait
    if sync == "buckets":
        return model, BucketedAllReduce(model, bucket_mb, group).wait
    if sync == "DDP":
        return ddp_model(model, group, bucket_cap_mb=bucket_mb), lambda: None
    if sync == "none":
        return model, lambda: None
    raise ValueError(f"sync must be one of {SYNCS} or 'none', got {sync!r}")


def loss_fn(model, x, y):
    """Mean cross-entropy; works for classifiers (logits (b, c)) and language models (logits
    (b, t, vocab), targets (b, t))."""
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.flatten(0, -2), y.flatten())


def global_batches(n: int, global_batch: int, steps: int, seed: int = 0) -> list[torch.Tensor]:
    """Row indices of each step's global batch: the same on every rank and in one process."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randperm(n, generator=g)[:global_batch] for _ in range(steps)]


def sgd_step(model, lr: float) -> None:
    """p <- p - lr * grad, for each parameter that has a gradient (a frozen one, or one no loss
    used, is left as it is: torch.optim.SGD's rule)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= lr * p.grad


def train(model_fn, x, y, global_batch: int, steps: int, lr: float, sync: str = "buckets",
          bucket_mb: float = 25.0, seed: int = 0, group=None) -> dict:
    """SGD with data parallelism synchronised by ``sync``: each step every rank takes every
    world_size-th row of the step's global batch (which must divide evenly). All replicas
    start from the same ``model_fn()``. Returns final ``params`` and this rank's ``losses``."""
    rank, world_size, dev = dist.get_rank(group), dist.get_world_size(group), device(group)
    if global_batch % world_size:
        raise ValueError(f"global_batch {global_batch} does not split evenly over {world_size} "
                         f"ranks; choose a multiple of {world_size}")
    model, wait = synchronizer(model_fn().to(dev), sync, bucket_mb, group)
    x, y = x.to(dev), y.to(dev)
    losses = []
    for idx in global_batches(len(y), global_batch, steps, seed):
        mine = idx[rank::world_size].to(dev)
        model.zero_grad(set_to_none=False)  # keep the .grad tensors: hooks write into them
        loss = loss_fn(model, x[mine], y[mine])
        loss.backward()
        wait()  # (a) all-reduces here; (b), (c) wait for the ones backward started
        sgd_step(model, lr)
        losses.append(loss.item())
    inner = model.module if sync == "DDP" else model
    return dict(params=parameters_vector(inner), losses=losses)


def train_one_process(model_fn, x, y, global_batch: int, steps: int, lr: float,
                      seed: int = 0) -> dict:
    """The baseline: the same steps on one process with the whole global batch."""
    model = model_fn()
    losses = []
    for idx in global_batches(len(y), global_batch, steps, seed):
        model.zero_grad()
        loss = loss_fn(model, x[idx], y[idx])
        loss.backward()
        sgd_step(model, lr)
        losses.append(loss.item())
    return dict(params=parameters_vector(model), losses=losses)
