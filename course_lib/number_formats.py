"""Number formats for mixed precision: what each one can hold, computed from the formats.

The course article's "FP16 and FP8 to cut communication" and lower precision (INT8, INT4) as a
trend; Micikevicius et al. 2018 for why fp16 training needs fp32 master weights and loss
scaling. Every number here comes from ``torch.finfo`` / ``torch.iinfo`` or from the bit patterns
themselves, never typed in.
"""

from __future__ import annotations

import math

import torch

FORMATS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
           "fp8 e4m3": torch.float8_e4m3fn, "fp8 e5m2": torch.float8_e5m2, "int8": torch.int8}

_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def smallest_subnormal(dtype) -> float:
    """The smallest positive value of a float format: the bit pattern 0...01."""
    width = torch.finfo(dtype).bits // 8
    return torch.tensor(1, dtype=_SAME_WIDTH_INT[width]).view(dtype).item()


def format_table(formats: dict | None = None) -> list[dict]:
    """One row per format: bits, largest value, smallest normal, smallest subnormal, epsilon
    (the gap between 1 and the next value). For int8 the "smallest" values are 1 and the gap is
    1: integers have no fraction bits."""
    rows = []
    for name, dtype in (formats or FORMATS).items():
        if dtype.is_floating_point:
            info = torch.finfo(dtype)
            rows.append(dict(name=name, dtype=dtype, bits=info.bits, max=info.max,
                             smallest_normal=info.smallest_normal,
                             smallest_subnormal=smallest_subnormal(dtype), eps=info.eps))
        else:
            info = torch.iinfo(dtype)
            rows.append(dict(name=name, dtype=dtype, bits=info.bits, max=float(info.max),
                             smallest_normal=1.0, smallest_subnormal=1.0, eps=1.0))
    return rows


def positive_values(dtype) -> torch.Tensor:
    """Every finite positive value of an 8- or 16-bit float format, in increasing order
    (enumerated from the bit patterns)."""
    width = torch.finfo(dtype).bits // 8
    if width > 2:
        raise ValueError(f"{dtype} has 2^{8 * width} bit patterns: too many to enumerate")
    patterns = torch.arange(1, 2 ** (8 * width - 1), dtype=torch.int32)  # sign bit 0
    values = patterns.to(_SAME_WIDTH_INT[width]).view(dtype).double()
    return values[torch.isfinite(values)].unique()


def fraction_flushed(values: torch.Tensor, dtype, scale: float = 1.0) -> dict:
    """Of the non-zero ``values`` (in fp32/fp64), the fraction that becomes 0 when multiplied by
    ``scale`` and cast to ``dtype`` ("zero"), that lands among the subnormals and keeps fewer
    significant bits ("subnormal"), and that overflows ("overflow": becomes inf in fp16, bf16 and
    e5m2, which round values up to half a step past the largest down to it; in e4m3, which has no
    inf, saturates at 448)."""
    try:  # a number, a numpy number or a one-number tensor; not a bool or text
        value = math.nan if isinstance(scale, bool | str | bytes) else float(scale)
    except (TypeError, ValueError):
        value = math.nan
    if not 0 < value < math.inf:
        raise ValueError(f"scale must be a positive, finite number, got {scale!r}")
    if values.isnan().any():
        raise ValueError("values holds NaN, which has no fate to count: take it out first")
    values = values[values != 0].double() * scale
    if not values.numel():
        raise ValueError("values holds no non-zero number: there is nothing whose fate to count")
    info = torch.finfo(dtype)
    small = values.abs() < info.smallest_normal
    cast = values.to(dtype).double()  # compared in float64: fp8 has no comparisons
    zero = cast == 0
    has_inf = math.isinf(torch.tensor(math.inf).to(dtype).double().item())
    over = cast.isinf() if has_inf else values.abs() > info.max
    return dict(zero=zero.double().mean().item(),
                subnormal=(small & ~zero).double().mean().item(),
                overflow=over.double().mean().item())


def update_is_lost(w: float, dw: float, dtype) -> bool:
    """Does w + dw round back to w in ``dtype``? In fp16, which keeps 11 significant bits, once
    |w| / |dw| reaches 2048 to 4096, by where w lies between two powers of two and the update's
    direction (Micikevicius et al. quote 2048: at a power of two, moving up)."""
    w_t = torch.tensor(w, dtype=dtype)
    if w_t.element_size() == 1:  # FP8: torch has no addition; add exactly, round once
        return bool((w_t.double() + torch.tensor(dw, dtype=dtype).double()).to(dtype) == w_t)
    return bool((w_t + torch.tensor(dw, dtype=dtype)) == w_t)
