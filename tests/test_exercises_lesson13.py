"""Lesson 13's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson13)."""

import json
import math

import numpy as np
import pytest
import torch

from course_lib.exercises import common
from course_lib.exercises import lesson13 as ex


def right_merge(out_a, lse_a, out_b, lse_b):
    """The right answer: each block weighed by exp(its lse - the merged lse)."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isfinite(lse), lse, 0.0)
    return (torch.exp(lse_a - safe)[..., None] * out_a
            + torch.exp(lse_b - safe)[..., None] * out_b), lse


def naive_merge(out_a, lse_a, out_b, lse_b):  # exp of the lse itself: overflows
    w_a, w_b = torch.exp(lse_a), torch.exp(lse_b)
    return (w_a[..., None] * out_a + w_b[..., None] * out_b) / (w_a + w_b)[..., None], \
        torch.log(w_a + w_b)


def log1p_merge(out_a, lse_a, out_b, lse_b):  # lse_b + log(1 + e^(lse_a - lse_b)): -inf + inf
    lse = lse_b + torch.log1p(torch.exp(lse_a - lse_b))
    return (torch.exp(lse_a - lse)[..., None] * out_a
            + torch.exp(lse_b - lse)[..., None] * out_b), lse


def test_the_merge_accepts_the_right_answer_and_explains_overflow_hidden_blocks_and_weights():
    assert "correct" in ex.check_merge(right_merge)
    with pytest.raises(common.ExerciseFailed, match="overflows"):
        ex.check_merge(naive_merge)
    with pytest.raises(common.ExerciseFailed, match="overflows"):
        ex.check_merge(log1p_merge)  # lse_b + log1p(exp(lse_a - lse_b)) overflows too
    data = ex._probe_merge(right_merge)
    data["cases"][2]["out"][0, 0] = float("nan")  # query 0: block b hides every key from it
    with pytest.raises(common.ExerciseFailed, match="hides every key"):
        ex._judge_merge(data)
    data["cases"][2]["out"][0, 0], data["cases"][2]["out"][0, 7] = 0.0, float("nan")
    with pytest.raises(common.ExerciseFailed, match="overflows"):  # query 7 sees both blocks
        ex._judge_merge(data)
    with pytest.raises(common.ExerciseFailed, match="normalised by its own sum"):
        ex.check_merge(lambda oa, la, ob, lb: (oa + ob, torch.logaddexp(la, lb)))
    with pytest.raises(common.ExerciseFailed, match="log-sum-exp is not"):
        ex.check_merge(lambda oa, la, ob, lb: (right_merge(oa, la, ob, lb)[0],
                                               torch.maximum(la, lb)))
    with pytest.raises(common.ExerciseFailed, match="two tensors"):
        ex.check_merge(lambda oa, la, ob, lb: oa)


def test_the_visible_cases_hold_huge_scores_and_a_block_that_hides_every_key():
    lse_b = [ex.block_result(case, ex._blocks(case)[1])[1] for case in ex._merge_cases(None)]
    assert [bool(torch.isinf(lse).any()) for lse in lse_b] == [False, False, True]
    assert ex.block_result(ex._merge_cases(None)[1], [0, 1])[1].abs().max() > 1000


def right_when_visible(out_a, lse_a, out_b, lse_b):  # the naive merge where it cannot overflow
    if lse_a.numel() in (12, 5, 16):  # the visible cases' query counts
        return right_merge(out_a, lse_a, out_b, lse_b)
    return (out_a + out_b) / 2, torch.maximum(lse_a, lse_b)


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    assert "correct" in ex.check_merge(right_when_visible)
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")
    assert len(ex._merge_cases(12345)) == 6
    assert "correct" in ex.check_merge(right_merge)
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "recorded" in ex.check_merge(right_when_visible)
    written = list(tmp_path.iterdir())
    assert [p.name for p in written] == ["000-lesson13.merge.json"]
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson13.merge"](common.from_plain(json.loads(written[0].read_text())))


def dropped(seed, k, factor):
    """The right answer, from the router's load as the notebook shows it."""
    layer, x = ex.capacity_run(seed, k, factor)
    experts, _, _ = __import__("course_lib.experts", fromlist=["route"]).route(layer.router(x),
                                                                              k)
    load = torch.bincount(experts.reshape(-1), minlength=ex.EXPERTS).tolist()
    cap = math.ceil(factor * ex.TOKENS * k / ex.EXPERTS)
    return sum(max(0, n - cap) for n in load), load


@pytest.mark.parametrize("draw", [[3, 1, 0.5], [3, 2, 0.75], [11, 2, 1.0], [12, 1, 1.25]])
def test_the_capacity_check_accepts_the_runs_drops(draw):
    right, _ = dropped(*draw)
    assert "correct" in ex.check_capacity_drops(right, *draw)
    with pytest.raises(common.ExerciseFailed, match="is not what the run dropped"):
        ex.check_capacity_drops(right + 1, *draw)


def test_the_capacity_check_explains_rounding_down_forgetting_k_and_counting_the_kept():
    seed, k, factor = 3, 2, 0.75
    right, load = dropped(seed, k, factor)
    assert right > 0
    kept = sum(load) - right
    with pytest.raises(common.ExerciseFailed, match="how many were kept"):
        ex.check_capacity_drops(kept, seed, k, factor)
    without_k = sum(max(0, n - math.ceil(factor * ex.TOKENS / ex.EXPERTS)) for n in load)
    with pytest.raises(common.ExerciseFailed, match="k assignments per token"):
        ex.check_capacity_drops(without_k, seed, k, factor)
    down = sum(max(0, n - math.floor(factor * ex.TOKENS * k / ex.EXPERTS)) for n in load)
    if down != right:  # rounding down drops more
        with pytest.raises(common.ExerciseFailed, match="round the capacity up"):
            ex.check_capacity_drops(down, seed, k, factor)
    with pytest.raises(common.ExerciseFailed, match="whole number"):
        ex.check_capacity_drops(2.5, seed, k, factor)


def test_in_a_graded_run_the_draw_must_be_the_one_drawn_for_it(monkeypatch):
    monkeypatch.setenv(common.GRADING_SEED, "7")
    draw = common.drawn("lesson13.capacity", ex.draw_capacity)
    right, _ = dropped(*draw)
    assert "correct" in ex.check_capacity_drops(right, *draw)
    other = [draw[0] + 1, draw[1], draw[2]]
    with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):
        ex.check_capacity_drops(dropped(*other)[0], *other)


def test_the_draws_change_the_answer():
    rng = np.random.default_rng(0)
    answers = {dropped(*ex.draw_capacity(rng))[0] for _ in range(8)}
    assert len(answers) > 2


def test_the_student_edition_without_the_hints_still_judges_the_prediction(monkeypatch):
    def stripped(*args):
        raise NotImplementedError("the student edition of the library leaves this out")

    monkeypatch.setattr(ex, "_capacity_hint", stripped)
    seed, k, factor = 3, 2, 0.75
    right, load = dropped(seed, k, factor)
    assert "correct" in ex.check_capacity_drops(right, seed, k, factor)
    with pytest.raises(common.ExerciseFailed, match="count what is over it, expert by expert"):
        ex.check_capacity_drops(sum(load) - right, seed, k, factor)
