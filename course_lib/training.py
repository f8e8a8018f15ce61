"""The ground floor of training: what every data-parallel lesson's loop shares.

Lecture: slides "Parallel computing for machine learning", part 3 (data parallelism): every
rank computes the gradient of its share of the step's global batch; the gradients are averaged;
every rank takes the same optimizer step, so the replicas stay equal and equal one process
that trains on the whole global batch.

* :func:`loss_fn` and :func:`global_batches`: the loss, and the rows of each step's global batch
  (the same on every rank and in one process);
* :func:`check_split`: a global batch must split evenly over the ranks (said once, here);
  :func:`check_whole` and :func:`check_steps`: counts are whole, and an epoch makes a step;
* :func:`gradient_counts`, :func:`used_by_some_ranks_only`, :func:`parameters_to_average`:
  which gradients the ranks average -- frozen parameters never, a parameter no rank used keeps
  ``.grad = None`` (as on one process), one some ranks used and others not is refused by name
  (its all-reduces would not pair up);
* :func:`step_loop`: the one loop, with pluggable parts -- a gradient synchroniser run after
  ``backward()`` (lesson 4's all-reduce, lesson 10's hooks and buckets, nothing when the
  optimizer averages itself: ZeRO's ``ShardedAdam``) and any torch optimizer (parameter groups,
  frozen parameters and parameters without a gradient behave as torch's optimizers say).

The lessons' modules stand on this one; it imports none of them.
"""

from __future__ import annotations

import numbers

import torch
import torch.distributed as dist

from course_lib.runtime.devices import device
from course_lib.runtime.emulation import catch_up, paced_step


def loss_fn(model, x, y):
    """Mean cross-entropy; works for classifiers (logits (b, c)) and language models (logits
    (b, t, vocab), targets (b, t))."""
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.flatten(0, -2), y.flatten())


def global_batches(n: int, global_batch: int, steps: int, seed: int = 0) -> list[torch.Tensor]:
    """Row indices of each step's global batch: the same on every rank and in one process."""
    check_whole("global_batch", global_batch), check_whole("steps", steps, least=0)
    if global_batch > n:
        raise ValueError(f"global_batch {global_batch} is larger than the {n} rows of the data")
    g = torch.Generator().manual_seed(seed)
    return [torch.randperm(n, generator=g)[:global_batch] for _ in range(steps)]


def check_split(global_batch: int, world_size: int) -> None:
    """Refuse a global batch that does not split evenly over the ranks (an uneven split would
    weigh some rows more than others in the averaged gradient)."""
    check_whole("global_batch", global_batch)
    check_whole("world_size", world_size)
    if global_batch % world_size:
        raise ValueError(f"global_batch {global_batch} does not split evenly over {world_size} "
                         f"ranks; choose a multiple of {world_size}")


def is_whole(value) -> bool:
    """A whole number, Python's or numpy's (``np.int64``), and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_whole(name: str, value, least: int = 1) -> int:
    """``value`` if it is a whole number of at least ``least``; otherwise a clear error naming
    it."""
    if not is_whole(value) or value < least:
        raise ValueError(f"{name} must be a whole number of at least {least}, got {value!r}")
    return value


def check_steps(rows: int, world_size: int, local_batch: int, accumulate: int = 1) -> int:
    """The optimizer steps one epoch of ``rows`` gives ``world_size`` ranks of ``local_batch``
    rows, ``accumulate`` local batches a step (as ``DistributedSampler(drop_last=True)`` and a
    DataLoader deal them); refused, naming the sizes, where that is not one step."""
    for name, value in (("world_size", world_size), ("local_batch", local_batch),
                        ("accumulate", accumulate)):
        check_whole(name, value)
    check_whole("rows", rows, least=0)
    if not (steps := rows // world_size // local_batch // accumulate):
        raise ValueError(f"{rows} rows over {world_size} ranks give each {rows // world_size}: "
                         f"not one step of {accumulate} x local_batch {local_batch}; choose a "
                         f"smaller local_batch or accumulate")
    return steps


def rank_and_size(group=None) -> tuple[int, int]:
    """This process's rank in ``group`` and the group's size; (0, 1) without a process group
    (one process: the baseline)."""
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def gradient_counts(params, group=None) -> torch.Tensor:
    """How many ranks hold a gradient for each parameter: one small all-reduce, what DDP's
    ``find_unused_parameters=True`` adds to every step (0: no rank used it; the world size:
    every rank did)."""
    params = list(params)  # a model's parameters() is a generator
    if not params:
        return torch.zeros(0)
    got = torch.tensor([float(p.grad is not None) for p in params], device=params[0].device)
    dist.all_reduce(got, group=group)
    return got


def used_by_some_ranks_only(counts, world_size: int) -> list[int]:
    """The parameters some ranks have a gradient for and others not: their all-reduces would
    not pair up (every rank must use the same parameters)."""
    counts = counts.tolist() if hasattr(counts, "tolist") else list(counts)
    return [i for i, n in enumerate(counts) if 0 < n < world_size]


def trainable(model) -> tuple[list[str], list]:
    """The names and the parameters that ``model`` trains (``requires_grad``), in the order of
    ``model.parameters()``: errors name a parameter as ``named_parameters`` does."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    return [name for name, _ in named], [p for _, p in named]


def parameters_to_average(model, group=None, find_unused: bool = False) -> list:
    """The parameters whose gradients the ranks average after ``backward()``: the trainable
    ones. One without a gradient is refused by index, unless ``find_unused``: then the ranks
    first count who has which gradient (:func:`gradient_counts`); one that no rank used is left
    out (it keeps ``.grad = None``, as on one process), one that some ranks used is refused."""
    names, params = trainable(model)
    if not params:
        return []
    if find_unused:
        counts = gradient_counts(params, group)
        if bad := used_by_some_ranks_only(counts, dist.get_world_size(group)):
            raise RuntimeError(f"rank {rank_and_size(group)[0]}: parameters "
                               f"{[names[i] for i in bad]} got a gradient "
                               f"on some ranks only; every rank must use the same parameters")
        return [p for p, n in zip(params, counts.tolist(), strict=True) if n > 0]
    if missing := [name for name, p in zip(names, params, strict=True) if p.grad is None]:
        raise RuntimeError(f"rank {rank_and_size(group)[0]}: parameters {missing} got no gradient "
                           f"in this backward pass; use every parameter in the loss, freeze it "
                           f"(requires_grad=False) or pass find_unused=True")
    return params


def step_loop(model, optimizer, x, y, global_batch: int, steps: int, sync=None, seed: int = 0,
              group=None, on_step=None, emulated=None) -> list[float]:
    """Train ``model`` for ``steps`` steps; return this rank's losses.

    Each step this rank takes every world_size-th row of the step's global batch, computes its
    loss and ``backward()``, then ``sync()`` (a gradient synchroniser that leaves the mean of
    the ranks' gradients in ``.grad``; None: the optimizer averages them itself, or there is one
    process) and ``optimizer.step()``. ``on_step(step, seconds)``, if given, is called after
    each step (timing, logging). ``x`` and ``y`` go to the rank's device. ``emulated``: an
    ``runtime.emulation.EmulatedDevice`` whose modelled time the compute takes (paced after
    forward, at each gradient, after backward and after the optimizer step; the first step
    counts the FLOPs unless the device has counted them); None: as it is."""
    import time

    rank, world_size = rank_and_size(group)
    check_split(global_batch, world_size)
    dev = device(group) if dist.is_initialized() else x.device
    x, y = x.to(dev), y.to(dev)
    losses = []
    paced = emulated.pace_gradients(model) if emulated is not None else []
    try:
        for step, idx in enumerate(global_batches(len(y), global_batch, steps, seed)):
            mine = idx[rank::world_size].to(dev)
            start = time.perf_counter()
            with paced_step(emulated):
                optimizer.zero_grad()
                loss = loss_fn(model, x[mine], y[mine])
                catch_up(emulated)
                loss.backward()
                catch_up(emulated)  # the device finishes backward before a blocking collective
                if sync is not None:
                    sync()
                    catch_up(emulated)
                optimizer.step()
                losses.append(loss.item())
                catch_up(emulated)
            if on_step is not None:
                on_step(step, time.perf_counter() - start)
    finally:
        for handle in paced:
            handle.remove()
    return losses
