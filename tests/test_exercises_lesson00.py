"""Lesson 0's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson00). The checks launch 2 real ranks (warm
launches: a fraction of a second each)."""

import pytest
import torch
import torch.distributed as dist

from course_lib.exercises import common
from course_lib.exercises import lesson00 as ex


def right_mean_and_max(x):
    total = torch.tensor([x], dtype=torch.float64)
    largest = total.clone()
    dist.all_reduce(total)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    return total.item() / dist.get_world_size(), largest.item()


def not_written(x):
    raise NotImplementedError("write your solution here")


def collective_sequence(values):  # the notebook's
    rank, p = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([values[rank]], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    t *= rank + 1
    everyone = [torch.zeros_like(t) for _ in range(p)]
    dist.all_gather(everyone, t)
    return (torch.cat(everyone).sum() - values[rank]).item()


def answers(values, rank_answers):
    """The data the probe returns with these answers for the first visible case (``values``);
    the other visible cases answered right."""
    visible = ex._mean_max_cases(None)["visible"]
    assert visible[0] == values
    rest = [[sum(row) / len(row), max(row)] for row in visible[1:]]
    return {"visible": {"values": visible, "ranks": [[a, *rest] for a in rank_answers]}}


def test_mean_and_max_accepts_the_right_answer_and_explains_wrong_ones():
    assert "correct" in ex.check_mean_and_max(right_mean_and_max)
    with pytest.raises(common.NotSolved, match="still raises NotImplementedError"):
        ex.check_mean_and_max(not_written)  # the stub: "not solved yet", not a rank's error
    # wrong answers, judged from the data a probe would have returned (no more launches)
    judge = common.JUDGES["lesson00.mean_and_max"]
    with pytest.raises(common.ExerciseFailed, match="divide by dist.get_world_size"):
        judge(answers([1.0, 2.0], [[3.0, 2.0], [3.0, 2.0]]))  # the sum, not the mean
    with pytest.raises(common.ExerciseFailed, match="two Python floats"):
        judge(answers([1.0, 2.0], ["(tensor([1.5]), tensor([2.]))"] * 2))  # tensors
    with pytest.raises(common.ExerciseFailed, match="rank 1 returned 1.0 as the largest"):
        judge(answers([1.0, 2.0], [[1.5, 2.0], [1.5, 1.0]]))  # its own value, not the max


def test_prediction_accepts_the_run_and_rejects_a_wrong_or_malformed_prediction():
    values = [3.0, -2.0]  # max 3; ranks hold 3 and 6; gathered sum 9; minus their own value
    assert "correct" in ex.check_prediction([6.0, 11.0], collective_sequence, values)
    judge = common.JUDGES["lesson00.prediction"]
    with pytest.raises(common.ExerciseFailed, match="you predicted 9.0 for rank 0"):
        judge({"values": values, "prediction": [9.0, 9.0], "ran": [6.0, 11.0]})
    with pytest.raises(common.ExerciseFailed, match="list of 2 numbers"):
        judge({"values": values, "prediction": 6.0, "ran": [6.0, 11.0]})
    with pytest.raises(common.ExerciseFailed, match="run its cell again"):  # a changed sequence
        judge({"values": values, "prediction": [6.0, 11.0], "ran": [0.0, 0.0]})


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    def right_on_visible_only(x):  # the visible numbers are all within 5 of zero
        mean, largest = right_mean_and_max(x)
        return (mean, largest) if abs(x) <= 5 else (mean + 1, largest)

    assert "correct" in ex.check_mean_and_max(right_on_visible_only)
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")
    with pytest.raises(common.HiddenTestFailed):
        ex.check_mean_and_max(right_on_visible_only)
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))  # the grader's kernel: to a file
    assert "recorded" in ex.check_mean_and_max(right_on_visible_only)
    assert [p.name for p in tmp_path.iterdir()] == ["000-lesson00.mean_and_max.json"]


def test_the_student_edition_judges_the_prediction_against_the_run(monkeypatch):
    def stripped(values):
        raise NotImplementedError("not in the student edition: the grader has it")

    monkeypatch.setattr(ex, "_simulate", stripped)  # as the student edition has it
    judge = common.JUDGES["lesson00.prediction"]
    values = [3.0, -2.0]
    assert judge({"values": values, "prediction": [6.0, 11.0], "ran": [6.0, 11.0]}).startswith(
        "correct")
    with pytest.raises(common.ExerciseFailed, match="you predicted 9.0 for rank 0"):
        judge({"values": values, "prediction": [9.0, 9.0], "ran": [6.0, 11.0]})
    with pytest.raises(common.ExerciseFailed, match="not a number per rank"):
        judge({"values": values, "prediction": [6.0, 11.0], "ran": "[6.0, 11.0]"})


def test_a_graded_prediction_must_be_for_the_runs_own_values(monkeypatch):
    monkeypatch.setenv(common.GRADING_SEED, "7")  # the grader seeds the draw, kernel and judge
    values = common.drawn("lesson00.values", ex.draw_values)
    assert values == common.drawn("lesson00.values", ex.draw_values)
    assert len(values) == 2 and all(v == int(v) and -9 <= v <= 9 for v in values)
    judge = common.JUDGES["lesson00.prediction"]
    right = [max(values) * 3 - v for v in values]  # max on both, x1 and x2, summed, less own
    assert judge({"values": values, "prediction": right, "ran": right}).startswith("correct")
    # values of the student's choosing, with the prediction that fits them
    chosen = [0.0, 0.0] if values != [0.0, 0.0] else [1.0, 1.0]
    fits = [max(chosen) * 3 - v for v in chosen]
    with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):
        judge({"values": chosen, "prediction": fits, "ran": fits})
