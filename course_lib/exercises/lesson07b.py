"""Checks for lesson 7b's exercises: the one-bit all-reduce with error feedback (EF-signSGD's
compressor, written on real ranks), and the bytes a low-bit message takes.

Karimireddy et al. 2019 (error feedback fixes signSGD), Bernstein et al. 2018 (signSGD); the
course article's last trend, "INT4 and binary computation". Each check is a probe (runs in the
student's kernel, returns plain data) and a judge (decides from that data alone; the grader runs
it outside the kernel): see :mod:`course_lib.exercises.common`. Both judges draw their cases
themselves and take only the answers from the data (:mod:`.cases`).
"""

from __future__ import annotations

import math
import os

import torch
import torch.distributed as dist

from course_lib.exercises import practice
from course_lib.exercises.cases import merged, projections
from course_lib.exercises.common import (
    ExerciseFailed,
    HiddenTestFailed,
    checked,
    hidden_seed,
    is_whole,
    launch_checked,
)

# -- exercise 1: the one-bit all-reduce with error feedback -----------------------------------

STEPS = 4
EF_TOL = 1e-6  # relative; float64 throughout, but a sign vector made in float32 still passes


def ef_cases(seed) -> dict:
    """Gradients ``[rank][step]`` (float64) for each case: 2 ranks of a 2 x 5 gradient, some
    entries exactly 0 (a zero counts as +); a graded run adds 3 ranks of a 4 x 5 gradient
    whose magnitudes differ from rank to rank by up to 10^4."""
    g = torch.Generator().manual_seed(707)
    visible = torch.randn(2, STEPS, 10, generator=g, dtype=torch.float64).round(decimals=1)
    visible[0, 0, 3] = visible[1, 2, 7] = 0.0
    cases = {"visible": {"gradients": visible.reshape(2, STEPS, 2, 5)}}
    if seed is not None:
        g = torch.Generator().manual_seed(seed + 77)
        sizes = 10.0 ** torch.randint(-2, 3, (3, 1, 1, 1), generator=g)
        hidden = torch.randn(3, STEPS, 4, 5, generator=g, dtype=torch.float64) * sizes
        cases["hidden"] = [{"gradients": hidden}]
    return cases


def _ef_ranks(ef_sign_all_reduce, cases, salted=False):
    """On every rank: ``STEPS`` calls per case, each with this rank's gradient and the residual
    it returned last (zeros at first). Returns each step's mean and residual (copies). In a
    graded run (``salted``) each rank first adds an offset of its own, drawn from the operating
    system's randomness, to its gradients: no rank can know another's without a message."""
    rank = dist.get_rank()
    out = []
    for gradients in cases:
        offset = torch.zeros_like(gradients[rank][0])
        if salted:
            g = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
            offset = torch.randn(offset.shape, generator=g, dtype=offset.dtype) * \
                gradients[rank].abs().mean()
        residual, means, residuals = torch.zeros_like(offset), [], []
        for grad in gradients[rank]:
            got = ef_sign_all_reduce(grad + offset, residual.clone(), group=None)
            if not (isinstance(got, tuple) and len(got) == 2 and all(
                    isinstance(t, torch.Tensor) and t.shape == grad.shape
                    and t.is_floating_point() for t in got)):
                raise TypeError(f"ef_sign_all_reduce returned {type(got).__name__}: return "
                                f"(mean, residual), two real floating tensors of the "
                                f"gradient's shape {tuple(grad.shape)}")
            mean, residual = (t.detach().to("cpu", torch.float64, copy=True) for t in got)
            means.append(mean)
            residuals.append(residual.clone())
        out.append({"means": torch.stack(means), "residuals": torch.stack(residuals),
                    "offset": offset})
    return out


def _probe_ef(ef_sign_all_reduce, timeout: float = 60) -> dict:
    cases = ef_cases(hidden_seed())
    salted = hidden_seed() is not None
    hint = "does every rank call the same collectives, in the same order?"
    runs = [launch_checked(_ef_ranks, len(case["gradients"]),
                           (ef_sign_all_reduce, [case["gradients"]], salted), timeout=timeout,
                           hint=hint)
            for case in [cases["visible"], *cases.get("hidden", [])]]
    rows = [c | {"ranks": [r[0] for r in run]}
            for c, run in zip([cases["visible"], *cases.get("hidden", [])], runs, strict=True)]
    return {"visible": rows[0], "hidden": rows[1:]} if "hidden" in cases else {"visible": rows[0]}


def _malformed(case) -> str | None:
    """What is wrong with the data's form: a rank missing, or a mean, residual or offset not a
    real tensor of the right shape (in a graded run, each rank's offset must look drawn)."""
    gradients, ranks = case["gradients"], case["ranks"]
    if not isinstance(ranks, list) or len(ranks) != len(gradients):
        return f"expected the results of {len(gradients)} ranks"
    for r, rank in enumerate(ranks):
        if not isinstance(rank, dict):
            return f"rank {r} returned no results"
        shape = (STEPS, *gradients[r][0].shape)
        for key, want in (("means", shape), ("residuals", shape), ("offset", shape[1:])):
            t = rank.get(key)
            if not (isinstance(t, torch.Tensor) and tuple(t.shape) == want
                    and t.is_floating_point()):
                return f"rank {r}'s {key} is not a real tensor of shape {want}"
        size, drawn = gradients[r].abs().mean(), rank["offset"].abs().mean()
        if hidden_seed() is not None and not (0.05 * size <= drawn <= 5 * size):
            return f"rank {r}'s offset was not drawn by the check"
    return None


def ef_sign_reference(gradients):
    """(means [step], residuals [rank][step]) of EF-signSGD's compressor for ``gradients``
    ``[rank][step]``."""
    ### BEGIN SOLUTION
    p = len(gradients)
    residual = [torch.zeros_like(gradients[r][0]) for r in range(p)]
    means, residuals = [], [[] for _ in range(p)]
    for t in range(len(gradients[0])):
        sent = []
        for r in range(p):
            corrected = gradients[r][t] + residual[r]
            sign = torch.where(corrected >= 0, 1.0, -1.0).to(corrected.dtype)
            message = corrected.abs().mean() * sign
            residual[r] = corrected - message
            sent.append(message)
            residuals[r].append(residual[r])
        means.append(sum(sent) / p)
    return torch.stack(means), [torch.stack(e) for e in residuals]
    ### END SOLUTION


# the visible case's right means and residuals as cases.projections (a test holds them to the
# reference): the student edition, which lacks the reference, judges the visible case with them
VISIBLE_MEANS = [-0.8947140729229259, -0.697805499351948, -4.977772572482843]
VISIBLE_RESIDUALS = [-3.6834457545733565, 1.7015684434056262, 6.372400932087801]  # all ranks


def _hint(case) -> str:
    """What a wrong answer most likely missed, from its own outputs (no reference needed)."""
    ranks, p = case["ranks"], len(case["ranks"])
    means = [r["means"] for r in ranks]
    if not all(torch.isfinite(r[k]).all() for r in ranks for k in ("means", "residuals")):
        return "a mean or a residual holds NaN or inf"
    if any(not torch.allclose(m, means[0], rtol=0, atol=EF_TOL) for m in means):
        return "the ranks hold different means: every rank must end with the same average"
    if all(r["residuals"].abs().max() == 0 for r in ranks):
        return ("every residual is 0: error feedback keeps what was not sent, corrected minus "
                "the message, and adds it to the next step's gradient")
    return (f"on {p} ranks: each rank corrects its gradient by its residual, sends scale x "
            f"sign (scale = mean |corrected|, a zero counts as +), keeps corrected - message, "
            f"and every rank averages the {p} messages")


def _ef_wrong(case) -> str | None:
    if wrong := _malformed(case):
        return wrong
    ranks = case["ranks"]
    try:
        means, residuals = ef_sign_reference([g + rank["offset"].double() for g, rank in
                                              zip(case["gradients"], ranks, strict=True)])
    except NotImplementedError:  # the student edition: the visible case's fingerprints
        if any(rank["offset"].abs().max() > 0 for rank in ranks):  # a graded run's offsets:
            raise  # only the grader's library judges them
        got = [torch.as_tensor(projections(ranks[0]["means"])),
               torch.as_tensor(projections(torch.stack([r["residuals"] for r in ranks])))]
        right = [torch.as_tensor(v) for v in (VISIBLE_MEANS, VISIBLE_RESIDUALS)]
        same = all(torch.allclose(r["means"], ranks[0]["means"], rtol=0, atol=EF_TOL)
                   for r in ranks)
        if same and all(torch.allclose(a, b, rtol=EF_TOL, atol=EF_TOL * (1 + b.abs().max()))
                        for a, b in zip(got, right, strict=True)):
            return None
        return _hint(case)
    for r, rank in enumerate(ranks):
        for t in range(STEPS):
            for what, got, right in (("mean", rank["means"][t], means[t]),
                                     ("residual", rank["residuals"][t], residuals[r][t])):
                off = (got - right).abs().nan_to_num(nan=math.inf)
                if off.max() > EF_TOL * (1 + right.abs().max()):
                    return (f"step {t + 1}, rank {r}: the {what} is off by up to "
                            f"{off.max().item():.3g}. {_hint(case)}")
    return None


def _judge_ef(data) -> str:
    data = merged(ef_cases(hidden_seed()), data, ("ranks",))  # the gradients drawn here
    if wrong := _ef_wrong(data["visible"]):
        raise ExerciseFailed(wrong)
    if any(_ef_wrong(case) for case in data.get("hidden", [])):
        raise HiddenTestFailed("a hidden case failed")
    n = data["visible"]["gradients"][0][0].numel()
    graded = "" if "hidden" in data else " (the grader adds a case on 3 ranks)"
    return (f"correct: on 2 ranks for {STEPS} steps every mean and residual matches "
            f"EF-signSGD's{graded}. Sent as one bit a number, a message is {math.ceil(n / 8)} "
            f"bytes of signs and one scale, where float32 takes {4 * n}")


check_ef_sign = checked("lesson07b.ef_sign", _probe_ef, _judge_ef)
check_ef_sign.__doc__ = """Check ``ef_sign_all_reduce(grad, residual, group=None)``: launched on
2 ranks for 4 steps, each step's mean and residual on every rank equal EF-signSGD's (scale x
sign of the corrected gradient, the scale its mean |value|, averaged over the ranks)."""


# -- exercise 2: the bytes of a low-bit message -------------------------------------------------

MLP_SIZES = [4096, 64, 4096, 64, 640, 10]  # the lesson's digits MLP, tensor by tensor
VISIBLE_MESSAGES = [(MLP_SIZES, 1, None), (MLP_SIZES, 4, 64), (MLP_SIZES, 8, 64),
                    ([5, 3], 4, None), ([5, 3], 4, 4), ([7], 1, 3), ([1000], 3, 128)]


def _messages(seed) -> dict:
    """The visible messages (sizes, bits, group); a graded run adds eight drawn ones: 1 to 5
    tensors of 1 to 5,000 numbers, 1 to 8 bits, a group of 1 to 300 numbers or None."""
    cases = {"visible": [{"sizes": s, "bits": b, "group": g} for s, b, g in VISIBLE_MESSAGES]}
    if seed is not None:
        g = torch.Generator().manual_seed(seed + 707)

        def whole(lo, hi):
            return int(torch.randint(lo, hi + 1, (), generator=g))

        cases["hidden"] = [{"sizes": [whole(1, 5000) for _ in range(whole(1, 5))],
                            "bits": whole(1, 8), "group": None if k % 3 == 0 else whole(1, 300)}
                           for k in range(8)]
    return cases


def _probe_bytes(message_bytes) -> dict:
    data = {}
    for name, cases in _messages(hidden_seed()).items():
        rows = []
        for case in cases:
            got = message_bytes(list(case["sizes"]), case["bits"], case["group"])
            if not isinstance(got, (int, float)) and hasattr(got, "item"):
                try:  # a one-element tensor, a numpy integer or 0-d array
                    got = got.item()
                except (ValueError, RuntimeError):
                    pass
            if not is_whole(got):
                raise ExerciseFailed(f"message_bytes returned {got!r} for sizes "
                                     f"{case['sizes']}: return a whole number of bytes")
            rows.append(case | {"bytes": int(got)})
        data[name] = rows
    return data


def bytes_of_message(sizes, bits: int, group) -> int:
    """The bytes of one rank's message: ``bits`` a number, packed, over all of ``sizes``; a
    float32 scale per ``group`` numbers of the flattened gradients (None: one per tensor)."""
    ### BEGIN SOLUTION
    n = sum(sizes)
    scales = len(sizes) if group is None else math.ceil(n / group)
    return math.ceil(n * bits / 8) + 4 * scales
    ### END SOLUTION


def _plain_message(row) -> list:
    return [list(row["sizes"]), row["bits"], row["group"]]


def _bytes_wrong(rows) -> str | None:
    for row in rows:
        right = bytes_of_message(row["sizes"], row["bits"], row["group"])
        if row["bytes"] != right:
            return (f"sizes {row['sizes']}, {row['bits']} bits, group {row['group']}: "
                    f"{row['bytes']} bytes is not right. How many bytes do the codes fill when "
                    f"packed end to end, and how many float32 scales travel with them?")
    return None


def _judge_bytes(data) -> str:
    data = merged(_messages(hidden_seed()), data, ("bytes",))  # the messages drawn here
    try:
        wrong = _bytes_wrong(data["visible"])
    except NotImplementedError:  # the student edition: the visible cases' digests
        for row in data["visible"]:
            practice.judge("lesson07b.message_bytes", _plain_message(row),
                           {"bytes": row["bytes"]})
        return "correct for the visible messages (the grader runs your code on messages of its own)"
    if wrong:
        raise ExerciseFailed(wrong)
    if "hidden" in data and _bytes_wrong(data["hidden"]):
        raise HiddenTestFailed("a hidden case failed")
    mlp = data["visible"][:3]
    return (f"correct: the MLP's {sum(MLP_SIZES):,} gradients take "
            + ", ".join(f"{r['bytes']:,} bytes at {r['bits']} bit(s)" for r in mlp)
            + f", against {4 * sum(MLP_SIZES):,} in float32")


practice.register("lesson07b.message_bytes",
                  lambda case: {"bytes": [bytes_of_message(*case)]},
                  cases=[_plain_message(row) for row in _messages(None)["visible"]])

check_message_bytes = checked("lesson07b.message_bytes", _probe_bytes, _judge_bytes)
check_message_bytes.__doc__ = """Check ``message_bytes(sizes, bits, group)``: the bytes one rank
sends for gradients of ``sizes`` numbers, each a ``bits``-bit code packed end to end, with a
float32 scale per ``group`` numbers of the flattened gradients (None: one per tensor)."""
