"""Gradient compression with error feedback: send fewer bytes, remember what was not sent.

Lecture: slides "Parallel computing for machine learning", part 3 (the trend "cut communication":
fp16/bf16 all-reduce) taken further: top-k sparsification (Stich et al. 2018; Lin et al., Deep
Gradient Compression, 2018) and PowerSGD (Vogels et al., NeurIPS 2019), low-rank. Both discard
most of the gradient; **error feedback** adds what was discarded to the next step's gradient,
so every coordinate is sent eventually (Karimireddy et al. 2019: it fixes sign-SGD and top-k).

Each compressor's ``all_reduce(grads, group)`` takes a model's gradients and returns: the
ranks' mean as the compressor delivers it, the bytes this rank sent, and what counts as sent (top-k:
this rank's kept entries; PowerSGD: the low-rank matrix every rank decodes, as in the paper's
code and torch's hook) -- error feedback keeps the rest; :func:`train` runs SGD with any of them, by
hand over blocking collectives, two or three per step for the whole model, issued in program
order on every rank. (torch's PowerSGD hook hangs on gloo with several DDP buckets: it starts
each bucket's next all-reduce inside a future's callback, which gloo runs on its own worker
threads, so the ranks' order of collectives depends on timing.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.data_parallel import parameters_vector
from course_lib.runtime.devices import device
from course_lib.training import check_whole, step_loop


def flatten(tensors):
    """Every tensor's numbers, one after the other, in one vector (empty for no tensor)."""
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


def split_like(flat, like):
    """``flat`` cut back into tensors shaped like ``like`` (views, in order)."""
    out, offset = [], 0
    for t in like:
        out.append(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return out


class Dense:
    """No compression: one all-reduce of all gradients, flattened into one message."""

    name = "dense"

    def all_reduce(self, grads, group=None):
        total = flatten(grads)
        dist.all_reduce(total, group=group)
        mean = split_like(total / dist.get_world_size(group), grads)
        return mean, total.numel() * total.element_size(), list(grads)


class TopK:
    """Keep the ``fraction`` of all gradient entries largest in magnitude; every rank sends its
    (value, int32 index) pairs to every other (all-gather: the ranks keep different entries)."""

    def __init__(self, fraction: float):
        try:  # a number: a float, a Fraction, a 0-d tensor; not a string or a bool
            value = None if isinstance(fraction, str | bytes | bool) else float(fraction)
        except (TypeError, ValueError):
            value = None
        if value is None or not 0 < value <= 1:
            raise ValueError(f"fraction must be a number in (0, 1], got {fraction!r}")
        fraction = value
        self.fraction, self.name = fraction, f"top-k {100 * fraction:g}%"  # 1%, 0.5%

    def kept(self, flat):
        """Indices of the entries this rank sends."""
        n = flat.numel()  # none of none: an empty model sends nothing
        return flat.abs().topk(min(n, max(1, round(self.fraction * n)))).indices

    def all_reduce(self, grads, group=None):
        flat = flatten(grads)
        index = self.kept(flat)
        values = flat[index]
        world_size = dist.get_world_size(group)
        all_values = [torch.empty_like(values) for _ in range(world_size)]
        all_index = [torch.empty_like(index, dtype=torch.int32) for _ in range(world_size)]
        dist.all_gather(all_values, values, group=group)
        dist.all_gather(all_index, index.to(torch.int32), group=group)
        total = torch.zeros_like(flat)
        for v, j in zip(all_values, all_index, strict=True):
            total.index_add_(0, j.long(), v)
        kept = torch.zeros_like(flat).index_put_((index,), values)  # what this rank sent
        return (split_like(total / world_size, grads), len(index) * (values.element_size() + 4),
                split_like(kept, grads))


def orthonormalize(p: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning those of ``p`` (reduced QR; in float32 for a 16-bit ``p``,
    which torch's QR does not take, then back in ``p``'s dtype)."""
    if p.dtype in (torch.float16, torch.bfloat16):
        return torch.linalg.qr(p.float()).Q.to(p.dtype)
    return torch.linalg.qr(p).Q


class PowerSGD:
    """Rank-``rank`` approximation of each matrix gradient M (n x m) by one step of power
    iteration, warm-started from the last step's Q (Vogels et al. 2019, algorithm 1):
    P = M Q, all-reduce P, orthonormalise; Q = M^T P, all-reduce Q; the mean is ~ P Q^T.
    (n + m) rank numbers are sent instead of n m. Vectors (biases) go dense, with the Qs. All
    matrices' Ps travel in one message, all Qs in another (as torch's hook does per bucket)."""

    def __init__(self, rank: int, seed: int = 0):
        check_whole("rank", rank)
        self.rank, self.seed, self.name = rank, seed, f"PowerSGD rank {rank}"
        self.q = {}

    def all_reduce(self, grads, group=None):
        world_size = dist.get_world_size(group)
        mats = {i: g.reshape(g.shape[0], -1) for i, g in enumerate(grads)
                if g.ndim >= 2 and g.numel()}  # an empty matrix goes as it is, as a vector
        vecs = [i for i, g in enumerate(grads) if i not in mats]
        for i, m in mats.items():
            if i not in self.q:  # the same random start on every rank (same seed)
                gen = torch.Generator().manual_seed(self.seed * 7919 + i)
                self.q[i] = torch.randn(m.shape[1], min(self.rank, *m.shape), generator=gen,
                                        dtype=m.dtype).to(m.device)
        ps = [m @ self.q[i] for i, m in mats.items()]
        flat_p = flatten(ps)  # empty where no gradient is a matrix: nothing to send
        if flat_p.numel():
            dist.all_reduce(flat_p, group=group)
        ps = [orthonormalize(p) for p in split_like(flat_p / world_size, ps)]
        qs = [m.T @ p for m, p in zip(mats.values(), ps, strict=True)]
        rest = flatten(qs + [grads[i] for i in vecs])
        if rest.numel():
            dist.all_reduce(rest, group=group)
        pieces = split_like(rest / world_size, qs + [grads[i] for i in vecs])
        out = list(grads)
        for i, p, q in zip(mats, ps, pieces, strict=False):  # pieces: the Qs, then vectors
            self.q[i] = q = q.to(p.dtype)  # (one message of several dtypes takes the widest)
            out[i] = (p @ q.T).view_as(grads[i])
        for i, v in zip(vecs, pieces[len(qs):], strict=True):
            out[i] = v.to(grads[i].dtype)
        sent = [o if i in mats else grads[i] for i, o in enumerate(out)]  # the decoded matrices
        n_bytes = flat_p.numel() * flat_p.element_size() + rest.numel() * rest.element_size()
        return out, n_bytes, sent


class ErrorFeedback:
    """Per tensor, the part of the corrected gradient that was not sent. :meth:`compensate`
    adds it to this step's gradients; :meth:`remember` keeps corrected - sent for the next."""

    def __init__(self):
        self.residual = None

    def compensate(self, grads):
        if self.residual is None:
            return list(grads)
        return [g + e for g, e in zip(grads, self.residual, strict=True)]

    def remember(self, corrected, sent):
        self.residual = [c - s for c, s in zip(corrected, sent, strict=True)]


def compressed_mean(compressor, feedback, grads, group=None):
    """What one rank uses as the mean gradients, and the bytes it sent. With ``feedback`` (an
    :class:`ErrorFeedback`, or None) the gradients are first corrected by what was not sent
    before, and what is not sent of the corrected gradients is remembered."""
    corrected = feedback.compensate(grads) if feedback is not None else list(grads)
    mean, n_bytes, sent = compressor.all_reduce(corrected, group)
    if feedback is not None:
        feedback.remember(corrected, sent)
    return mean, n_bytes


def train(model_fn, x, y, x_test, y_test, compressor, error_feedback: bool,
          global_batch: int, steps: int, lr: float, seed: int = 0, group=None) -> dict:
    """SGD with data parallelism whose gradients go through ``compressor`` (with or without
    error feedback), in the one step loop (:func:`course_lib.training.step_loop`): the
    synchroniser puts the compressed mean in ``.grad``. A frozen parameter is left out; one
    without a gradient sends zeros (every rank must send the same tensors). Returns ``losses``
    per step, test ``accuracy`` at the end, ``bytes`` this rank sent per step and the final
    ``params``."""
    check_whole("steps", steps)  # bytes are per step
    dev = device(group)
    model = model_fn().to(dev)
    params = [p for p in model.parameters() if p.requires_grad]
    feedback = ErrorFeedback() if error_feedback else None
    sent = []

    @torch.no_grad()
    def compress_and_average():
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        means, n_bytes = compressed_mean(compressor, feedback, grads, group)
        for p, mean in zip(params, means, strict=True):
            p.grad = mean
        sent.append(n_bytes)

    opt = torch.optim.SGD(params, lr=lr, foreach=False)
    losses = step_loop(model, opt, x, y, global_batch, steps, compress_and_average, seed, group)
    with torch.no_grad():
        accuracy = (model(x_test.to(dev)).argmax(-1) == y_test.to(dev)).double().mean().item()
    return dict(losses=losses, accuracy=accuracy, bytes=sum(sent) / steps,
                params=parameters_vector(model))


def compressor(name: str, seed: int = 0):
    """A compressor from its name: "dense", "top-k 1%" (any percentage), "PowerSGD rank 2"."""
    if name == "dense":
        return Dense()
    if name.startswith("top-k ") and name.endswith("%"):
        try:
            percent = float(name[6:-1])
        except ValueError:  # not a number: the message below names the forms
            percent = None
        if percent is not None:
            return TopK(percent / 100)  # out of range: TopK says so
    if name.startswith("PowerSGD rank ") and name.removeprefix("PowerSGD rank ").isdigit():
        return PowerSGD(int(name.removeprefix("PowerSGD rank ")), seed)
    raise ValueError(f"unknown compressor {name!r}: 'dense', 'top-k 1%', 'PowerSGD rank 2'")


def compare(model_fn, split, names, seeds, *, global_batch: int = 64, steps: int = 150,
            lr: float = 0.1, group=None) -> dict:
    """On every rank: :func:`train` for each compressor name, with error feedback ("+ EF") and
    without (dense once), for each seed. ``{label: [result per seed]}``."""
    runs = {}
    for name in names:
        for feedback in ([False] if name == "dense" else [True, False]):
            label = name if name == "dense" else f"{name} {'+ EF' if feedback else 'no EF'}"
            runs[label] = [train(lambda s=seed: model_fn(seed=s), split.x_train,
                                 split.y_train, split.x_test, split.y_test,
                                 compressor(name, seed), feedback, global_batch, steps, lr,
                                 seed=seed, group=group) for seed in seeds]
            for r in runs[label]:
                del r["params"]  # keep what the lesson plots small
    return runs
