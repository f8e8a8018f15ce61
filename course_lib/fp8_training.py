"""FP8 training with per-tensor scales: e4m3 forward, e5m2 backward, scales from an amax history.

Lecture: mixed and low precision, the course article's last trend. FP8 has two formats: e4m3
(3 mantissa bits, largest 448) for what needs precision, the forward's inputs and weights, and
e5m2 (2 mantissa bits, largest 57,344) for what needs range, the backward's gradients
(Micikevicius et al. 2022, "FP8 formats for deep learning"). Either holds a tensor only after it
is scaled so that its largest |x| lands near the format's largest value. **Delayed scaling**
(Transformer Engine's recipe) takes the scale from the largest |x| seen over the last steps (the
*amax history*), so the cast needs no pass over the tensor before it: x_fp8 = cast(x x scale),
scale = max(format) / (max(amax history) x 2^margin). A value beyond the history's range
saturates at the format's largest value; :attr:`DelayedScaling.saturated` counts them.

On a CPU there is no FP8 matrix unit: :class:`FP8Linear` casts its inputs to FP8 and back
(``tensor.to(torch.float8_e4m3fn)``, exact), then multiplies in float32. That is what an FP8
matrix unit computes (FP8 inputs, float32 accumulation), up to the order of the sums; the time
is not an FP8 time. Every cast adds to its history, so a forward recomputed by activation
checkpointing casts again with a newer scale: do not combine the two here.
"""

from __future__ import annotations

import math
import numbers

import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


class DelayedScaling:
    """The scale of one tensor's casts to ``dtype`` (E4M3 or E5M2): from the largest |x| of its
    last ``history`` casts (the first cast uses its own), divided by 2^``margin``.
    ``scaled=False`` casts unscaled (scale 1), as FP8 without per-tensor scales would."""

    def __init__(self, dtype=E4M3, history: int = 16, margin: int = 0, scaled: bool = True):
        if dtype not in (E4M3, E5M2):
            raise ValueError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
        if isinstance(history, bool) or not isinstance(history, numbers.Integral) or history < 1:
            raise ValueError(f"history must be a positive whole number of steps, got {history!r}")
        if isinstance(margin, bool) or not isinstance(margin, numbers.Integral) or not (
                0 <= margin <= 32):
            raise ValueError(f"margin must be a whole number from 0 to 32 (halvings of the "
                             f"scale), got {margin!r}")
        self.dtype, self.history, self.margin, self.scaled = dtype, history, margin, scaled
        self.amaxes: list[float] = []
        self.saturated = 0

    @property
    def largest(self) -> float:
        return torch.finfo(self.dtype).max

    def scale(self) -> float:
        """max(format) / (max(amax history) x 2^margin); 1 while the history holds only zeros."""
        top = max(self.amaxes, default=0.0)
        return self.largest / (top * 2**self.margin) if top > 0 and self.scaled else 1.0

    def cast(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` cast to FP8 with the history's scale and back (x's value as FP8 holds it, in
        x's floating dtype; the arithmetic in float64, so a tiny tensor's large scale is
        exact); then ``x``'s own amax joins the history, unless it is NaN or inf. A finite value
        past the format's largest saturates to it; NaN and inf stay as they are, so that an
        overflow still reaches a loss scaler's check."""
        amax = x.detach().abs().max().item() if x.numel() else 0.0
        finite = math.isfinite(amax)
        if not self.amaxes and finite:
            self.amaxes.append(amax)
        s = self.scale()
        scaled = x.detach().double() * s
        self.saturated += int(((scaled.abs() > self.largest) & scaled.isfinite()).sum())
        codes = scaled.clamp(-self.largest, self.largest).to(self.dtype)
        if finite:
            self.amaxes = (self.amaxes + [amax])[-self.history:]
        out = (codes.double() / s).to(x.dtype if x.is_floating_point() else torch.float32)
        return out if finite else torch.where(torch.isfinite(x), out, x.detach().to(out.dtype))


class _FP8Product(torch.autograd.Function):
    """x @ w.T with x and w cast by their E4M3 scalers; backward casts the output's gradient by
    its E5M2 scaler and multiplies in float32 with the saved FP8 inputs."""

    @staticmethod
    def forward(ctx, x, w, scalers):
        xq, wq = scalers["input"].cast(x), scalers["weight"].cast(w)
        ctx.save_for_backward(xq, wq)
        ctx.scalers = scalers
        return (xq @ wq.T).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        xq, wq = ctx.saved_tensors
        gq = ctx.scalers["grad"].cast(grad)
        dx = gq @ wq
        dw = gq.reshape(-1, gq.shape[-1]).T @ xq.reshape(-1, xq.shape[-1])
        return dx.to(grad.dtype), dw.to(grad.dtype), None


class FP8Linear(torch.nn.Module):
    """A ``torch.nn.Linear`` whose matrix product takes FP8 inputs (e4m3 input and weight,
    e5m2 output gradient, each with its own :class:`DelayedScaling`); the parameters stay
    float32 (the masters) and the bias is added in float32."""

    def __init__(self, linear: torch.nn.Linear, history: int = 16, margin: int = 0,
                 scaled: bool = True):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.scalers = {"input": DelayedScaling(E4M3, history, margin, scaled),
                        "weight": DelayedScaling(E4M3, history, margin, scaled),
                        "grad": DelayedScaling(E5M2, history, margin, scaled)}

    def forward(self, x):
        y = _FP8Product.apply(x, self.weight, self.scalers)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.weight.shape[1]}, out_features={self.weight.shape[0]}, "
                f"bias={self.bias is not None}")


def to_fp8_training(model: torch.nn.Module, history: int = 16, margin: int = 0,
                    scaled: bool = True):
    """``model`` with every ``torch.nn.Linear`` that runs as a module replaced, in place, by an
    :class:`FP8Linear` holding the same parameters (a ``Linear`` itself: returned as one).
    ``torch.nn.MultiheadAttention`` reads its projections' weights directly, so it keeps
    them. ``scaled=False``: every cast unscaled. Returns the model."""
    DelayedScaling(E4M3, history, margin)  # refuse bad settings before any change
    if isinstance(model, torch.nn.Linear):
        return FP8Linear(model, history, margin, scaled)
    if isinstance(model, torch.nn.MultiheadAttention):
        return model
    for name, child in list(model.named_children()):
        setattr(model, name, to_fp8_training(child, history, margin, scaled))
    return model
