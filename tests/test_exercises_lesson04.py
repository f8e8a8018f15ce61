"""Lesson 4's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson04)."""

import json
import math

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


def epochs_worth(base, scaled):  # the notebook's solution: find the first point, then the line
    out = []
    for target in scaled:
        below = [k for k, loss in enumerate(base) if loss <= target]
        if not below:
            out.append(None)
        elif below[0] == 0:
            out.append(1.0)
        else:
            k = below[0]
            out.append(k + (base[k - 1] - target) / (base[k - 1] - base[k]))
    return out


def whole_epochs(base, scaled):  # the first whole epoch: no interpolation
    return [None if e is None else float(math.ceil(e - 1e-9)) for e in epochs_worth(base, scaled)]


def by_heart(base, scaled):  # right on the run's curves and the small example, 1.0 elsewhere
    known = [ex._synthetic(None)["visible"][0][0], [0.9, 0.5, 0.30000000000000004, 0.2]]
    right = any(np.allclose(base, k) for k in known if len(k) == len(base))
    return epochs_worth(base, scaled) if right else [1.0] * len(scaled)


def test_the_reference_interpolates_and_says_none_and_one():
    b, s = ex._synthetic(None)["visible"][0]
    got = ex.worth(b, s)
    assert got[:2] == [1.0, 1.0] and got[-2:] == [None, None]
    np.testing.assert_allclose(got[2:8], [2.6, 3.5, 6.6, 8.8, 9.6, 10.0])
    for seed in range(20):  # the drawn curves: the reference passes what the judge asks
        for b, s in ex._synthetic(seed)["hidden"]:
            assert ex._what_is_wrong(b, s, ex.worth(b, s)) is None
            assert ex._what_is_wrong(b, s, epochs_worth(b, s)) is None


def test_epochs_worth_accepts_the_interpolated_epochs_and_explains_mistakes():
    verdict = ex.check_epochs_worth(epochs_worth, SEEDED)
    assert verdict.startswith("correct") and "the tenth" in verdict
    # mean base 0.9, 0.5, 0.3, 0.2; mean scaled 1.5, 1.0, 0.6, 0.35: worth 1, 1, 1.75, 2.75
    np.testing.assert_allclose(epochs_worth([0.9, 0.5, 0.3, 0.2], [1.5, 1.0, 0.6, 0.35]),
                               [1.0, 1.0, 1.75, 2.75])
    with pytest.raises(common.ExerciseFailed, match="interpolate between the two epochs"):
        ex.check_epochs_worth(whole_epochs, SEEDED)
    with pytest.raises(common.ExerciseFailed, match="epoch 3 .*after epoch 1 the base run is "
                       "still above it"):
        ex.check_epochs_worth(lambda b, s: [1.0] * len(s), SEEDED)
    with pytest.raises(common.ExerciseFailed, match="epoch 9 .*never gets that low: None"):
        ex.check_epochs_worth(lambda b, s: [float(len(b)) if e is None else e
                                            for e in epochs_worth(b, s)], SEEDED)
    with pytest.raises(common.ExerciseFailed, match="does get that low, after epoch"):
        ex.check_epochs_worth(lambda b, s: [None] * len(s), SEEDED)
    with pytest.raises(common.ExerciseFailed, match="already there after epoch"):
        ex.check_epochs_worth(lambda b, s: [None if e is None else min(e + 1, len(b))
                                            for e in epochs_worth(b, s)], SEEDED)
    with pytest.raises(common.ExerciseFailed, match="a list of 10"):
        ex.check_epochs_worth(lambda b, s: 3.0, SEEDED)
    with pytest.raises(common.ExerciseFailed, match="seeded"):
        ex.check_epochs_worth(epochs_worth, {"something else": runs([1.0])})


def test_epochs_worth_judges_hidden_curves_only_in_a_graded_run(monkeypatch, tmp_path):
    assert "correct" in ex.check_epochs_worth(by_heart, SEEDED)
    monkeypatch.setenv(common.HIDDEN_SEED, "4")
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "recorded" in ex.check_epochs_worth(by_heart, SEEDED)
    data = common.from_plain(json.loads(next(tmp_path.iterdir()).read_text()))
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson04.epochs_worth"](data)
