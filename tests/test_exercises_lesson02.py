"""Lesson 2's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson02)."""

import json
from pathlib import Path

import pytest
import torch
from test_practice import graded_and_practice_draws

from course_lib import erm_simulators as sim
from course_lib.data import shard_rows
from course_lib.erm import diabetes_problem
from course_lib.exercises import cases, common
from course_lib.exercises import lesson02 as ex

ROOT = Path(__file__).resolve().parents[1]


def q_losses(q, rounds):
    """The notebook's draw cell: FedAvg with q local steps on 4 clients, lr = 0.1."""
    problem = diabetes_problem()
    clients, losses = shard_rows(problem.n, 4), []
    w = torch.zeros(problem.d, dtype=torch.float64)
    for _ in range(rounds):
        w = sim.fedavg_round(problem, w, clients, q, 0.1)
        losses.append(problem.loss(w))
    return losses


def rounds_by_fedavg(losses, after):
    """The count the way a student finds it: FedAvg with q = 1 until it reaches the target."""
    problem, target = diabetes_problem(), losses[after - 1]
    clients, w = shard_rows(problem.n, 4), torch.zeros(problem.d, dtype=torch.float64)
    for rounds in range(1, 1000):
        w = sim.fedavg_round(problem, w, clients, 1, 0.1)
        if problem.loss(w) <= target:
            return rounds
    raise AssertionError("never reached")


@pytest.mark.parametrize("q, after", [(5, 10), (4, 8), (8, 20), (6, 13)])
def test_rounds_accepts_the_count_of_every_draw(q, after):
    losses = q_losses(q, after)
    right = rounds_by_fedavg(losses, after)
    assert right > 30  # more than section 8's 30 rounds: the student must run on
    assert f"worth {right} rounds" in ex.check_rounds_to_match(right, losses, q, 0.1, after)


def test_rounds_draws_change_the_answer(monkeypatch):
    """The notebook draws within the check's ranges, with no seed (the grader's runs from all of
    them, other runs one of the practice draws); the counts at the ends of the ranges are far
    apart, and one draw's count is rejected for another."""
    notebook = json.loads((ROOT / "notebooks" / "02_parallel_gradient_descent.ipynb").read_text())
    draw = next("".join(c["source"]) for c in notebook["cells"]
                if "Q, AFTER = " in "".join(c["source"]))
    assert 'drawn("lesson02.q_after", draw_q_after)' in draw and "seed(" not in draw
    values = graded_and_practice_draws(monkeypatch, "lesson02.q_after", ex.draw_q_after)
    assert len(values) > 30  # the grader's runs draw from the whole ranges
    assert {q for q, _ in values} <= set(range(ex.Q_RANGE[0], ex.Q_RANGE[1] + 1))
    assert {a for _, a in values} <= set(range(ex.AFTER_RANGE[0], ex.AFTER_RANGE[1] + 1))
    (q_lo, q_hi), (a_lo, a_hi) = ex.Q_RANGE, ex.AFTER_RANGE
    fewest = rounds_by_fedavg(q_losses(q_lo, a_lo), a_lo)
    most = rounds_by_fedavg(q_losses(q_hi, a_hi), a_hi)
    assert most > 3 * fewest
    losses = q_losses(6, 13)
    with pytest.raises(common.ExerciseFailed, match="still above"):
        ex.check_rounds_to_match(rounds_by_fedavg(losses, 12), losses, 6, 0.1, 13)
    with pytest.raises(common.ExerciseFailed, match="first round"):  # q = 5's count for q = 6
        ex.check_rounds_to_match(rounds_by_fedavg(losses, 13), q_losses(5, 13), 5, 0.1, 13)


def test_rounds_explains_too_few_too_many_the_naive_guess_and_not_whole():
    q, after = 6, 13
    losses = q_losses(q, 20)  # a longer curve than AFTER rounds is fine: the target is at AFTER
    right = rounds_by_fedavg(losses, after)
    with pytest.raises(common.ExerciseFailed, match="still above"):
        ex.check_rounds_to_match(right - 1, losses, q, 0.1, after)
    with pytest.raises(common.ExerciseFailed, match="still above"):
        ex.check_rounds_to_match(right, losses, q, 0.1, after + 3)  # the target moves with AFTER
    with pytest.raises(common.ExerciseFailed, match="first round"):
        ex.check_rounds_to_match(right + 1, losses, q, 0.1, after)
    with pytest.raises(common.ExerciseFailed, match="q x AFTER"):
        ex.check_rounds_to_match(q * after, losses, q, 0.1, after)  # "q steps = q rounds"
    with pytest.raises(common.ExerciseFailed, match="whole number"):
        ex.check_rounds_to_match(right + 0.5, losses, q, 0.1, after)
    with pytest.raises(common.ExerciseFailed, match="q_losses"):
        ex.check_rounds_to_match(right, {q: losses}, q, 0.1, after)  # section 8's dict
    with pytest.raises(common.ExerciseFailed, match="at least 21 rounds"):
        ex.check_rounds_to_match(right, losses, q, 0.1, 21)


def stepped(problem, params, rows, lr):
    return torch.stack([x - lr * sim.local_gradient(problem, r, x)
                        for x, r in zip(params, rows, strict=True)])


def right_atc(problem, params, client_rows, W, lr):
    return list(W @ stepped(problem, params, client_rows, lr))


def test_atc_accepts_the_right_step_and_explains_typical_mistakes():
    assert "correct" in ex.check_atc_step(right_atc)
    with pytest.raises(common.ExerciseFailed, match="the library.s DGD step"):
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


def test_in_a_graded_run_q_and_after_must_be_the_ones_drawn_for_it(monkeypatch, tmp_path):
    """A student who overwrites Q and AFTER with a classmate's and types the classmate's count is
    caught: the grader's judge draws the run's values again."""
    monkeypatch.setenv(common.GRADING_SEED, "7")
    q, after = common.drawn("lesson02.q_after", ex.draw_q_after)
    assert (q, after) == common.drawn("lesson02.q_after", ex.draw_q_after)  # the grader's too
    losses = q_losses(q, after)
    assert "correct" in ex.check_rounds_to_match(rounds_by_fedavg(losses, after), losses, q, 0.1,
                                                 after)
    nxt = lambda v, lo, hi: lo + (v - lo + 1) % (hi - lo + 1)  # noqa: E731  (another draw)
    for oq, oa in [(nxt(q, *ex.Q_RANGE), after), (q, nxt(after, *ex.AFTER_RANGE))]:
        other = q_losses(oq, oa)
        with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):
            ex.check_rounds_to_match(rounds_by_fedavg(other, oa), other, oq, 0.1, oa)
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))  # the grader judges the data itself
    with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):  # the kernel's
        ex.check_rounds_to_match(rounds_by_fedavg(other, oa), other, oq, 0.1, oa)
    written = next(tmp_path.iterdir())
    with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):
        common.JUDGES["lesson02.rounds_to_match"](common.from_plain(json.loads(
            written.read_text())))
    monkeypatch.delenv(common.GRADING_SEED)  # outside a graded run any values are checked as is
    monkeypatch.delenv(common.GRADING_OUT)
    assert "correct" in ex.check_rounds_to_match(rounds_by_fedavg(other, oa), other, oq, 0.1, oa)


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    def right_on_visible_only(problem, params, rows, W, lr):  # wrong on any other graph
        new = right_atc(problem, params, rows, W, lr)
        return new if len(params) in (5, 7) and lr in (0.0, 0.05, 0.5) else [x + 1 for x in new]

    assert "correct" in ex.check_atc_step(right_on_visible_only)
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")  # cases drawn for a grading run
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


def test_the_visible_steps_are_the_references_and_judge_the_student_edition(monkeypatch):
    for case, expected in zip(ex._inputs(None)["visible"], ex.VISIBLE_STEPS, strict=True):
        got = right_atc(ex._problem(case["problem"]), list(case["params"]), case["rows"],
                        case["W"], case["lr"])
        torch.testing.assert_close(cases.projections(torch.stack(got)), expected, rtol=1e-9,
                                   atol=1e-12)

    def stripped(case):
        raise NotImplementedError("not in the student edition: the grader has it")

    monkeypatch.setattr(ex, "_judge_one", stripped)  # as the student edition has it
    assert ex.check_atc_step(right_atc).startswith("correct")
    with pytest.raises(common.ExerciseFailed, match="not adapt-then-combine's"):
        ex.check_atc_step(lambda problem, params, rows, W, lr: list(W @ torch.stack(params)))


def test_projections_tell_tensors_apart_but_not_rounding():
    g = torch.Generator().manual_seed(0)
    t = torch.randn(4, 5, dtype=torch.float64, generator=g)
    rounding = t * (1 + 1e-15 * torch.randn(4, 5, dtype=torch.float64, generator=g))
    torch.testing.assert_close(cases.projections(rounding), cases.projections(t), rtol=1e-12,
                               atol=1e-12)
    for other in (t + 1e-3, t.T.reshape(4, 5), 2 * t):
        assert not torch.allclose(torch.tensor(cases.projections(other)),
                                  torch.tensor(cases.projections(t)), rtol=1e-7, atol=1e-9)
    assert len(cases.projections(t, k=5)) == 5


def test_a_made_up_curve_is_refused_not_judged():
    q, after = 6, 13
    with pytest.raises(ex.ExerciseFailed, match=r"is not what FedAvg with q = 6 reaches after 13"):
        ex.check_rounds_to_match(1, [1e9] * after, q, 0.1, after)
    losses = q_losses(q, after)
    with pytest.raises(ex.ExerciseFailed, match="is not what FedAvg"):
        ex.check_rounds_to_match(1, losses[:-1] + [losses[-1] * (1 + 1e-6)], q, 0.1, after)


def test_in_a_graded_run_the_learning_rate_must_be_the_notebooks(monkeypatch):
    """lr = 0 leaves every loss at w = 0's, so any curve of it is matched by one round."""
    monkeypatch.setenv(common.GRADING_SEED, "7")
    q, after = common.drawn("lesson02.q_after", ex.draw_q_after)
    problem = diabetes_problem()
    flat = [problem.loss(torch.zeros(problem.d, dtype=torch.float64))] * after
    with pytest.raises(common.ExerciseFailed, match="the notebook's learning rate, FED_LR = 0.1"):
        ex.check_rounds_to_match(1, flat, q, 0.0, after)
    monkeypatch.delenv(common.GRADING_SEED)  # outside a graded run: the values as given
    assert "correct" in ex.check_rounds_to_match(1, flat, q, 0.0, after)
