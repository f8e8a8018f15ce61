"""A stand-in GPU for checking where a lesson puts its tensors, on a machine without one.

Inside :func:`pretend_gpu`, ``course_lib``'s ``device()`` answers a marker device (``meta``).
Tensors created on it or moved to it are CPU tensors wrapped so that they *report* the marker
(:class:`OnMarker`); every operation on them runs on the CPU data and wraps its result again.
An operation that mixes marked tensors with plain CPU tensors (other than 0-dim scalars, which
CUDA accepts too), or a collective on a plain CPU tensor, raises :class:`Misplaced` -- the
operations that would fail, or travel over gloo while the rest of the lesson uses NCCL, on a
real GPU. Collectives and point-to-point messages work: they run on the unwrapped CPU data
over gloo.
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

MARKER = torch.device("meta")


class Misplaced(RuntimeError):
    """A lesson computed or communicated with a tensor that is not on its rank's device."""


class OnMarker(torch.Tensor):
    """A CPU tensor that reports the marker device."""

    @staticmethod
    def __new__(cls, elem, requires_grad=None):
        assert not isinstance(elem, OnMarker)
        out = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, layout=elem.layout, device=MARKER,
            requires_grad=elem.requires_grad if requires_grad is None else requires_grad)
        out.elem = elem
        return out

    def __repr__(self):
        return f"OnMarker({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return NotImplemented  # the mode below handles every operation


def _marked(device) -> bool:
    return device is not None and torch.device(device).type == MARKER.type


class _ToMarker(torch.autograd.Function):
    """``.to(marker)`` of a tensor that requires grad: gradients flow back to the CPU one."""

    @staticmethod
    def forward(ctx, t):
        return OnMarker(t.detach())

    @staticmethod
    def backward(ctx, grad):
        return grad.elem if isinstance(grad, OnMarker) else grad


def _wrap(t, requires_grad=None):
    return OnMarker(t, requires_grad) if isinstance(t, torch.Tensor) and \
        not isinstance(t, OnMarker) else t


class _Placement(TorchFunctionMode):
    """Turns "create on / move to the marker" into CPU work plus a wrapper, before C++ runs."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.to, torch.Tensor.cpu):
            t = args[0]
            base = t.elem if isinstance(t, OnMarker) else t
            if func is torch.Tensor.cpu:
                return base
            copy = kwargs.pop("copy", False)
            dev, dtype, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            out = base.to(dtype=dtype or base.dtype, copy=copy)
            if dev is None:
                dev = t.device
            if not _marked(dev):
                return out
            if out.requires_grad and torch.is_grad_enabled():
                return _ToMarker.apply(out)
            return OnMarker(out.detach(), requires_grad=out.requires_grad)
        if _marked(kwargs.get("device")):
            kwargs["device"] = torch.device("cpu")
            return tree_map(_wrap, func(*args, **kwargs))
        return func(*args, **kwargs)


class _Audit(TorchDispatchMode):
    """Runs every operation on the wrapped CPU data, and refuses to mix placements."""

    def __init__(self, messages_on_cpu: bool):
        super().__init__()
        self.messages_on_cpu = messages_on_cpu

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        marked = [t for t in flat if isinstance(t, OnMarker)]
        plain = [t for t in flat if isinstance(t, torch.Tensor) and not isinstance(t, OnMarker)]
        if func.namespace == "c10d":
            if "barrier" in func.name() or self.messages_on_cpu:
                stray = []
            else:
                stray = [t for t in plain if t.numel() > 0]
            if stray:
                raise Misplaced(f"{func}: a message or collective with a CPU tensor of shape "
                                f"{tuple(stray[0].shape)}; on GPUs it would travel over gloo "
                                f"while the lesson's other tensors travel over NCCL")
        elif marked and any(t.dim() > 0 for t in plain):
            shapes = [tuple(t.shape) for t in plain if t.dim() > 0]
            raise Misplaced(f"{func}: mixes tensors on the rank's device with CPU tensors of "
                            f"shapes {shapes}")
        unwrap = lambda t: t.elem if isinstance(t, OnMarker) else t  # noqa: E731
        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        if not marked:
            return out
        own = {id(t.elem): t for t in marked}  # in-place results alias their input
        return tree_map(lambda t: own.get(id(t), _wrap(t)) if isinstance(t, torch.Tensor)
                        else t, out)


def _one_by_one(ops):
    """``batch_isend_irecv`` asks the group for the backend of the tensors' device, and the
    marker has none: post the messages one by one, as batch_isend_irecv itself does for gloo."""
    works = []
    for op in ops:
        peer = {"group_dst" if op.op is dist.isend else "group_src": op.group_peer}
        work = op.op(op.tensor, group=op.group, tag=op.tag, **peer)
        if work is not None:
            works.append(work)
    return works


@contextlib.contextmanager
def pretend_gpu(messages_on_cpu: bool = False):
    """Run the ``with`` block as if this rank's device were a GPU (see the module docstring).
    ``messages_on_cpu`` allows collectives on CPU tensors (a lesson part that needs gloo)."""
    from course_lib.runtime import devices

    real = devices.device
    patched = [m for m in list(sys.modules.values())
               if getattr(m, "__name__", "").startswith("course_lib")
               and getattr(m, "device", None) is real]
    for module in patched:
        module.device = lambda group=None: MARKER
    batch = dist.batch_isend_irecv
    dist.batch_isend_irecv = _one_by_one
    try:
        with _Audit(messages_on_cpu), _Placement():
            yield
    finally:
        dist.batch_isend_irecv = batch
        for module in patched:
            module.device = real


def on_marker(value) -> bool:
    """Every tensor in a (nested) result reports the marker device."""
    if isinstance(value, torch.Tensor):
        return isinstance(value, OnMarker)
    if isinstance(value, dict):
        return all(on_marker(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(on_marker(v) for v in value)
    return True


def to_cpu(value):
    """A result with its wrappers taken off, to send back to the test process."""
    if isinstance(value, OnMarker):
        return value.elem.detach()
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value
