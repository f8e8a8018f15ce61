"""Checks for lesson 7's exercises: a static loss scale read off this run's gradients (a loss
multiplied by a factor drawn afresh every run, so the answer is the run's), and stochastic
rounding to fp16.

Micikevicius et al. 2018; the article's lower precision. Each check is a probe (runs in the
student's kernel, returns plain data) and a judge (decides from the data; the grader runs it
outside the kernel): see :mod:`course_lib.exercises.common`. The rounding's judge draws its inputs
itself and takes only the rounded values from the data (:mod:`course_lib.exercises.cases`).
"""

from __future__ import annotations

import numpy as np
import torch

from course_lib import number_formats as nf
from course_lib.exercises.cases import merged
from course_lib.exercises.common import (
    ExerciseFailed,
    HiddenTestFailed,
    check_drawn,
    checked,
    hidden_seed,
    is_number,
    is_whole,
)

FP16_MAX = 65504.0
FRACTION_TOL = 1e-9  # absolute: one gradient in 65 536 is 1.5e-5, so the count must be exact


def draw_loss_factor(rng) -> float:
    """Exercise 1's loss factor c = 10**U(-2, 2): ``common.drawn("lesson07.loss_factor",
    draw_loss_factor)`` in the notebook (fresh every run; the grader's run seeds it)."""
    return float(10 ** rng.uniform(-2, 2))


def _scaled(gradients, loss_factor):
    g = torch.as_tensor(gradients).detach()
    return g if loss_factor is None else g * loss_factor  # as the notebook scales them


def _factor_drawn(data):
    if data.get("loss_factor") is not None:  # the grader checks it is the run's own draw
        check_drawn("lesson07.loss_factor", draw_loss_factor, data["loss_factor"])


def _probe_safe_scale(log2_scale, gradients, loss_factor=None) -> dict:
    """``log2_scale``: the student's k; ``gradients``: this run's activation gradients, times
    ``loss_factor`` when one is given."""
    g = _scaled(gradients, loss_factor).double()
    return {"k": log2_scale, "largest": g.abs().max().item(), "count": g.numel(),
            "loss_factor": loss_factor}


def _judge_safe_scale(data) -> str:
    _factor_drawn(data)
    k, largest = data["k"], float(data["largest"])
    if not is_whole(k):
        raise ExerciseFailed(f"give k as a whole number (the scale is 2**k), not {k!r}")
    k = int(k)
    if not 0 < largest < float("inf"):
        raise ExerciseFailed("pass this run's activation gradients (my_gradients)")

    def overflows(j):
        return bool(torch.isinf((torch.tensor(largest) * 2.0 ** j).half()))

    if overflows(k):
        raise ExerciseFailed(f"at S = 2^{k} the largest activation gradient of this run "
                             f"({largest:.3g}) becomes inf in fp16")
    if not overflows(k + 1):
        raise ExerciseFailed(f"S = 2^{k} is safe, but so is 2^{k + 1}: find the largest")
    return (f"correct: S = 2^{k} is the largest power of two at which none of this run's "
            f"{data['count']} activation gradients overflows in fp16")


check_safe_scale = checked("lesson07.safe_scale", _probe_safe_scale, _judge_safe_scale)
check_safe_scale.__doc__ = """Check ``k``, the largest whole number such that a static loss
scale S = 2**k lets no activation gradient of this run overflow in fp16:
``check_safe_scale(k, my_gradients)``."""


def _probe_flushed(flushed, gradients, loss_factor=None) -> dict:
    """``flushed``: the student's fraction of the non-zero gradients that become 0 in fp16 at
    S = 1; ``gradients``: this run's activation gradients (of a loss factor drawn afresh every
    run). They travel as they are (fp32: ~1.6 MB of JSON for 65 536 values); the judge counts."""
    g = _scaled(gradients, loss_factor).flatten()
    return {"flushed": flushed, "gradients": g if g.is_floating_point() else g.double(),
            "loss_factor": loss_factor}


def _judge_flushed(data) -> str:
    _factor_drawn(data)
    flushed, g = data["flushed"], data["gradients"]
    if isinstance(flushed, torch.Tensor) and flushed.numel() == 1 and flushed.is_floating_point():
        flushed = flushed.item()
    if not is_number(flushed):
        raise ExerciseFailed(f"give flushed as a number between 0 and 1, not {flushed!r}")
    g = g.double() if isinstance(g, torch.Tensor) else torch.zeros(0, dtype=torch.float64)
    nonzero = g[g != 0]
    if not len(nonzero) or not torch.isfinite(nonzero).all():
        raise ExerciseFailed("pass this run's activation gradients (my_gradients)")
    # The reference by a property, not by casting: a value becomes 0 in fp16 exactly when
    # |v| <= half the smallest subnormal (that tie rounds to the even neighbour, 0).
    zeros = int((nonzero.abs() <= nf.smallest_subnormal(torch.float16) / 2).sum())
    right = zeros / len(nonzero)
    if abs(flushed - right) > FRACTION_TOL:
        if flushed > 1 and abs(flushed / 100 - right) <= FRACTION_TOL:
            why = "that is a percentage: give the fraction (between 0 and 1)"
        elif flushed == 0:
            why = ("0 is what the largest safe scale loses; the exercise asks for S = 1, no "
                   "loss scaling")
        else:
            why = (f"it is too {'high' if flushed > right else 'low'} (tolerance "
                   f"{FRACTION_TOL:g}): count the gradients that are 0 after .half(), over "
                   f"the non-zero ones")
        raise ExerciseFailed(f"flushed = {flushed!r} is not the fraction of this run's "
                             f"{len(nonzero)} non-zero activation gradients that become 0 in "
                             f"fp16 at S = 1: {why}")
    return (f"correct: without loss scaling {zeros} of this run's {len(nonzero)} non-zero "
            f"activation gradients ({right:.2%}) become 0 in fp16")


check_flushed_fraction = checked("lesson07.flushed_fraction", _probe_flushed, _judge_flushed)
check_flushed_fraction.__doc__ = """Check ``flushed``, the fraction of this run's non-zero
activation gradients that become 0 in fp16 without loss scaling (S = 1), within 1e-9:
``check_flushed_fraction(flushed, my_gradients)``."""


def _cases(seed):
    """The inputs: on the fp16 grid and between its points, both signs, small and large; a
    graded run adds values drawn at random for that run."""
    visible = torch.cat([torch.linspace(1.0, 1.01, 41), torch.linspace(-3.0, 3.0, 61),
                         torch.tensor([1000.3, -0.1, 2.0 ** -20, 60000.7])]).double()
    cases = {"visible": visible}
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        cases["hidden"] = ((torch.rand(300, generator=g, dtype=torch.float64) - 0.5)
                           * 2 ** torch.randint(-12, 14, (300,), generator=g))
    return cases


def _probe_fp16_round(stochastic_round, draws: int = 200) -> dict:
    data = {}
    for name, x in _cases(hidden_seed()).items():
        g = torch.Generator().manual_seed(7)
        out = [stochastic_round(x, g) for _ in range(draws)]
        if any(not isinstance(r, torch.Tensor) or r.shape != x.shape for r in out):
            raise ExerciseFailed(f"return a tensor of x's shape {tuple(x.shape)}")
        data[name] = {"x": x, "r": torch.stack([r.double() for r in out])}
    return data


def _neighbours(x: np.ndarray):
    """The fp16 values just below and just above each x (equal where x is one). The student
    edition of the library leaves this out: it is the exercise's hard part."""
    ### BEGIN SOLUTION
    h = x.astype(np.float16)
    lo = np.where(h.astype(np.float64) > x, np.nextafter(h, np.float16(-np.inf)), h)
    hi = np.where(h.astype(np.float64) < x, np.nextafter(h, np.float16(np.inf)), h)
    return lo.astype(np.float64), hi.astype(np.float64)
    ### END SOLUTION


# the visible values' fp16 neighbours, below then above (float16 bytes, hex; a test holds them to
# the reference): the student edition, which lacks that, judges the visible values with them
VISIBLE_NEIGHBOURS = (
    "003c003c003c003c013c013c013c013c023c023c023c023c033c033c033c033c043c043c043c043c053c053c053c"
    "053c063c063c063c063c073c073c073c073c083c083c083c083c093c093c093c093c0a3c00c2cdc19ac167c134c1"
    "00c1cdc09ac067c034c000c09abf34bfcdbe67be00be9abd34bdcdbc67bc00bc34bb67ba9ab9cdb800b867b6cdb4"
    "67b267ae0180662e6632cc346636ff37cc389939663a333b003c663ccc3c333d993d003e663ecc3e333f993f0040"
    "334066409940cc400041334166419941cc410042d06367ae1000537b003c013c013c013c023c023c023c023c033c"
    "033c033c033c043c043c043c043c053c053c053c053c063c063c063c063c073c073c073c073c083c083c083c083c"
    "093c093c093c093c0a3c0a3c0a3c0a3c0b3c00c2ccc199c166c133c100c1ccc099c066c033c000c099bf33bfccbe"
    "66be00be99bd33bdccbc66bc00bc33bb66ba99b9ccb8ffb766b6ccb466b266ae0080672e6732cd3467360038cd38"
    "9a39673a343b003c673ccd3c343d9a3d003e673ecd3e343f9a3f0040344067409a40cd400041344167419a41cd41"
    "0042d16366ae1000547b"
)


def _neighbours_or_visible(x: np.ndarray):
    try:
        return _neighbours(x)
    except NotImplementedError:  # the student edition
        both = np.frombuffer(bytes.fromhex("".join(VISIBLE_NEIGHBOURS)), dtype=np.float16)
        if not np.array_equal(x, _cases(None)["visible"].numpy()):
            raise
        return both[:x.size].astype(np.float64), both[x.size:].astype(np.float64)


def _judge_one(x, r) -> str | None:
    """What is wrong with rounding x to r (draws x values), or None."""
    if not isinstance(r, torch.Tensor) or r.ndim != 2 or r.shape[1] != x.numel() \
            or len(r) < 2:
        return f"expected draws of {x.numel()} rounded values"
    x, r = x.numpy(), r.double().numpy()
    lo, hi = _neighbours_or_visible(x)
    if not np.all((r == lo) | (r == hi)):
        i = np.argwhere(~((r == lo) | (r == hi)))[0]
        v = float(x[i[1]])
        return (f"x = {v!r} gave {float(r[tuple(i)])!r}: the result must be one of the two "
                f"fp16 values around x ({float(lo[i[1]])!r} or {float(hi[i[1]])!r})")
    between = hi > lo
    if between.any() and np.all(r[:, between] == r[0, between]):
        return "every draw gives the same result: round at random, with the generator"
    gap = np.where(hi > lo, hi - lo, 1.0)
    bias = np.abs((r - x).mean(axis=0) / gap)
    if bias.max() > 0.2:
        v = float(x[int(bias.argmax())])
        return (f"biased: averaged over {len(r)} draws, x = {v!r} is off by {bias.max():.2f} "
                f"of its gap; round up with probability (x - below) / (above - below)")
    return None


def _judge_fp16_round(data) -> str:
    own = {name: {"x": x} for name, x in _cases(hidden_seed()).items()}
    data = merged(own, data, ("r",))  # the inputs drawn here, not read
    wrong = _judge_one(data["visible"]["x"], data["visible"]["r"])
    if wrong:
        raise ExerciseFailed(wrong)
    if "hidden" in data and _judge_one(data["hidden"]["x"], data["hidden"]["r"]):
        raise HiddenTestFailed("a hidden case failed")
    n = data["visible"]["x"].numel()
    return (f"correct: each of {n} values rounds to one of its two fp16 neighbours, at random, "
            f"without bias")


check_fp16_stochastic_round = checked("lesson07.fp16_stochastic_round", _probe_fp16_round,
                                      _judge_fp16_round)
check_fp16_stochastic_round.__doc__ = """Check ``stochastic_round(x, generator)``: x (float64)
rounded to one of the two fp16 values around it, up with probability proportional to how close
the upper one is, using the generator."""
