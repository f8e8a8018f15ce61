"""Four bits and one bit a number: packing, per-group scales, and the compressors built on them.

Lecture: the course article's last trend, "lower precision computation, such as INT4 and binary
computation". A tensor quantised to b bits keeps a **code** per number, an integer in
[-(2^(b-1) - 1), 2^(b-1) - 1], and a **scale** per group of numbers: x ~ code x scale. One scale
for the whole tensor (per tensor) lets its largest entry set the step for all; a scale per group
of g numbers (per group, as INT4 weight formats and FP8 block scaling do) follows the tensor's
local size, for 32 / g more bits a number. Codes travel packed: **two 4-bit codes a byte**,
**eight signs a byte**. Rounding is to the nearest level, or stochastic (unbiased).

Three ways to send a gradient in few bits, each a compressor for
:func:`course_lib.compression.compressed_mean` (``all_reduce(grads, group)`` -> the mean as
delivered, the bytes this rank sent, what counts as sent for error feedback):

* :class:`SignCompressor`: one bit a number and one scale a tensor, the mean |g| (Karimireddy et
  al. 2019, EF-signSGD), or signSGD's **majority vote** (Bernstein et al. 2018): the update is
  the sign of the sum of the ranks' signs. Packed signs travel by all-gather.
* :class:`QSGDCompressor`: QSGD's s levels of |g| / ||g||, stochastic, with the sign (Alistarh
  et al. 2017): unbiased, its variance at most min(d / s^2, sqrt(d) / s) ||g||^2. With s <= 7 a
  code is 4 bits.
* :class:`Int4Compressor`: INT4 codes with a scale per group. The ranks' scales differ, and a
  sum of p codes needs about log2 p more bits than one: codes are gathered and summed after
  unpacking, in float32, never in 4 bits.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.distributed as dist

from course_lib.compression import flatten, split_like
from course_lib.training import check_whole


def levels(bits: int) -> int:
    """The largest code of a symmetric ``bits``-bit format: 2^(bits-1) - 1 (7 for INT4)."""
    if isinstance(bits, bool) or not isinstance(bits, numbers.Integral) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be a whole number from 2 to 8, got {bits!r}")
    return 2 ** (bits - 1) - 1


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Codes in [-8, 7] (any integer dtype, any shape), two to a byte: uint8, ceil(n / 2)
    bytes; the first code in the low four bits."""
    if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
        raise ValueError(f"4-bit codes are integers: round them first, got {codes.dtype}")
    wide = codes.reshape(-1).to(torch.int64)
    if wide.numel() and (wide.min() < -8 or wide.max() > 7):
        raise ValueError(f"4-bit codes lie in [-8, 7], got {wide.min().item()} to "
                         f"{wide.max().item()}")
    flat = wide.to(torch.int16)
    if flat.numel() % 2:
        flat = torch.cat([flat, flat.new_zeros(1)])
    nibbles = (flat & 0xF).view(-1, 2)
    return (nibbles[:, 0] | (nibbles[:, 1] << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` codes of :func:`pack_int4`'s bytes, as int8."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) \
            or not 0 <= n <= 2 * packed.numel():
        raise ValueError(f"{packed.numel()} bytes hold at most {2 * packed.numel()} codes, "
                         f"asked for {n}")
    b = packed.to(torch.int16)
    nibbles = torch.stack([b & 0xF, b >> 4], dim=1).reshape(-1)[:n]
    return torch.where(nibbles > 7, nibbles - 16, nibbles).to(torch.int8)


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """One bit a number, eight to a byte (uint8, ceil(n / 8) bytes): 1 for x >= 0, 0 below."""
    bits = (x.reshape(-1) >= 0).to(torch.uint8)
    if bits.numel() % 8:
        bits = torch.cat([bits, bits.new_zeros(8 - bits.numel() % 8)])
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=x.device)
    return (bits.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` signs of :func:`pack_signs`'s bytes, as float32 +1 / -1."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) \
            or not 0 <= n <= 8 * packed.numel():
        raise ValueError(f"{packed.numel()} bytes hold at most {8 * packed.numel()} signs, "
                         f"asked for {n}")
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed.reshape(-1, 1) >> shifts) & 1
    return bits.reshape(-1)[:n].to(torch.float32) * 2 - 1


def quantize_groups(x: torch.Tensor, bits: int, group: int | None = None, *,
                    stochastic: bool = False, generator: torch.Generator | None = None):
    """(codes, scales): ``x`` flattened, in groups of ``group`` numbers (None: one group, per
    tensor; the last group may be shorter), each group's scale its largest |x| / levels(bits)
    (a group of zeros gets scale 1), each code round(x / scale) -- to the nearest level, or
    stochastically (unbiased: E[code] = x / scale). Codes are int8, scales float32. NaN and inf
    are refused: a scale cannot hold them."""
    top = levels(bits)
    flat = x.reshape(-1).float()
    n = flat.numel()
    group = _group(group, n)
    if not torch.isfinite(flat).all():
        raise ValueError("cannot quantise NaN or inf: no scale holds them (check the gradients "
                         "for an overflow first)")
    if n == 0:
        return torch.zeros(0, dtype=torch.int8), torch.zeros(0)
    pad = (-n) % group
    padded = torch.cat([flat, flat.new_zeros(pad)]).view(-1, group)
    scales = padded.abs().amax(dim=1) / top
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    scaled = padded / scales[:, None]
    if stochastic:
        low = scaled.floor()
        noise = torch.rand(scaled.shape, generator=generator, device=scaled.device)
        scaled = low + (noise < scaled - low).float()
    else:
        scaled = scaled.round()
    return scaled.clamp(-top, top).reshape(-1)[:n].to(torch.int8), scales


def _group(group, n: int) -> int:
    """``group`` checked, or the whole tensor for None."""
    if group is None:
        return max(n, 1)
    if isinstance(group, bool) or not isinstance(group, numbers.Integral) or group < 1:
        raise ValueError(f"group must be a positive whole number of numbers, got {group!r}")
    return group


def dequantize_groups(codes: torch.Tensor, scales: torch.Tensor, group: int | None = None):
    """Codes times their group's scale, float32 (``group`` as :func:`quantize_groups` had)."""
    n = codes.numel()
    group = _group(group, n)
    if scales.numel() != math.ceil(n / group):
        raise ValueError(f"{n} codes in groups of {group} have {math.ceil(n / group)} scales, "
                         f"got {scales.numel()}: pass the group they were quantised with")
    per = scales.repeat_interleave(group)[:n]
    return codes.float() * per


def group_error(x: torch.Tensor, bits: int, groups) -> dict:
    """Relative error ||x - dequantised|| / ||x|| of nearest rounding for each group size in
    ``groups`` (None: per tensor)."""
    norm = x.float().norm().item() or 1.0
    out = {}
    for g in groups:
        codes, scales = quantize_groups(x, bits, g)
        out[g] = (dequantize_groups(codes, scales, g) - x.reshape(-1).float()).norm().item() / norm
    return out


def _as(flat, grads):
    """``flat`` cut into the gradients' shapes, each in its gradient's dtype."""
    return [piece.to(g.dtype) for piece, g in zip(split_like(flat, grads), grads, strict=True)]


def _same_size(flat, group) -> None:
    """Refuse, on every rank alike, gradients whose sizes differ between the ranks, or that hold
    NaN or inf on any rank (a diverged run: no code or sign stands for them)."""
    mine = torch.tensor([flat.numel(), bool(torch.isfinite(flat).all())], device=flat.device)
    sizes, finite = zip(*(t.tolist() for t in _gather(mine, group)), strict=True)
    if len(set(sizes)) > 1:
        raise ValueError(f"the ranks' gradients hold different numbers of values: {list(sizes)}")
    if not all(finite):
        bad = [rank for rank, ok in enumerate(finite) if not ok]
        raise ValueError(f"the gradients of rank(s) {bad} hold NaN or inf: the run diverged "
                         f"(try a smaller learning rate) and no low-bit code can send them")


def _gather(tensor, group):
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return parts


class SignCompressor:
    """One bit a number and a float32 scale per tensor, its mean |g| (a tensor of zeros, like an
    unused parameter's, scales to 0): every rank's packed signs and scales are gathered.
    ``majority=False``: the mean of the ranks' scale x sign (EF-signSGD's compressor);
    ``majority=True``: signSGD with majority vote, the mean scale times the sign of the sum of
    the signs (0 on a tie)."""

    def __init__(self, majority: bool = False):
        self.majority = majority
        self.name = "signSGD, majority vote" if majority else "sign x mean |g|"

    def all_reduce(self, grads, group=None):
        flat = flatten([g.double() for g in grads])
        n = flat.numel()
        _same_size(flat, group)
        sizes = torch.tensor([g.numel() for g in grads], device=flat.device)
        scale = torch.stack([g.double().abs().mean() if g.numel() else flat.new_zeros(())
                             for g in grads]).float()
        packed = pack_signs(flat)
        signs = [unpack_signs(p, n).double() for p in _gather(packed, group)]
        scales = [s.double().repeat_interleave(sizes) for s in _gather(scale, group)]
        if self.majority:
            mean = torch.stack(scales).mean(dim=0) * torch.sign(torch.stack(signs).sum(dim=0))
        else:
            mean = torch.stack([s * z for s, z in zip(scales, signs, strict=True)]).mean(dim=0)
        sent = scale.double().repeat_interleave(sizes) * unpack_signs(packed, n).double()
        return _as(mean, grads), packed.numel() + 4 * scale.numel(), _as(sent, grads)


class QSGDCompressor:
    """QSGD with ``s`` levels (1 <= s <= 7: sign and level fit 4 bits) in buckets of ``bucket``
    numbers (None: one bucket, the paper's analysis; its experiments bucket): each rank sends
    each bucket's norm and, per number, sign x a stochastic level l in 0..s with
    E[l] = s |g| / ||bucket||. Every rank's codes are gathered and the decoded gradients
    averaged. ``seed``: the rounding's."""

    def __init__(self, s: int = 7, bucket: int | None = None, seed: int = 0):
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 1 <= s <= 7:
            raise ValueError(f"QSGD's levels s must be a whole number from 1 to 7 (4-bit codes), "
                             f"got {s!r}")
        if bucket is not None and (isinstance(bucket, bool)
                                   or not isinstance(bucket, numbers.Integral) or bucket < 1):
            raise ValueError(f"bucket must be a positive whole number, got {bucket!r}")
        self.s, self.bucket, self.seed, self.calls = s, bucket, seed, 0
        self.name = f"QSGD s = {s}" + (f", buckets of {bucket}" if bucket else "")

    def encode(self, flat, generator):
        """(codes in [-s, s], each bucket's norm): the rank's message before packing."""
        n = flat.numel()
        b = self.bucket or max(n, 1)
        flat = flat.double()  # a norm in float16 or float32 can overflow
        rows = torch.cat([flat, flat.new_zeros((-n) % b)]).view(-1, b)
        norms = rows.norm(dim=1)
        scaled = rows.abs() / torch.where(norms > 0, norms, 1.0)[:, None] * self.s
        low = scaled.floor()
        level = low + (torch.rand(scaled.shape, generator=generator) < scaled - low).to(low.dtype)
        return (torch.sign(rows) * level).reshape(-1)[:n].to(torch.int8), norms

    def decode(self, codes, norms):
        """Codes times their bucket's norm / s."""
        b = self.bucket or max(codes.numel(), 1)
        return codes.double() * norms.double().repeat_interleave(b)[:codes.numel()] / self.s

    def all_reduce(self, grads, group=None):
        flat = flatten([g.double() for g in grads])
        n = flat.numel()
        _same_size(flat, group)
        generator = torch.Generator().manual_seed(
            self.seed * 1_000_003 + self.calls * 1009 + dist.get_rank())
        self.calls += 1
        codes, norms = self.encode(flat.cpu(), generator)
        packed, norms = pack_int4(codes).to(flat.device), norms.float().to(flat.device)
        decoded = [self.decode(unpack_int4(p, n), r)
                   for p, r in zip(_gather(packed, group), _gather(norms, group), strict=True)]
        sent = self.decode(codes, norms).to(flat.device)
        n_bytes = packed.numel() + 4 * norms.numel()
        return _as(torch.stack(decoded).mean(dim=0), grads), n_bytes, _as(sent, grads)


class Int4Compressor:
    """INT4 codes (nearest) with a float32 scale per ``group`` numbers: each rank's packed codes
    and scales are gathered, unpacked and summed in float32 (a sum of codes would overflow 4
    bits)."""

    def __init__(self, group: int = 64):
        if isinstance(group, bool) or not isinstance(group, numbers.Integral) or group < 1:
            raise ValueError(f"group must be a positive whole number, got {group!r}")
        self.group, self.name = group, f"INT4, groups of {group}"

    def all_reduce(self, grads, group=None):
        flat = flatten([g.double() for g in grads])
        n = flat.numel()
        _same_size(flat, group)
        codes, scales = quantize_groups(flat, 4, self.group)
        packed = pack_int4(codes).to(flat.device)
        scales = scales.to(flat.device)
        total = sum(dequantize_groups(unpack_int4(p, n), s, self.group)
                    for p, s in zip(_gather(packed, group), _gather(scales, group), strict=True))
        sent = dequantize_groups(codes, scales, self.group)
        n_bytes = packed.numel() + 4 * scales.numel()
        return _as(total / dist.get_world_size(group), grads), n_bytes, _as(sent, grads)


def qsgd_variance_bound(d: int, s: int) -> float:
    """QSGD's bound on E||Q(g) - g||^2 / ||g||^2 for d numbers (a bucket's) and s levels
    (Alistarh et al. 2017, Lemma 3.1): min(d / s^2, sqrt(d) / s)."""
    check_whole("d", d), check_whole("s", s)
    return min(d / s**2, math.sqrt(d) / s)
