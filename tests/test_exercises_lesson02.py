"""Lesson 2's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson02)."""

import json

import pytest
import torch

from course_lib import erm_simulators as sim
from course_lib.data import shard_rows
from course_lib.erm import diabetes_problem
from course_lib.exercises import common
from course_lib.exercises import lesson02 as ex


@pytest.fixture(scope="module")
def fedavg_losses():
    """Section 8's run: 30 rounds of FedAvg with q = 1 and q = 5 on 4 clients, lr = 0.1."""
    problem = diabetes_problem()
    clients, losses = shard_rows(problem.n, 4), {}
    for q in (1, 5):
        w, losses[q] = torch.zeros(problem.d, dtype=torch.float64), []
        for _ in range(30):
            w = sim.fedavg_round(problem, w, clients, q, 0.1)
            losses[q].append(problem.loss(w))
    return losses


def rounds_by_fedavg(losses, after):
    """The count the way a student finds it: FedAvg with q = 1 until it reaches the target."""
    problem, target = diabetes_problem(), losses[5][after - 1]
    clients, w = shard_rows(problem.n, 4), torch.zeros(problem.d, dtype=torch.float64)
    for rounds in range(1, 1000):
        w = sim.fedavg_round(problem, w, clients, 1, 0.1)
        if problem.loss(w) <= target:
            return rounds
    raise AssertionError("never reached")


def test_rounds_accepts_the_count_and_explains_too_few_too_many_and_not_whole(fedavg_losses):
    right = rounds_by_fedavg(fedavg_losses, 10)
    assert right > 30  # section 8's 30 rounds do not show it: the student must run on
    assert "correct" in ex.check_rounds_to_match(right, fedavg_losses, 0.1, 10)
    with pytest.raises(common.ExerciseFailed, match="still above"):
        ex.check_rounds_to_match(right - 1, fedavg_losses, 0.1, 10)
    with pytest.raises(common.ExerciseFailed, match="still above"):
        ex.check_rounds_to_match(right, fedavg_losses, 0.1, 20)  # the target moves with `after`
    with pytest.raises(common.ExerciseFailed, match="first round"):
        ex.check_rounds_to_match(right + 1, fedavg_losses, 0.1, 10)
    with pytest.raises(common.ExerciseFailed, match="first round"):
        ex.check_rounds_to_match(5 * 10, fedavg_losses, 0.1, 10)  # "5 steps = 5 rounds"
    with pytest.raises(common.ExerciseFailed, match="whole number"):
        ex.check_rounds_to_match(right + 0.5, fedavg_losses, 0.1, 10)
    with pytest.raises(common.ExerciseFailed, match="fedavg_losses"):
        ex.check_rounds_to_match(right, {1: fedavg_losses[1]}, 0.1, 10)


def stepped(problem, params, rows, lr):
    return torch.stack([x - lr * sim.local_gradient(problem, r, x)
                        for x, r in zip(params, rows, strict=True)])


def right_atc(problem, params, client_rows, W, lr):
    return list(W @ stepped(problem, params, client_rows, lr))


def test_atc_accepts_the_right_step_and_explains_typical_mistakes():
    assert "correct" in ex.check_atc_step(right_atc)
    with pytest.raises(common.ExerciseFailed, match="combine-then-adapt"):
        ex.check_atc_step(lambda problem, params, rows, W, lr: list(
            W @ torch.stack(params) - (torch.stack(params) - stepped(problem, params, rows, lr))))
    with pytest.raises(common.ExerciseFailed, match="W's columns"):
        ex.check_atc_step(lambda problem, params, rows, W, lr: list(
            W.T @ stepped(problem, params, rows, lr)))
    with pytest.raises(common.ExerciseFailed, match="divide it by the node's number of rows"):
        ex.check_atc_step(lambda problem, params, rows, W, lr: list(W @ torch.stack(
            [x - lr * (problem.gradient_sum(x, r) + problem.lam * x)
             for x, r in zip(params, rows, strict=True)])))
    with pytest.raises(common.ExerciseFailed, match="is off by"):  # equal weights, not W's
        ex.check_atc_step(lambda problem, params, rows, W, lr: list(
            (W > 0).double() / (W > 0).sum(1, keepdim=True) @ stepped(problem, params, rows, lr)))
    with pytest.raises(common.ExerciseFailed, match="None"):
        ex.check_atc_step(lambda *a: None)
    with pytest.raises(common.ExerciseFailed, match="vectors of"):
        ex.check_atc_step(lambda problem, params, rows, W, lr: params[:2])


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    def right_on_visible_only(problem, params, rows, W, lr):  # wrong on any other graph
        new = right_atc(problem, params, rows, W, lr)
        return new if len(params) in (5, 7) and lr in (0.0, 0.05, 0.5) else [x + 1 for x in new]

    assert "correct" in ex.check_atc_step(right_on_visible_only)
    monkeypatch.setenv(common.GRADING_SEED, "12345")  # cases drawn for a grading run
    assert "correct" in ex.check_atc_step(right_atc)
    with pytest.raises(common.HiddenTestFailed):
        ex.check_atc_step(right_on_visible_only)
    # in the grader's kernel the data goes to a file and the verdict is the grader's
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "recorded" in ex.check_atc_step(right_on_visible_only)
    written = list(tmp_path.iterdir())
    assert [p.name for p in written] == ["000-lesson02.atc_step.json"]
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson02.atc_step"](common.from_plain(json.loads(written[0].read_text())))
