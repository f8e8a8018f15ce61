"""Lesson 7's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson07)."""

import json

import numpy as np
import pytest
import torch

from course_lib import number_formats as nf
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


def run_gradients(loss_factor, seed=0):
    """Like the notebook's my_gradients: 65 536 fp32 activation gradients whose magnitudes spread
    over eight decades as in section 3 (2e-11 to 3e-3), times the run's loss factor."""
    rng = np.random.default_rng(seed)
    magnitudes = 10 ** rng.uniform(np.log10(2e-11), np.log10(3e-3), 65536)
    signs = rng.choice([-1.0, 1.0], 65536)
    return torch.tensor(magnitudes * signs, dtype=torch.float32) * loss_factor


def right_answers(gradients):
    """The notebook's solution: k by doubling until fp16 overflows, the fraction by casting."""
    largest = gradients.abs().max().item()
    k = 0
    while torch.isfinite(torch.tensor(largest * 2.0 ** (k + 1)).half()):
        k += 1
    return k, nf.fraction_flushed(gradients, torch.float16)["zero"]


def test_each_run_draw_has_its_own_answers_and_a_copied_one_fails():
    draws = [float(10 ** u) for u in np.random.default_rng(7).uniform(-2, 2, 3)]
    runs = [run_gradients(c, seed) for seed, c in enumerate(draws)]
    answers = [right_answers(g) for g in runs]
    assert len({k for k, _ in answers}) == 3 and len({f for _, f in answers}) == 3
    for g, (k, flushed) in zip(runs, answers, strict=True):
        assert 0 < flushed < 1  # something is lost at S = 1 ...
        assert nf.fraction_flushed(g, torch.float16, 2.0 ** k)["zero"] == 0  # ... none at 2^k
        assert "correct" in ex.check_safe_scale(k, g)
        assert f"{round(flushed * 65536)} of this run's" in ex.check_flushed_fraction(flushed, g)
        assert "correct" in ex.check_flushed_fraction(torch.tensor(flushed), g)  # a tensor too
    (k0, f0), (k1, f1) = answers[:2]
    with pytest.raises(common.ExerciseFailed, match="2\\^"):  # another run's k
        ex.check_safe_scale(k0, runs[1])
    with pytest.raises(common.ExerciseFailed, match=f"too {'high' if f0 > f1 else 'low'}"):
        ex.check_flushed_fraction(f0, runs[1])  # another run's fraction


def test_flushed_fraction_is_exact_and_explains_typical_mistakes():
    g = run_gradients(0.1)
    _, flushed = right_answers(g)
    one = 1 / 65536  # one gradient more or fewer: outside the 1e-9 tolerance
    assert "correct" in ex.check_flushed_fraction(flushed + 1e-10, g)
    with pytest.raises(common.ExerciseFailed, match="too high"):
        ex.check_flushed_fraction(flushed + one, g)
    with pytest.raises(common.ExerciseFailed, match="percentage"):
        ex.check_flushed_fraction(100 * flushed, g)
    with pytest.raises(common.ExerciseFailed, match="S = 1"):  # the fraction at S = 2^k
        ex.check_flushed_fraction(0.0, g)
    below_normal = nf.fraction_flushed(g, torch.float16)
    with pytest.raises(common.ExerciseFailed, match="too high"):  # zero + subnormal
        ex.check_flushed_fraction(below_normal["zero"] + below_normal["subnormal"], g)
    with pytest.raises(common.ExerciseFailed, match="number between 0 and 1"):
        ex.check_flushed_fraction("0.3", g)
    with pytest.raises(common.ExerciseFailed, match="my_gradients"):
        ex.check_flushed_fraction(flushed, torch.zeros(3))


def test_flushed_fraction_data_is_small_and_judged_the_same_outside(monkeypatch, tmp_path):
    g = run_gradients(0.01)  # fp16's tie: 2^-25 becomes 0, the next fp32 value above does not
    tie = torch.tensor([2.0 ** -25, float(np.nextafter(np.float32(2.0 ** -25), np.float32(1)))])
    g = torch.cat([g, tie, torch.zeros(5)])  # zeros are not counted: "of the non-zero"
    k, flushed = right_answers(g)
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "correct" in ex.check_safe_scale(k, g)
    assert "correct" in ex.check_flushed_fraction(flushed, g)
    written = sorted(tmp_path.iterdir())
    assert [p.name for p in written] == ["000-lesson07.safe_scale.json",
                                         "001-lesson07.flushed_fraction.json"]
    assert sum(p.stat().st_size for p in written) < 2_000_000
    for path in written:
        data = common.from_plain(json.loads(path.read_text()))
        assert "correct" in common.JUDGES[path.stem.split("-", 1)[1]](data)


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
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")  # cases drawn for a grading run
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


def test_in_a_graded_run_the_loss_factor_must_be_the_one_drawn_for_it(monkeypatch):
    grads = torch.tensor([1e-3, 2.0, -300.0, 1e-9])

    def answers(c):
        g = (grads * c).double()
        k = 0
        while torch.isfinite((g.abs().max() * 2.0 ** (k + 1)).half()):
            k += 1
        nonzero = g[g != 0]
        return k, float((nonzero.half() == 0).double().mean())

    monkeypatch.setenv(common.GRADING_SEED, "7")
    c = common.drawn("lesson07.loss_factor", ex.draw_loss_factor)
    assert c == common.drawn("lesson07.loss_factor", ex.draw_loss_factor)  # the grader's too
    k, flushed = answers(c)
    assert "correct" in ex.check_safe_scale(k, grads, c)
    assert "correct" in ex.check_flushed_fraction(flushed, grads, c)
    other = c * 37.0  # a classmate's factor, and the answers for it
    with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):
        ex.check_safe_scale(answers(other)[0], grads, other)
    monkeypatch.delenv(common.GRADING_SEED)  # outside a graded run any factor is checked as is
    assert "correct" in ex.check_safe_scale(answers(other)[0], grads, other)


def test_the_visible_neighbours_are_the_references_and_judge_the_student_edition(monkeypatch):
    x = ex._cases(None)["visible"].numpy()
    lo, hi = ex._neighbours(x)
    shipped = ex._neighbours_or_visible(x)  # the reference, here
    monkeypatch.setattr(ex, "_neighbours", _stripped)  # as the student edition has it
    np.testing.assert_array_equal(ex._neighbours_or_visible(x), (lo, hi))
    np.testing.assert_array_equal(shipped, (lo, hi))
    assert ex.check_fp16_stochastic_round(right_round).startswith("correct")
    with pytest.raises(common.ExerciseFailed, match="same result"):
        ex.check_fp16_stochastic_round(lambda x, g: x.half().double())  # round to nearest
    with pytest.raises(NotImplementedError):  # values it holds no neighbours for
        ex._neighbours_or_visible(x[:5])


def _stripped(x):
    raise NotImplementedError("not in the student edition: the grader has it")
