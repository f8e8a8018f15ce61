"""Where a training step's bytes go: parameters, gradients, optimizer state, activations.

Lecture: model parallelism and memory; ZeRO (Rajbhandari et al., SC 2020, section 3): with Adam
a model of Psi parameters keeps 16 Psi bytes of training state -- in fp32, 4 for the weights,
4 for the gradients, 8 for the two moments; in mixed precision, 2 + 2 for fp16 weights and
gradients and 12 for fp32 master weights and moments -- before a single activation.
:func:`state_bytes` counts them from a model; :func:`measure_step` measures a real Adam step
with PyTorch's memory tracker, on the CPU as on a GPU; :class:`SavedBytes` counts the bytes
autograd saves for backward (``train_gpt``'s activations), whichever schedule runs the passes;
:func:`peak_bytes` measures the most bytes any function holds at once (lesson 13's attention in
blocks).
"""

from __future__ import annotations

import copy

import torch

from course_lib.training import loss_fn

PRECISIONS = ("fp32", "mixed")


def state_bytes(model, precision: str = "fp32") -> dict:
    """Bytes of the training state of ``model`` with Adam, counted from its parameters:
    ``params`` (every parameter, frozen ones too: they are held all the same; 4 bytes each in
    fp32, 2 in mixed precision), ``grads`` (the same per trainable parameter), ``optimizer``
    (the two moments of each trainable parameter, 8 bytes; plus its fp32 master weights, 4 more,
    in mixed precision) and their ``total`` (16 per parameter of a model that trains them all)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    held = sum(p.numel() for p in model.parameters())
    psi = sum(p.numel() for p in model.parameters() if p.requires_grad)
    low = 4 if precision == "fp32" else 2
    out = dict(params=low * held, grads=low * psi,
               optimizer=(8 if precision == "fp32" else 12) * psi)
    out["total"] = sum(out.values())
    return out


def measure_step(model, x, y, lr: float = 1e-3, precision: str = "fp32") -> dict:
    """Measured: the memory of one Adam step (forward, backward, optimizer step) at its peak,
    split as PyTorch's tracker (``torch.distributed._tools.mem_tracker.MemTracker``) labels the
    bytes: ``params``, ``grads``, ``optimizer``, ``activations``, ``temporaries``, ``other``
    (what it can't attribute) and ``total``.

    "mixed": the model computes in bfloat16 (weights, gradients, activations) and Adam updates
    float32 master copies, which are optimizer state; tensor by tensor, each step copies the
    gradient up and the updated master down. A first step runs untracked, so that Adam's state
    exists, as in training; gradients stay allocated between steps (as DDP's buckets keep
    them). Adam's step counts (a float32 per tensor) count as optimizer state. The steps run on a
    copy: ``model`` is left as it was (its weights, their dtype), and both are in memory while it
    measures (a model that ``copy.deepcopy`` cannot copy is refused by it)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    model = copy.deepcopy(model)
    params = list(model.parameters())
    if frozen := [name for name, p in model.named_parameters() if not p.requires_grad]:
        raise ValueError(f"torch's MemTracker hooks every parameter's gradient, so it cannot "
                         f"track frozen ones: {frozen}; measure with them trainable, or use "
                         f"peak_bytes")
    if precision == "mixed":
        model.to(torch.bfloat16)
        x = x.to(torch.bfloat16) if x.is_floating_point() else x  # inputs as the weights
        masters = [p.detach().float().clone().requires_grad_(True) for p in params]
        # one Adam per tensor, stepped in turn: a float32 copy of one gradient at a time
        opts = [torch.optim.Adam([m], lr=lr, foreach=False) for m in masters]
    else:
        masters = params
        opts = [torch.optim.Adam(params, lr=lr, foreach=False)]

    def step():
        for p in params:
            if p.grad is not None:
                p.grad.zero_()
        loss_fn(model, x, y).backward()
        if precision == "fp32":
            opts[0].step()
            return
        with torch.no_grad():
            for master, p, opt in zip(masters, params, opts, strict=True):
                master.grad = p.grad.float()  # up to float32 for the update
                opt.step()
                master.grad = None
                p.copy_(master)  # down to bfloat16 for the next forward

    step()
    tracker = MemTracker()
    # the masters are no module's parameters: tracked as "other", counted as optimizer state
    tracker.track_external(model, *opts, *(masters if precision == "mixed" else []))
    with tracker:
        step()
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    names = {"PARAM": "params", "GRAD": "grads", "OPT": "optimizer", "ACT": "activations",
             "TEMP": "temporaries", "OTH": "optimizer" if precision == "mixed" else "other"}
    out = dict.fromkeys(names.values(), 0)
    for kind, n_bytes in peak.items():
        key = names.get(getattr(kind, "name", str(kind)))
        if key:
            out[key] += n_bytes
    out["total"] = sum(out.values())
    return out


def peak_bytes(fn, *args, **kwargs) -> int:
    """Measured: the most bytes of tensors that ``fn(*args, **kwargs)`` holds at once, on every
    device together -- what it allocates while it runs, its inputs left out -- by PyTorch's
    memory tracker, on the CPU as on a GPU."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    with tracker:
        fn(*args, **kwargs)
    peak = tracker.get_tracker_snapshot("peak")
    return int(sum(by_kind.get("Total", 0) for by_kind in peak.values()))


class SavedBytes:
    """Measured activation memory: bytes of the distinct storages autograd holds for backward,
    now and at the peak (parameters, saved too but counted as state, left out). A saved
    tensor stays counted until autograd lets it go, whichever schedule runs the passes."""

    def __init__(self):
        self.refs, self.now, self.peak = {}, 0, 0

    def pack(self, t):
        base = t if t._base is None else t._base
        if isinstance(base, torch.nn.Parameter):
            return t
        return _Held(self, t)

    @staticmethod
    def unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


class _Held:
    def __init__(self, tracker, tensor):
        self.tracker, self.tensor = tracker, tensor
        self.key = tensor.untyped_storage().data_ptr()
        count = tracker.refs.get(self.key, 0)
        if count == 0:
            tracker.now += tensor.untyped_storage().nbytes()
            tracker.peak = max(tracker.peak, tracker.now)
        tracker.refs[self.key] = count + 1

    def __del__(self):
        self.tracker.refs[self.key] -= 1
        if self.tracker.refs[self.key] == 0:
            del self.tracker.refs[self.key]
            self.tracker.now -= self.tensor.untyped_storage().nbytes()
