"""Lesson 7b's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson07b)."""

import math
import sys

import pytest
import torch
import torch.distributed as dist

from course_lib import compression as cp
from course_lib import low_bits as lb
from course_lib.exercises import common
from course_lib.exercises import lesson07b as ex
from course_lib.exercises.cases import projections


def ef_sign_all_reduce(grad, residual, group=None):
    """One bit a number on the wire: packed signs and one scale a rank, all-gathered."""
    corrected = grad + residual
    n, p = corrected.numel(), dist.get_world_size(group)
    packed, scale = lb.pack_signs(corrected), corrected.abs().mean().reshape(1)
    signs, scales = [torch.empty_like(packed) for _ in range(p)], [scale.clone() for _ in range(p)]
    dist.all_gather(signs, packed, group=group)
    dist.all_gather(scales, scale, group=group)
    pairs = zip(scales, signs, strict=True)
    mean = sum(s * lb.unpack_signs(b, n).to(grad.dtype) for s, b in pairs) / p
    message = scale * lb.unpack_signs(packed, n).to(grad.dtype)
    return mean.view_as(grad), corrected - message.view_as(grad)


def by_the_library(grad, residual, group=None):  # SignCompressor + what error feedback keeps
    feedback = cp.ErrorFeedback()
    feedback.residual = [residual]
    (mean,), _ = cp.compressed_mean(lb.SignCompressor(), feedback, [grad], group)
    return mean, feedback.residual[0]


def no_feedback(grad, residual, group=None):
    mean, _ = ef_sign_all_reduce(grad, torch.zeros_like(residual), group)
    return mean, torch.zeros_like(residual)


def zero_is_zero(grad, residual, group=None):  # torch.sign: a zero sends nothing
    corrected = grad + residual
    message = corrected.abs().mean() * torch.sign(corrected)
    mean = message.clone()
    dist.all_reduce(mean, group=group)
    return mean / dist.get_world_size(group), corrected - message


def halved(grad, residual, group=None):  # right on 2 ranks only
    corrected = grad + residual
    message = corrected.abs().mean() * torch.where(corrected >= 0, 1.0, -1.0).double()
    mean = message.clone()
    dist.all_reduce(mean, group=group)
    return mean / 2, corrected - message


def own_mean(grad, residual, group=None):  # each rank keeps its own message
    mean, kept = ef_sign_all_reduce(grad, residual, group)
    return (grad + residual) - kept, kept


def message_bytes(sizes, bits, group):
    n = sum(sizes)
    return math.ceil(n * bits / 8) + 4 * (len(sizes) if group is None else math.ceil(n / group))


def bytes_by_heart(sizes, bits, group):  # right on the visible messages only
    known = [list(map(str, v)) for v in ex.VISIBLE_MESSAGES]
    return message_bytes(sizes, bits, group) if [str(sizes), str(bits), str(group)] in known \
        else 0


@pytest.mark.filterwarnings("ignore:.*oversubscribed")
def test_ef_sign_accepts_packed_signs_and_the_library_and_explains_wrong_ones():
    assert "correct: on 2 ranks" in ex.check_ef_sign(ef_sign_all_reduce)
    assert "correct" in ex.check_ef_sign(by_the_library)
    with pytest.raises(common.ExerciseFailed, match="every residual is 0: error feedback keeps"):
        ex.check_ef_sign(no_feedback)
    with pytest.raises(common.ExerciseFailed, match="step 1, rank 0: the mean is off .*a zero "
                                                    "counts as \\+"):
        ex.check_ef_sign(zero_is_zero)
    with pytest.raises(common.ExerciseFailed, match="the ranks hold different means"):
        ex.check_ef_sign(own_mean)
    with pytest.raises(common.ExerciseFailed, match=r"return \(mean, residual\), two real"):
        ex.check_ef_sign(lambda grad, residual, group=None: grad)


@pytest.mark.filterwarnings("ignore:.*oversubscribed")  # 3 ranks on 2 cores: correctness only
def test_ef_sign_judges_three_ranks_only_in_a_graded_run(monkeypatch, tmp_path):
    assert "correct" in ex.check_ef_sign(halved)  # the visible case has 2 ranks
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")
    with pytest.raises(common.HiddenTestFailed):
        ex.check_ef_sign(halved)
    assert "correct" in ex.check_ef_sign(ef_sign_all_reduce)
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))  # the grader's kernel: to a file
    assert "recorded" in ex.check_ef_sign(halved)


def test_the_reference_is_ef_sign_sgd_and_the_shipped_fingerprints_are_its():
    gradients = ex.ef_cases(None)["visible"]["gradients"]
    means, residuals = ex.ef_sign_reference(gradients)
    for r in range(2):  # what was sent plus what is kept is the corrected gradient
        kept = torch.zeros(2, 5, dtype=torch.float64)
        for t in range(ex.STEPS):
            corrected = gradients[r][t] + kept
            sent = corrected - residuals[r][t]
            scale = corrected.abs().mean()
            torch.testing.assert_close(sent.abs(), scale.expand(2, 5))
            assert torch.all((sent > 0) == (corrected >= 0))  # a zero counts as +
            kept = residuals[r][t]
    torch.testing.assert_close(torch.tensor(projections(means)), torch.tensor(ex.VISIBLE_MEANS))
    torch.testing.assert_close(torch.tensor(projections(torch.stack(residuals))),
                               torch.tensor(ex.VISIBLE_RESIDUALS))
    assert (gradients == 0).any()  # the visible case tries the sign of zero


def _ranks(means, residuals, offset=None):
    return [{"means": means, "residuals": residuals[r],
             "offset": torch.zeros(2, 5, dtype=torch.float64) if offset is None else offset[r]}
            for r in range(len(residuals))]


def test_ef_sign_in_the_student_edition_judges_the_visible_case_by_its_fingerprints(monkeypatch):
    def stripped(*args):
        raise NotImplementedError("not in the student edition: the grader has it")

    case = ex.ef_cases(None)["visible"]
    means, residuals = ex.ef_sign_reference(case["gradients"])
    right = {"visible": case | {"ranks": _ranks(means, residuals)}}
    float32_scales = {"visible": case | {"ranks": _ranks(means, [r * (1 + 2e-7) for r in
                                                              residuals])}}  # float32 scales
    monkeypatch.setattr(ex, "ef_sign_reference", stripped)
    assert ex._judge_ef(right).startswith("correct")
    assert ex._judge_ef(float32_scales).startswith("correct")
    wrong = {"visible": case | {"ranks": _ranks(means, [r * 0 for r in residuals])}}
    with pytest.raises(common.ExerciseFailed, match="every residual is 0"):
        ex._judge_ef(wrong)
    rank_1_wrong = _ranks(means, residuals)
    rank_1_wrong[1]["residuals"] = rank_1_wrong[1]["residuals"] + 7  # rank 0 alone is right
    with pytest.raises(common.ExerciseFailed):
        ex._judge_ef({"visible": case | {"ranks": rank_1_wrong}})
    rank_1_wrong[1] |= {"residuals": residuals[1], "means": means + 123}
    with pytest.raises(common.ExerciseFailed, match="the ranks hold different means"):
        ex._judge_ef({"visible": case | {"ranks": rank_1_wrong}})


def test_ef_sign_refuses_data_that_lacks_a_rank_a_tensor_or_a_drawn_offset(monkeypatch):
    case = ex.ef_cases(None)["visible"]
    means, residuals = ex.ef_sign_reference(case["gradients"])
    assert ex._judge_ef({"visible": case | {"ranks": _ranks(means, residuals)}}).startswith(
        "correct")
    for ranks, why in (([], "expected the results of 2 ranks"),
                       (_ranks(means, residuals)[:1], "expected the results of 2 ranks"),
                       ([{}, {}], "rank 0's means is not a real tensor"),
                       (_ranks(means[:2], residuals), r"rank 0's means is not a real tensor of "
                                                      r"shape \(4, 2, 5\)"),
                       (_ranks(means.to(torch.complex128), residuals), "not a real tensor")):
        with pytest.raises(common.ExerciseFailed, match=why):
            ex._judge_ef({"visible": case | {"ranks": ranks}})
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")  # a graded run: offsets drawn on each rank
    cases = ex.ef_cases(12345)
    unsalted = {"visible": cases["visible"] | {"ranks": _ranks(means, residuals)},
                "hidden": [cases["hidden"][0] | {"ranks": []}]}
    with pytest.raises(common.ExerciseFailed, match="rank 0's offset was not drawn by the check"):
        ex._judge_ef(unsalted)


def peeking(grad, residual, group=None):  # reads every rank's inputs from the check's frame
    gradients = sys._getframe(1).f_locals["gradients"]
    step = PEEKED.setdefault(id(gradients), [0])
    means, residuals = ex.ef_sign_reference(gradients)  # no message sent
    t, step[0] = step[0], step[0] + 1
    return means[t].clone(), residuals[dist.get_rank()][t].clone()


PEEKED: dict = {}


@pytest.mark.filterwarnings("ignore:.*oversubscribed")
def test_in_a_graded_run_no_rank_can_answer_for_the_others_without_a_message(monkeypatch):
    assert "correct" in ex.check_ef_sign(peeking)  # outside a graded run the inputs are known
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")  # each rank adds an offset of its own
    assert "correct" in ex.check_ef_sign(ef_sign_all_reduce)
    with pytest.raises(common.ExerciseFailed, match="step 1, rank 0: the mean is off"):
        ex.check_ef_sign(peeking)


def test_the_recorded_values_are_copies_taken_when_returned():
    kept = {}

    def buffered(grad, residual, group=None):  # right, but returns the same buffers each step
        mean, residual = ef_sign_all_reduce(grad, residual, group)
        kept.setdefault("mean", torch.empty_like(mean)).copy_(mean)
        kept.setdefault("residual", torch.empty_like(residual)).copy_(residual)
        return kept["mean"], kept["residual"]

    assert "correct" in ex.check_ef_sign(buffered)


def test_message_bytes_accepts_the_formula_and_explains_wrong_counts():
    verdict = ex.check_message_bytes(message_bytes)
    assert "1,146 bytes at 1 bit(s), 5,049 bytes at 4 bit(s)" in verdict
    with pytest.raises(common.ExerciseFailed, match="How many bytes .* float32 scales"):
        ex.check_message_bytes(lambda sizes, bits, group: math.ceil(sum(sizes) * bits / 8))
    with pytest.raises(common.ExerciseFailed, match=r"group None: 1126 bytes is not right"):
        ex.check_message_bytes(lambda s, b, g: message_bytes(s, b, g) if g else
                               math.ceil(sum(s) * b / 8) + 4)  # one scale for all tensors
    import numpy as np

    assert "correct" in ex.check_message_bytes(lambda s, b, g: np.int64(message_bytes(s, b, g)))
    assert "correct" in ex.check_message_bytes(lambda s, b, g: np.array(message_bytes(s, b, g)))
    with pytest.raises(common.ExerciseFailed, match="return a whole number of bytes"):
        ex.check_message_bytes(lambda s, b, g: np.array([message_bytes(s, b, g)] * 2))
    with pytest.raises(common.ExerciseFailed, match="return a whole number of bytes"):
        ex.check_message_bytes(lambda sizes, bits, group: sum(sizes) * bits / 8)


def test_message_bytes_are_what_the_compressors_send():
    sizes = [(5, 7), (3,), (64, 10)]
    grads = [torch.randn(s) for s in sizes]
    flat = cp.flatten(grads)
    numels = [g.numel() for g in grads]
    sign_bytes = lb.pack_signs(flat).numel() + 4 * len(grads)
    codes, scales = lb.quantize_groups(flat, 4, 64)
    int4_bytes = lb.pack_int4(codes).numel() + 4 * scales.numel()
    assert ex.bytes_of_message(numels, 1, None) == sign_bytes
    assert ex.bytes_of_message(numels, 4, 64) == int4_bytes


def test_message_bytes_judges_hidden_cases_only_in_a_graded_run_and_by_digest_for_students(
        monkeypatch):
    by_heart = bytes_by_heart
    assert "correct" in ex.check_message_bytes(by_heart)
    with monkeypatch.context() as m:
        m.setenv(common.HIDDEN_SEED, "12345")
        with pytest.raises(common.HiddenTestFailed):
            ex.check_message_bytes(by_heart)
        assert "correct" in ex.check_message_bytes(message_bytes)

    def stripped(*args):
        raise NotImplementedError("not in the student edition: the grader has it")

    monkeypatch.setattr(ex, "bytes_of_message", stripped)
    assert ex.check_message_bytes(message_bytes).startswith("correct for the visible messages")
    with pytest.raises(common.ExerciseFailed, match="bytes: .* is not right"):
        ex.check_message_bytes(lambda sizes, bits, group: math.ceil(sum(sizes) * bits / 8))
