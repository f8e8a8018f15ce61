"""Lesson 6's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson06)."""

import pytest
import torch
import torch.distributed as dist

from course_lib.exercises import common
from course_lib.exercises import lesson06 as ex


def mean_staleness(m, s, k):
    # while one gradient is computed the others push at their rates: fast 1/c, slow 1/(k c)
    return (m - s - 1) + s / k, (m - s) * k + (s - 1)


def push_sum_step(z, out_neighbours, in_neighbours):
    share = z / (len(out_neighbours) + 1)
    received = [torch.empty_like(z) for _ in in_neighbours]
    requests = [dist.isend(share, j) for j in out_neighbours]
    requests += [dist.irecv(buffer, j) for buffer, j in zip(received, in_neighbours, strict=True)]
    for request in requests:
        request.wait()
    return share + sum(received)


def shares_by_out_degree(z, out_neighbours, in_neighbours):  # forgets its own share
    return push_sum_step(z * (len(out_neighbours) + 1) / len(out_neighbours), out_neighbours,
                         in_neighbours)


def test_staleness_accepts_the_rates_argument_and_rejects_the_one_straggler_theory():
    assert "correct" in ex.check_mean_staleness(mean_staleness)
    with pytest.raises(common.ExerciseFailed, match="fast workers' staleness, 5, is 37% above"):
        ex.check_mean_staleness(lambda m, s, k: (m - 1, k * (m - 1)))  # m - 1 for everyone
    with pytest.raises(common.ExerciseFailed, match="slow workers' staleness, 12, is 7% below"):
        ex.check_mean_staleness(lambda m, s, k: (mean_staleness(m, s, k)[0], (m - s) * k))
    with pytest.raises(common.ExerciseFailed, match="two numbers"):
        ex.check_mean_staleness(lambda m, s, k: (m - s - 1) + s / k)
    with pytest.raises(common.ExerciseFailed, match="finite number"):
        ex.check_mean_staleness(lambda m, s, k: (float("nan"), 1.0))


def test_simulated_staleness_is_what_the_rates_argument_predicts_at_the_hidden_extremes():
    # the whole range of hidden settings (m 4..10, s 1..3, k 2..5) was run once: a right answer
    # is at most 2.3% off, at (8, 1, 3) and (10, 1, 4); here those and the corners
    for m, s, k in [(8, 1, 3.0), (10, 1, 4.0), (4, 2, 2.0), (10, 3, 5.0)]:
        for predicted, measured in zip(mean_staleness(m, s, k), ex.simulated_staleness(m, s, k),
                                       strict=True):
            assert abs(predicted / measured - 1) < ex.STALENESS_TOL / 2


@pytest.mark.filterwarnings("ignore:.*oversubscribed")  # 4 ranks on 2 cores: correctness only
def test_push_sum_accepts_the_right_step_and_explains_lost_mass_and_wrong_values():
    assert "correct: every rank's z matches" in ex.check_push_sum(push_sum_step)
    # a step that sends nothing keeps the mass: judged from the data its ranks would return
    # (no launch: the launches above already cover the way there)
    case = ex.push_sum_cases(None)["visible"]
    kept = [case["z0"][i].repeat(ex.STEPS, 1) for i in range(ex.WORLD_SIZE)]
    with pytest.raises(common.ExerciseFailed, match="rank 3 holds .* but should hold"):
        ex.judge_push_sum({"visible": case | {"ranks": kept}})
    with pytest.raises(common.ExerciseFailed, match="neither creates nor loses mass"):
        ex.check_push_sum(shares_by_out_degree)


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    def right_on_visible_only(m, s, k):  # hard-coded for the two settings the student sees
        return mean_staleness(m, s, k) if (m, s, k) in ex.VISIBLE_SETTINGS else (1.0, 1.0)

    assert "correct" in ex.check_mean_staleness(right_on_visible_only)
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")
    with pytest.raises(common.HiddenTestFailed):
        ex.check_mean_staleness(right_on_visible_only)
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))  # the grader's kernel: to a file
    assert "recorded" in ex.check_mean_staleness(right_on_visible_only)
    assert "correct" in ex.check_mean_staleness(mean_staleness)
    assert len(list(tmp_path.glob("*-lesson06.mean_staleness.json"))) == 2


@pytest.mark.filterwarnings("ignore:.*oversubscribed")
def test_push_sum_judges_the_hidden_graphs_only_in_a_graded_run(monkeypatch, tmp_path):
    def right_on_visible_only(z, out_neighbours, in_neighbours):  # the visible z has 3 entries
        new = push_sum_step(z, out_neighbours, in_neighbours)
        return new if z.numel() == 3 else new * 2

    assert "correct" in ex.check_push_sum(right_on_visible_only)
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")
    with pytest.raises(common.HiddenTestFailed):
        ex.check_push_sum(right_on_visible_only)
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))  # the grader's kernel: to a file
    assert "recorded" in ex.check_push_sum(right_on_visible_only)


def test_the_visible_runs_are_the_simulators_and_judge_the_student_edition(monkeypatch):
    for setting, runs in ex.VISIBLE_RUNS.items():
        torch.testing.assert_close(ex.simulated_staleness(*setting), runs, rtol=1e-12, atol=0)
    assert set(ex.VISIBLE_RUNS) == set(ex.VISIBLE_SETTINGS)

    def stripped(m, s, k):
        raise NotImplementedError("not in the student edition: the grader has it")

    monkeypatch.setattr(ex, "simulated_staleness", stripped)  # as the student edition has it
    assert ex.check_mean_staleness(mean_staleness).startswith("correct")
    with pytest.raises(common.ExerciseFailed, match="fast workers' staleness, 5, is 37% above"):
        ex.check_mean_staleness(lambda m, s, k: (m - 1, k * (m - 1)))
