"""Low-precision communication and compute: fewer bits per number sent or multiplied.

The course article: FP16 and FP8 to cut communication; lower precision (INT8, INT4) as a trend.
Two pieces, both with a per-tensor scale so that the format's range is used well:

* an **int8 quantised all-reduce**: every rank rounds its tensor to 255 levels of a scale all
  ranks share, exchanges the int8 codes (1 byte a number instead of 4) and adds them up. With
  **stochastic rounding** the rounding error is unbiased: it averages out over steps instead of
  piling up in one direction;
* **fp8** (e4m3 and e5m2) casts of a matrix product's inputs, as fp8 training does.

Lesson 7's "fewer bits on the wire": one gradient of the digits MLP summed over the ranks by
each of ``METHODS``, with the bytes each rank sends and the largest error::

    python -m course_lib.quantization --world-size 2 [--rows 128]
    torchrun --standalone --nproc-per-node 2 -m course_lib.quantization
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.distributed as dist

from course_lib.cost_models import all_reduce_bytes, quantized_sum_error_bound
from course_lib.report import times_as
from course_lib.runtime.devices import device
from course_lib.runtime.torchrun import run_command, run_main
from course_lib.training import is_whole

INT8_LEVELS = 127  # codes -127..127: symmetric, so 0 is exact
METHODS = ("fp32", "bf16", "fp16", "int8 stochastic", "int8 nearest")


def stochastic_round(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Round down or up at random, up with probability equal to the fraction: floor(x + u),
    u uniform in [0, 1). Unbiased (E[round(x)] = x) and off by less than 1. The noise comes
    from a CPU generator, so every device rounds the same way for the same seed."""
    u = torch.rand(x.shape, generator=generator, dtype=x.dtype).to(x.device)
    return torch.floor(x + u)


def quantize(x: torch.Tensor, scale: float, *, stochastic: bool = True,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """int8 codes q with q * scale ~ x (|x| <= 127 scale for every entry)."""
    if not torch.isfinite(x).all():
        raise ValueError("x has inf or NaN entries: int8 codes and their scale need finite ones")
    if isinstance(scale, torch.Tensor) and scale.numel() == 1:
        scale = scale.item()  # e.g. x.abs().max() / 127
    if isinstance(scale, bool) or not (isinstance(scale, numbers.Real) and 0 < scale < math.inf):
        raise ValueError(f"scale must be a positive, finite number, got {scale!r}")
    levels = x / scale
    rounded = stochastic_round(levels, generator) if stochastic else torch.round(levels)
    return rounded.clamp(-INT8_LEVELS, INT8_LEVELS).to(torch.int8)


def shared_scale(x: torch.Tensor, group=None) -> float:
    """Run on every rank of ``group``: the scale all ranks use, max over ranks of max |x| / 127.
    Refused on every rank together where any rank's x has inf or NaN entries."""
    if not x.is_floating_point():
        raise ValueError(f"int8 codes quantise floating-point gradients, got {x.dtype}: cast "
                         f"x first (its sum would be truncated back to {x.dtype})")
    finite = bool(torch.isfinite(x).all())
    largest = x.abs().max() if x.numel() else torch.tensor(0.0)  # an empty x: nothing to scale
    amax = (largest if finite else torch.tensor(math.inf)).reshape(1).double().to(x.device)
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    if amax.item() == math.inf:
        raise ValueError("a rank's x has inf or NaN entries: int8 codes need finite ones")
    return amax.item() / INT8_LEVELS


def quantized_all_reduce(x: torch.Tensor, *, stochastic: bool = True, seed: int = 0,
                         group=None) -> dict:
    """Run on every rank of ``group``: the sum over ranks of ``x``, sent as int8 codes.

    Each rank quantises with the shared scale (stochastic rounding seeded by seed and rank), the
    ranks all-gather their codes and every rank adds them in int32. Returns the ``sum``, the
    ``scale``, the ``bound`` of ``cost_models.quantized_sum_error_bound`` and the
    ``bytes_sent`` by this rank: its n codes to each of the p - 1 others (the ring all-reduce of
    fp32 sends 2 (p-1)/p 4n)."""
    p, x = dist.get_world_size(group), x.to(device(group))
    scale = shared_scale(x, group)
    if scale == 0.0:  # every rank holds zeros
        return dict(sum=torch.zeros_like(x), scale=0.0, bound=0.0, bytes_sent=0)
    generator = torch.Generator().manual_seed(seed * 1009 + dist.get_rank(group))
    codes = quantize(x.double(), scale, stochastic=stochastic, generator=generator)
    gathered = [torch.empty_like(codes) for _ in range(p)]
    dist.all_gather(gathered, codes, group=group)
    total = torch.stack(gathered).to(torch.int32).sum(dim=0)
    return dict(sum=(total.double() * scale).to(x.dtype), scale=scale,
                bound=quantized_sum_error_bound(p, scale, stochastic),
                bytes_sent=codes.numel() * (p - 1))


def simulate_quantized_sum(tensors, *, stochastic: bool = True, seed: int = 0) -> torch.Tensor:
    """What :func:`quantized_all_reduce` computes, on one process from every rank's tensor."""
    if not tensors or len({t.shape for t in tensors}) > 1:
        raise ValueError(f"give one tensor per rank, all of one shape, got "
                         f"{[tuple(t.shape) for t in tensors]}")
    scale = max(t.abs().max().item() if t.numel() else 0.0 for t in tensors) / INT8_LEVELS
    if scale == 0.0:  # every rank holds zeros, as in quantized_all_reduce
        return torch.zeros_like(tensors[0])
    codes = [quantize(t.double(), scale, stochastic=stochastic,
                      generator=torch.Generator().manual_seed(seed * 1009 + rank))
             for rank, t in enumerate(tensors)]
    return (torch.stack(codes).to(torch.int32).sum(dim=0).double() * scale).to(tensors[0].dtype)


def compressed_all_reduce(x: torch.Tensor, method: str, seed: int = 0, group=None) -> dict:
    """Run on every rank of ``group``: sum ``x`` over ranks by one of ``METHODS``; returns the
    ``sum`` and the ``bytes_sent`` by one rank (the ring formula for the fp all-reduces, counted
    for int8)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: use one of {METHODS}")
    if method.startswith("int8"):
        out = quantized_all_reduce(x, stochastic=method.endswith("stochastic"), seed=seed,
                                   group=group)
        return dict(sum=out["sum"], bytes_sent=out["bytes_sent"])
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[method]
    message = x.to(device(group), dtype, copy=True)  # never reduce into the caller's tensor
    dist.all_reduce(message, group=group)
    n_bytes = message.numel() * message.element_size()
    return dict(sum=message.to(x.dtype), bytes_sent=all_reduce_bytes(
        "efficient ring", n_bytes, dist.get_world_size(group)))


# -- fp8 ------------------------------------------------------------------------------------------


def to_fp8(x: torch.Tensor, dtype, scaled: bool = True) -> tuple[torch.Tensor, float]:
    """Cast to an fp8 format; with ``scaled``, first multiply by max(format) / max |x| so the
    tensor's largest entry lands on the format's largest value (an all-zero tensor keeps scale 1:
    its codes are zeros). Returns (codes, scale)."""
    if not (dtype.is_floating_point and torch.finfo(dtype).bits == 8):
        raise ValueError(f"dtype must be an fp8 format (torch.float8_e4m3fn, torch.float8_e5m2), "
                         f"got {dtype}")
    largest = x.abs().max().item() if x.numel() else 0.0
    if scaled and not math.isfinite(largest):
        raise ValueError("x has inf or NaN entries: a per-tensor scale needs a finite max |x|")
    scale = torch.finfo(dtype).max / largest if scaled and largest > 0 else 1.0
    return (x * scale).to(dtype), scale


def fp8_matmul(a: torch.Tensor, b: torch.Tensor, dtype, scaled: bool = True) -> torch.Tensor:
    """a @ b with both inputs cast to fp8 (per-tensor scales), multiplied and accumulated in
    fp32 and scaled back — what fp8 matrix units do."""
    a8, sa = to_fp8(a, dtype, scaled)
    b8, sb = to_fp8(b, dtype, scaled)
    return (a8.float() @ b8.float()) / (sa * sb)


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """||approx - exact|| / ||exact|| (Frobenius); inf when approx has infs or NaNs, or differs
    from an all-zero ``exact``."""
    if approx.shape != exact.shape:
        raise ValueError(f"approx and exact differ in shape: {tuple(approx.shape)} and "
                         f"{tuple(exact.shape)}")
    if not torch.isfinite(approx).all():
        return float("inf")
    error, size = (approx.double() - exact.double()).norm(), exact.double().norm()
    return (error / size).item() if size > 0 else (0.0 if error == 0 else float("inf"))


# -- lesson 7's sums, as a command -----------------------------------------------------------------


def sum_one_gradient(rows: int = 128, seed: int = 0, group=None) -> dict:
    """Run on every rank r of ``group``: the digits MLP's weight gradient on training rows
    r * rows .. (r + 1) * rows, summed over the ranks by each method. Returns per method the
    largest |error| against the exact (float64) sum and the bytes this rank sent, the int8
    ``bound`` and ``scale``, and the gradient's ``numel``."""
    from course_lib.data import load_digits
    from course_lib.mixed_precision import gradient_values
    from course_lib.models import digits_mlp

    digits, rank, p = load_digits(), dist.get_rank(group), dist.get_world_size(group)
    if not (is_whole(rows) and 1 <= rows * p <= len(digits.y_train)):
        raise ValueError(f"rows per rank must be a whole number from 1 to "
                         f"{len(digits.y_train) // p} ({len(digits.y_train)} training digits over "
                         f"{p} ranks), got {rows!r}")
    mine = torch.arange(rank * rows, (rank + 1) * rows)
    gradient = gradient_values(digits_mlp(seed=seed), digits.x_train[mine],
                               digits.y_train[mine])["weights"].to(device(group))
    exact = gradient.double().clone()
    dist.all_reduce(exact, group=group)
    out = {}
    for method in METHODS:
        result = compressed_all_reduce(gradient, method, seed=seed, group=group)
        out[method] = ((result["sum"].double() - exact).abs().max().item(), result["bytes_sent"])
    int8 = quantized_all_reduce(gradient, seed=seed, group=group)
    return dict(methods=out, bound=int8["bound"], scale=int8["scale"], numel=gradient.numel())


def main(argv=None):
    args, results = run_command(
        sum_one_gradient, "Lesson 7: one gradient summed over the ranks in fp32, bf16, fp16 and "
        "int8",
        (("--rows", int, 128, {"help": "training digits per rank"}), ("--seed", int, 0)), argv)
    if results is not None:  # the launcher, or rank 0 under torchrun
        p, first = len(results), results[0]
        errors = {m: max(r["methods"][m][0] for r in results) for m in METHODS}
        print(f"one gradient of the digits MLP ({first['numel']:,} numbers) summed over {p} ranks")
        for method in METHODS:
            print(f"{method:16s} sends {first['methods'][method][1]:8,.0f} bytes per rank, "
                  f"largest error {errors[method]:.2e}")
        nearest = quantized_sum_error_bound(p, first["scale"], stochastic=False)
        print(f"int8 errors within their bounds (stochastic p s = {first['bound']:.1e}, nearest "
              f"p s / 2 = {nearest:.1e}):", errors["int8 stochastic"] <= first["bound"]
              and errors["int8 nearest"] <= nearest)
        print("in this one sum, stochastic rounding's largest error is",
              times_as(errors["int8 stochastic"], errors["int8 nearest"], more="larger",
                       less="smaller"), "round-to-nearest's")
    return results


if __name__ == "__main__":
    run_main(main)
