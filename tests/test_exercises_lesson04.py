"""Lesson 4's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson04)."""

import json

import numpy as np
import pytest
import torch
import torch.distributed as dist

from course_lib.exercises import common
from course_lib.exercises import lesson04 as ex


def weighted(model, n_local):
    total = torch.tensor([float(n_local)], dtype=torch.float64)
    dist.all_reduce(total)
    for p in model.parameters():
        p.grad *= n_local
        dist.all_reduce(p.grad)
        p.grad /= total


def plain_mean(model, n_local):  # the library's average_gradients: equal weights
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def not_divided(model, n_local):
    for p in model.parameters():
        p.grad *= n_local
        dist.all_reduce(p.grad)


def right_on_visible_only(model, n_local):  # the visible model has 6 inputs, the hidden one 5
    return weighted(model, n_local) if model[0].in_features == 6 else plain_mean(model, n_local)


def test_weighted_average_accepts_the_weighted_mean_and_explains_mistakes():
    assert "correct" in ex.check_weighted_average(weighted)
    with pytest.raises(common.ExerciseFailed, match="plain mean .* 3 samples"):
        ex.check_weighted_average(plain_mean)
    with pytest.raises(common.ExerciseFailed, match="not divided by the total .*12"):
        ex.check_weighted_average(not_divided)


def test_weighted_average_names_ranks_that_disagree_without_launching_again():
    data = common.to_plain(ex.probe_weighted_average(weighted))
    judged = common.from_plain(data)
    assert "correct" in ex.judge_weighted_average(judged)
    judged["visible"]["ranks"][1] = judged["visible"]["ranks"][1] + 1e-3
    with pytest.raises(common.ExerciseFailed, match="different parameters"):
        ex.judge_weighted_average(judged)
    judged["visible"]["ranks"] = [r + 1e-3 for r in judged["visible"]["ranks"][:1]] * 2
    with pytest.raises(common.ExerciseFailed, match="differ from one process .* by up to 0.001"):
        ex.judge_weighted_average(judged)


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    assert "correct" in ex.check_weighted_average(right_on_visible_only)
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")  # cases drawn for a grading run
    # in the grader's kernel the data goes to a file and the verdict is the grader's
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "recorded" in ex.check_weighted_average(right_on_visible_only)
    written = list(tmp_path.iterdir())
    assert [p.name for p in written] == ["000-lesson04.weighted_average.json"]
    data = common.from_plain(json.loads(written[0].read_text()))
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson04.weighted_average"](data)
def runs(*curves):
    return [{"step": list(range(1, len(c) + 1)), "loss": list(c)} for c in curves]


SEEDED = {  # two seeds each; mean base: 0.9, 0.5, 0.3, 0.2; mean scaled x8: 1.5, 1.0, 0.6, 0.35
    "batch 32, lr 0.05 (base)": runs([1.0, 0.6, 0.4, 0.1], [0.8, 0.4, 0.2, 0.3]),
    "batch 256, lr 0.05 (not scaled)": runs([2.0, 1.9, 1.8, 1.7], [2.0, 1.9, 1.8, 1.7]),
    "batch 256, lr 0.4 (scaled x8)": runs([1.5, 1.0, 0.6, 0.3], [1.5, 1.0, 0.6, 0.4]),
    "batch 512, lr 0.8 (scaled x16)": runs([2.2, 2.2, 2.2, 0.0], [2.2, 2.2, 2.2, 0.0]),
}


def first_epoch(seeded, reference_epoch):  # the notebook's solution, from the drawn epoch
    def mean_curve(marker):
        return np.mean([r["loss"] for n, rs in seeded.items() if marker in n for r in rs], axis=0)

    target = mean_curve("(scaled x8)")[reference_epoch - 1]
    reached = [e for e, loss in enumerate(mean_curve("(base)"), start=1) if loss <= target]
    return reached[0] if reached else None


@pytest.mark.parametrize(("reference_epoch", "right"), [(1, 1), (2, 1), (3, 2), (4, 3)])
def test_epochs_worth_follows_the_drawn_reference_epoch(reference_epoch, right):
    assert first_epoch(SEEDED, reference_epoch) == right
    verdict = ex.check_epochs_worth(right, SEEDED, reference_epoch)
    assert f"first {reference_epoch} epochs" in verdict and f"worth {right}" in verdict
    others = {1, 2, 3, 4} - {right}  # a number copied from another draw
    for wrong in others:
        with pytest.raises(common.ExerciseFailed, match="still above|got there earlier"):
            ex.check_epochs_worth(wrong, SEEDED, reference_epoch)


def test_epochs_worth_wants_the_first_epoch_of_the_mean_curve():
    assert "worth 3" in ex.check_epochs_worth(3, SEEDED, 4)
    with pytest.raises(common.ExerciseFailed, match="still above .* after epoch 4"):
        ex.check_epochs_worth(2, SEEDED, 4)  # seed 1 alone is below 0.35 at epoch 2: not the mean
    with pytest.raises(common.ExerciseFailed, match="got there earlier"):
        ex.check_epochs_worth(4, SEEDED, 4)
    with pytest.raises(common.ExerciseFailed, match="from 1 to 4"):
        ex.check_epochs_worth(0, SEEDED, 4)  # counted from 0
    with pytest.raises(common.ExerciseFailed, match="whole number"):
        ex.check_epochs_worth(2.5, SEEDED, 4)
    with pytest.raises(common.ExerciseFailed, match="does get to"):
        ex.check_epochs_worth(None, SEEDED, 4)
    with pytest.raises(common.ExerciseFailed, match="seeded"):
        ex.check_epochs_worth(3, {"something else": runs([1.0])}, 4)


def test_epochs_worth_wants_the_drawn_reference_epoch():
    for reference in (0, 5, 2.0, None, True):  # outside the curve, or not an epoch
        with pytest.raises(common.ExerciseFailed, match="reference epoch drawn above"):
            ex.check_epochs_worth(3, SEEDED, reference)
    # numpy's integers arrive as plain ints
    assert "worth 2" in ex.check_epochs_worth(2, SEEDED, np.int64(3))


def test_epochs_worth_accepts_none_when_the_base_run_never_gets_there():
    better = dict(SEEDED, **{"batch 256, lr 0.4 (scaled x8)": runs([0.1, 0.1, 0.1, 0.01])})
    assert "never" in ex.check_epochs_worth(None, better, 4)
    with pytest.raises(common.ExerciseFailed, match="above"):
        ex.check_epochs_worth(4, better, 4)


def test_in_a_graded_run_the_reference_epoch_must_be_the_one_drawn_for_it(monkeypatch):
    base = [1.0 / e for e in range(1, 11)]  # ten epochs, as in the notebook
    ten = {"batch 32, lr 0.05 (base)": runs(base),
           "batch 256, lr 0.4 (scaled x8)": runs([2.0 / e for e in range(1, 11)])}
    monkeypatch.setenv(common.GRADING_SEED, "7")
    e = common.drawn("lesson04.reference_epoch", ex.draw_reference_epoch)
    assert isinstance(e, int) and 4 <= e <= 10
    assert e == common.drawn("lesson04.reference_epoch", ex.draw_reference_epoch)  # the grader's
    assert "correct" in ex.check_epochs_worth(first_epoch(ten, e), ten, e)
    other = 4 if e > 5 else 10  # a classmate's epoch, and the right answer for it
    assert first_epoch(ten, other) != first_epoch(ten, e)
    with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):
        ex.check_epochs_worth(first_epoch(ten, other), ten, other)
    monkeypatch.delenv(common.GRADING_SEED)  # outside a graded run any epoch is checked as is
    assert "correct" in ex.check_epochs_worth(first_epoch(ten, other), ten, other)
