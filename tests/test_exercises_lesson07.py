"""Lesson 7's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson07)."""

import json

import pytest
import torch

from course_lib.exercises import common
from course_lib.exercises import lesson07 as ex


def neighbours(x):
    near = x.half()
    below = torch.where(near.double() > x,
                        torch.nextafter(near, torch.tensor(-float("inf"), dtype=near.dtype)), near)
    above = torch.nextafter(below, torch.tensor(float("inf"), dtype=below.dtype))
    return below, torch.where(below.double() == x, below, above)


def right_round(x, generator):
    below, above = neighbours(x)
    gap = (above.double() - below.double()).clamp(min=torch.finfo(torch.float64).tiny)
    up = torch.rand(x.shape, generator=generator, dtype=x.dtype) * gap < x - below.double()
    return torch.where(up, above, below).double()


def test_safe_scale_accepts_the_largest_k_and_explains_too_large_and_too_small():
    grads = torch.tensor([1e-3, 2.0, -300.0])  # 300 * 2^7 fits fp16's 65504, 300 * 2^8 does not
    assert "correct" in ex.check_safe_scale(7, grads)
    with pytest.raises(common.ExerciseFailed, match="becomes inf"):
        ex.check_safe_scale(8, grads)
    with pytest.raises(common.ExerciseFailed, match="so is 2\\^7"):
        ex.check_safe_scale(6, grads)
    with pytest.raises(common.ExerciseFailed, match="whole number"):
        ex.check_safe_scale(6.5, grads)


def test_fp16_round_accepts_the_right_rounding_and_rejects_nearest_biased_and_off_grid():
    assert "correct" in ex.check_fp16_stochastic_round(right_round)
    with pytest.raises(common.ExerciseFailed, match="same result"):
        ex.check_fp16_stochastic_round(lambda x, g: x.half().double())  # round to nearest
    with pytest.raises(common.ExerciseFailed, match="biased"):  # up with probability 1/2
        ex.check_fp16_stochastic_round(
            lambda x, g: torch.where(torch.rand(x.shape, generator=g, dtype=x.dtype) < 0.5,
                                     *neighbours(x)).double())
    with pytest.raises(common.ExerciseFailed, match="two fp16 values"):
        ex.check_fp16_stochastic_round(lambda x, g: torch.floor(x + torch.rand(
            x.shape, generator=g, dtype=x.dtype)))  # integers: not fp16's neighbours


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    def right_on_visible_only(x, g):  # right for the visible inputs, wrong for others
        r = right_round(x, g)
        return r if x.numel() == 106 else r + 1

    assert "correct" in ex.check_fp16_stochastic_round(right_on_visible_only)
    monkeypatch.setenv(common.GRADING_SEED, "12345")  # cases drawn for a grading run
    with pytest.raises(common.HiddenTestFailed):
        ex.check_fp16_stochastic_round(right_on_visible_only)
    # in the grader's kernel the data goes to a file and the verdict is the grader's
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "recorded" in ex.check_fp16_stochastic_round(right_on_visible_only)
    written = list(tmp_path.iterdir())
    assert [p.name for p in written] == ["000-lesson07.fp16_stochastic_round.json"]
    data = common.from_plain(json.loads(written[0].read_text()))
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson07.fp16_stochastic_round"](data)
