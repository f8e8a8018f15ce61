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

import functools
import numbers

import torch
import torch.distributed as dist

from course_lib.data_parallel import average_gradients, ddp_model, parameters_vector
from course_lib.runtime.devices import device
from course_lib.training import (  # noqa: F401  (ov.loss_fn)
    global_batches,
    gradient_counts,
    loss_fn,
    step_loop,
    trainable,
    used_by_some_ranks_only,
)

MB = 2**20
SYNCS = ("after backward", "per parameter", "buckets", "DDP")


# (a) after backward: lesson 4's average_gradients itself, under the name this lesson compares
all_reduce_after_backward = average_gradients


class OneBackwardPerWait:
    """Refuses a second backward pass before ``wait()``: (b) and (c) start a gradient's all-reduce
    during backward, so a second pass would add into a gradient being sent. Its hooks see each
    gradient before autograd adds it into ``.grad``, so nothing is added."""

    def __init__(self, params):
        self.seen = set()
        self.handles = [p.register_hook(functools.partial(self.check, p)) for p in params]

    def check(self, p, grad=None):
        if id(p) in self.seen:
            raise RuntimeError("a second backward() before wait(): this synchronisation starts "
                               "each gradient's all-reduce during backward, so gradients can't "
                               "accumulate over micro-batches; call wait() after each backward, "
                               "or start the all-reduces on the last one only (lesson 10, "
                               "exercise 1)")
        self.seen.add(id(p))


class PerParameterAllReduce:
    """(b) One asynchronous all-reduce per parameter, started by
    ``register_post_accumulate_grad_hook`` as soon as autograd has written its gradient.
    Call :meth:`wait` after ``backward()`` and before the optimizer step."""

    def __init__(self, model, group=None, find_unused: bool = False):
        self.group, self.world_size = group, dist.get_world_size(group)
        self.names, self.params = trainable(model)
        self.find_unused = find_unused
        self.pending, self.once = [], OneBackwardPerWait(self.params)
        self.handles = [p.register_post_accumulate_grad_hook(self._ready) for p in self.params]

    def _ready(self, p):
        p.grad /= self.world_size  # divide first: the sum then is the mean, as DDP does
        self.pending.append((p, dist.all_reduce(p.grad, group=self.group, async_op=True)))

    def wait(self) -> None:
        self.once.seen.clear()
        started = {id(p) for p, _ in self.pending}
        for _, work in self.pending:
            work.wait()
        self.pending.clear()
        missing = [i for i, p in enumerate(self.params) if id(p) not in started]
        if self.find_unused:  # every step, on every rank: those no rank used keep no gradient
            counts = gradient_counts(self.params, self.group)
            missing = used_by_some_ranks_only(counts, self.world_size)
        if missing:  # the other ranks may have sent them: say so rather than hang or diverge
            raise RuntimeError(f"rank {dist.get_rank(self.group)}: parameters "
                               f"{[self.names[i] for i in missing]} got no "
                               f"gradient in this backward pass (here or on some ranks), so "
                               f"their all-reduces do not pair up; use every parameter in the "
                               f"loss, freeze it (requires_grad=False) or, if no rank uses it, "
                               f"pass find_unused=True")

    def remove(self) -> None:
        for h in self.handles + self.once.handles:
            h.remove()


def assign_buckets(params, bucket_mb: float) -> list[list[int]]:
    """Parameter indices grouped into buckets of at least ``bucket_mb`` MB (the last may be
    smaller), in **reverse** order of ``params``: backward produces the last layer's gradients
    first, so the first bucket fills first (DDP's rule; it also keeps its first bucket small)."""
    if isinstance(bucket_mb, bool) or not (isinstance(bucket_mb, numbers.Real) and bucket_mb > 0):
        raise ValueError(f"bucket_mb must be positive, a number of megabytes, got {bucket_mb!r}")
    params = list(params)  # model.parameters() is a generator: len() and indexing need a list
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


def pack_bucket(grads, world_size: int) -> torch.Tensor:
    """A bucket's gradients flattened into one new buffer and divided by the world size (the sum
    over the ranks is then the mean, as DDP does)."""
    grads = list(grads)
    if not grads or isinstance(world_size, bool) or not (
            isinstance(world_size, numbers.Integral) and world_size >= 1):
        raise ValueError(f"a bucket needs gradients and a world_size >= 1 (a whole number), got "
                         f"{len(grads)} gradients and world_size={world_size!r}")
    buffer = torch.cat([g.reshape(-1) for g in grads])
    buffer /= world_size  # in place: no second copy of the bucket
    return buffer


def start_bucket(grads, group=None):
    """One bucket's message: :func:`pack_bucket`, all-reduced asynchronously. Returns the buffer
    and the work to wait for."""
    buffer = pack_bucket(grads, dist.get_world_size(group))
    return buffer, dist.all_reduce(buffer, group=group, async_op=True)


def unpack_bucket(buffer, grads) -> None:
    """Copy a bucket's means back into its gradients, in the order they were packed."""
    offset = 0
    for g in grads:
        g.copy_(buffer[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def all_reduce_as_one_bucket(params, group=None) -> None:
    """Every gradient in one message, after backward: one bucket as large as the model (what
    train_gpt's data parallelism sends). Every rank must hold the same gradients."""
    grads = [p.grad for p in params if p.grad is not None]
    buffer, work = start_bucket(grads, group)
    work.wait()
    unpack_bucket(buffer, grads)


class BucketedAllReduce:
    """(c) Gradients packed into buckets (:func:`assign_buckets`); when a bucket's last gradient
    arrives, the bucket is flattened into one buffer and all-reduced asynchronously.
    :meth:`wait` waits for every bucket and copies the means back into ``.grad``."""

    def __init__(self, model, bucket_mb: float = 25.0, group=None, find_unused: bool = False):
        self.group, self.world_size = group, dist.get_world_size(group)
        self.names, self.params = trainable(model)
        self.find_unused = find_unused
        self.buckets = assign_buckets(self.params, bucket_mb)
        self.bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket}
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.ready = [0] * len(self.buckets)
        self.pending, self.once = [], OneBackwardPerWait(self.params)
        self.handles = [p.register_post_accumulate_grad_hook(self._ready) for p in self.params]

    def _ready(self, p):
        b = self.bucket_of[self.index[id(p)]]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):  # the bucket is full: send it
            self.pending.append((b, *start_bucket([self.params[i].grad
                                                   for i in self.buckets[b]], self.group)))

    def wait(self) -> None:
        self.once.seen.clear()
        unsent = sorted(set(range(len(self.buckets))) - {b for b, _, _ in self.pending})
        if self.find_unused:  # every step, on every rank: then send what the ranks have of the
            # buckets that never filled, in bucket order
            counts = gradient_counts(self.params, self.group)
            if bad := used_by_some_ranks_only(counts, self.world_size):
                raise RuntimeError(f"rank {dist.get_rank(self.group)}: parameters "
                                   f"{[self.names[i] for i in bad]} got a "
                                   f"gradient on some ranks only; every rank must use the same "
                                   f"parameters")
            for b in unsent:
                if grads := [self.params[i].grad for i in self.buckets[b] if counts[i] > 0]:
                    self.pending.append((b, *start_bucket(grads, self.group)))
            unsent = []
        for b, buffer, work in self.pending:
            work.wait()  # a gradient that is None (no rank used it) stays without one
            unpack_bucket(buffer, [self.params[i].grad for i in self.buckets[b]
                                   if self.params[i].grad is not None])
        self.pending.clear()
        self.ready = [0] * len(self.buckets)
        if unsent:
            unfilled = sorted(i for b in unsent for i in self.buckets[b])  # as .parameters()
            empty = [self.names[i] for i in unfilled if self.params[i].grad is None] or [
                self.names[i] for i in unfilled]  # an old .grad kept (not set to None): all
            raise RuntimeError(f"rank {dist.get_rank(self.group)}: buckets {unsent} never filled: "
                               f"parameters {empty} got no gradient in this backward pass; "
                               f"use every parameter in the loss, freeze it or, if no rank uses "
                               f"it, pass find_unused=True")

    def remove(self) -> None:
        for h in self.handles + self.once.handles:
            h.remove()


def synchronizer(model, sync: str, bucket_mb: float = 25.0, group=None,
                 find_unused: bool = False):
    """A callable to run after ``backward()`` that leaves the mean gradient in ``.grad``, and
    the model to train (DDP's wrapper for "DDP"). ``sync`` is one of :data:`SYNCS`, or "none"
    (no communication: the local step, to measure what synchronising adds). ``find_unused``:
    parameters that no rank used are allowed (DDP's ``find_unused_parameters``)."""
    if sync == "after backward":
        return model, lambda: all_reduce_after_backward(model, group, find_unused)
    if sync == "per parameter":
        return model, PerParameterAllReduce(model, group, find_unused).wait
    if sync == "buckets":
        return model, BucketedAllReduce(model, bucket_mb, group, find_unused).wait
    if sync == "DDP":
        return ddp_model(model, group, bucket_cap_mb=bucket_mb,
                         find_unused_parameters=find_unused), lambda: None
    if sync == "none":
        return model, lambda: None
    raise ValueError(f"sync must be one of {SYNCS} or 'none', got {sync!r}")


def train(model_fn, x, y, global_batch: int, steps: int, lr: float, sync: str = "buckets",
          bucket_mb: float = 25.0, seed: int = 0, group=None, find_unused: bool = False,
          optimizer=None, emulated=None, on_step=None) -> dict:
    """Data parallelism synchronised by ``sync`` (:func:`synchronizer`), in the one step loop
    (:func:`course_lib.training.step_loop`): each step every rank takes every world_size-th
    row of the step's global batch (which must divide evenly). All replicas start from the same
    ``model_fn()``. ``optimizer(model)`` makes the optimizer (its parameter groups, say; default:
    SGD with ``lr``). ``emulated``: compute at an emulated device's pace (``runtime.emulation``);
    ``on_step(step, seconds)``: called after each step. Returns the final ``params`` and this
    rank's ``losses``."""
    inner = model_fn().to(device(group))
    model, wait = synchronizer(inner, sync, bucket_mb, group, find_unused)
    opt = (optimizer or default_sgd(lr))(inner)
    losses = step_loop(model, opt, x, y, global_batch, steps, wait, seed, group, on_step,
                       emulated)
    return dict(params=parameters_vector(inner), losses=losses)


def default_sgd(lr: float):
    """The optimizer :func:`train` uses unless told: plain SGD, p <- p - lr * grad."""
    return lambda model: torch.optim.SGD(model.parameters(), lr=lr, foreach=False)


def train_one_process(model_fn, x, y, global_batch: int, steps: int, lr: float,
                      seed: int = 0, optimizer=None) -> dict:
    """The baseline: the same steps on one process with the whole global batch."""
    model = model_fn()
    opt = (optimizer or default_sgd(lr))(model)
    losses = step_loop(model, opt, x, y, global_batch, steps, seed=seed)
    return dict(params=parameters_vector(model), losses=losses)
