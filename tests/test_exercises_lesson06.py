"""Lesson 6's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson06)."""

import pytest
import torch

from course_lib.exercises import common
from course_lib.exercises import lesson06 as ex


def mean_staleness(m, q, k):
    # while one gradient is computed the others push at their rates: fast 1/c, slow 1/(k c)
    return (m - q - 1) + q / k, (m - q) * k + (q - 1)


def gradients_per_second(mode, seconds, bound):
    # async: every worker at its own pace; sync and SSP: at the slowest's, whatever the bound
    return sum(1 / c for c in seconds) if mode == "async" else len(seconds) / max(seconds)


def test_staleness_accepts_the_rates_argument_and_rejects_the_one_straggler_theory():
    assert "correct" in ex.check_mean_staleness(mean_staleness)
    with pytest.raises(common.ExerciseFailed, match="fast workers' staleness, 5, is 37% above"):
        ex.check_mean_staleness(lambda m, q, k: (m - 1, k * (m - 1)))  # m - 1 for everyone
    with pytest.raises(common.ExerciseFailed, match="slow workers' staleness, 12, is 7% below"):
        ex.check_mean_staleness(lambda m, q, k: (mean_staleness(m, q, k)[0], (m - q) * k))
    with pytest.raises(common.ExerciseFailed, match="two numbers"):
        ex.check_mean_staleness(lambda m, q, k: (m - q - 1) + q / k)
    with pytest.raises(common.ExerciseFailed, match="finite number"):
        ex.check_mean_staleness(lambda m, q, k: (float("nan"), 1.0))


def test_simulated_staleness_is_what_the_rates_argument_predicts_at_the_hidden_extremes():
    # the whole range of hidden settings (m 4..10, q 1..3, k 2..5) was run once: a right answer
    # is at most 2.3% off, at (8, 1, 3) and (10, 1, 4); here those and the corners
    for m, q, k in [(8, 1, 3.0), (10, 1, 4.0), (4, 2, 2.0), (10, 3, 5.0)]:
        for predicted, measured in zip(mean_staleness(m, q, k), ex.simulated_staleness(m, q, k),
                                       strict=True):
            assert abs(predicted / measured - 1) < ex.STALENESS_TOL / 2


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    def right_on_visible_only(m, q, k):  # hard-coded for the two settings the student sees
        return mean_staleness(m, q, k) if (m, q, k) in ex.VISIBLE_SETTINGS else (1.0, 1.0)

    assert "correct" in ex.check_mean_staleness(right_on_visible_only)
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")
    with pytest.raises(common.HiddenTestFailed):
        ex.check_mean_staleness(right_on_visible_only)
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))  # the grader's kernel: to a file
    assert "recorded" in ex.check_mean_staleness(right_on_visible_only)
    assert "correct" in ex.check_mean_staleness(mean_staleness)
    assert len(list(tmp_path.glob("*-lesson06.mean_staleness.json"))) == 2


def test_the_visible_runs_are_the_simulators_and_judge_the_student_edition(monkeypatch):
    for setting, runs in ex.VISIBLE_RUNS.items():
        torch.testing.assert_close(ex.simulated_staleness(*setting), runs, rtol=1e-12, atol=0)
    assert set(ex.VISIBLE_RUNS) == set(ex.VISIBLE_SETTINGS)

    def stripped(m, q, k):
        raise NotImplementedError("not in the student edition: the grader has it")

    monkeypatch.setattr(ex, "simulated_staleness", stripped)  # as the student edition has it
    assert ex.check_mean_staleness(mean_staleness).startswith("correct")
    with pytest.raises(common.ExerciseFailed, match="fast workers' staleness, 5, is 37% above"):
        ex.check_mean_staleness(lambda m, q, k: (m - 1, k * (m - 1)))


def test_rates_accept_the_slowest_sets_the_pace_and_explain_ssp_as_async():
    assert "correct" in ex.check_rates(gradients_per_second)

    def ssp_as_async(mode, seconds, bound):  # the bound read as "nobody waits"
        return gradients_per_second("async" if mode == "ssp" else mode, seconds, bound)

    with pytest.raises(common.ExerciseFailed, match=r"your ssp rate, 625 per second, is \d+% "
                                                    r"above.*how fast does the slowest go"):
        ex.check_rates(ssp_as_async)
    with pytest.raises(common.ExerciseFailed, match="your sync rate.*waits for every worker"):
        ex.check_rates(lambda mode, seconds, bound: 1 / max(seconds) if mode == "sync" else
                       gradients_per_second(mode, seconds, bound))
    with pytest.raises(common.ExerciseFailed, match="finite number"):
        ex.check_rates(lambda mode, seconds, bound: float("nan"))


def test_the_rates_hold_over_the_whole_hidden_range():
    # the corners of the drawn clusters: a right answer within half the tolerance of the run
    for seconds, bound in [([0.001] * 5 + [0.008], 4), ([0.008, 0.001, 0.001], 0),
                           ([0.001, 0.002, 0.004, 0.008, 0.003, 0.005], 3)]:
        for mode in ex.MODES:
            run = ex.simulated_rate(mode, seconds, bound)
            assert abs(gradients_per_second(mode, seconds, bound) / run - 1) < ex.RATE_TOL / 2


def test_rates_judge_hidden_clusters_only_in_a_graded_run_and_the_student_edition_by_digest(
        monkeypatch):
    def right_on_visible_only(mode, seconds, bound):
        known = [c for c, _ in ex.VISIBLE_CLUSTERS]
        return gradients_per_second(mode, seconds, bound) * (1 if seconds in known else 2)

    assert "correct" in ex.check_rates(right_on_visible_only)
    with monkeypatch.context() as m:
        m.setenv(common.HIDDEN_SEED, "12345")
        with pytest.raises(common.HiddenTestFailed):
            ex.check_rates(right_on_visible_only)

    def stripped(*args):
        raise NotImplementedError("not in the student edition: the grader has it")

    monkeypatch.setattr(ex, "simulated_rate", stripped)  # as the student edition has it
    assert ex.check_rates(gradients_per_second).startswith("correct for the visible clusters")
    with pytest.raises(common.ExerciseFailed, match="ssp: 625.0 is not right"):
        ex.check_rates(lambda mode, seconds, bound: gradients_per_second(
            "async" if mode == "ssp" else mode, seconds, bound))
