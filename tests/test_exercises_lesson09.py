"""Lesson 9's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson09)."""

import json

import pytest

from course_lib import federated as fl
from course_lib import fl_security as sec
from course_lib.exercises import common
from course_lib.exercises import lesson09 as ex


def unmask_sum(received, senders, clients, seed, sign=1.0):
    """The right answer (``sign=-1``: the masks' signs the wrong way round)."""
    total = received.sum(dim=0)
    d = received.shape[1]
    for i in senders:
        for j in set(range(clients)) - set(senders):
            m = sec.pair_mask(min(i, j), max(i, j), d, seed)
            total = total - sign * (m if i < j else -m)
    return total


def test_unmask_accepts_the_right_sum_and_explains_the_plain_sum_and_wrong_signs():
    assert "correct" in ex.check_unmask_sum(unmask_sum)
    with pytest.raises(common.ExerciseFailed, match="plain sum of what arrived"):
        ex.check_unmask_sum(lambda received, senders, clients, seed: received.sum(dim=0))
    with pytest.raises(common.ExerciseFailed, match="doubled"):
        ex.check_unmask_sum(lambda *args: unmask_sum(*args, sign=-1.0))
    with pytest.raises(common.ExerciseFailed, match="shape"):
        ex.check_unmask_sum(lambda received, *args: received)


def count(rounds, seeds, tolerated, at_least=False):
    over = 0
    for s in seeds:
        attackers = set(sec.fraction_attackers(range(20), 0.3, seed=s + 1))
        for r in range(rounds):
            b = len(attackers & set(fl.sample_clients(20, 0.5, s, r)))
            over += b >= tolerated if at_least else b > tolerated
    return over


def test_breakdown_accepts_this_runs_counts_and_explains_wrong_tolerances_and_counts():
    rounds, seeds = 12, (0, 1, 2)
    right = {"trimmed mean": [2, count(rounds, seeds, 2)], "median": [4, count(rounds, seeds, 4)]}
    assert right == {"trimmed mean": [2, 24], "median": [4, 4]}  # section 5's run
    assert "correct" in ex.check_breakdown(right, rounds, seeds)
    assert "correct" in ex.check_breakdown(  # bigger runs: the counts follow the run
        {"trimmed mean": [2, count(20, range(5), 2)], "median": [4, count(20, range(5), 4)]},
        20, range(5))
    with pytest.raises(common.ExerciseFailed, match="trimmed mean: 3 attackers"):
        ex.check_breakdown(right | {"trimmed mean": [3, count(rounds, seeds, 3)]}, rounds, seeds)
    with pytest.raises(common.ExerciseFailed, match="median: 5 attackers"):  # m / 2
        ex.check_breakdown(right | {"median": [5, count(rounds, seeds, 5)]}, rounds, seeds)
    with pytest.raises(common.ExerciseFailed, match="exactly 2"):
        ex.check_breakdown(right | {"trimmed mean": [2, count(rounds, seeds, 2, True)]},
                           rounds, seeds)
    with pytest.raises(common.ExerciseFailed, match="every seed"):
        ex.check_breakdown(right | {"median": [4, count(rounds, (0,), 4)]}, rounds, seeds)
    with pytest.raises(common.ExerciseFailed, match="whole numbers"):
        ex.check_breakdown({"trimmed mean": 2, "median": 4}, rounds, seeds)


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    def right_on_visible_only(received, senders, clients, seed):
        total = unmask_sum(received, senders, clients, seed)
        return total if seed in (1, 2, 3, 7) else total + 1

    assert "correct" in ex.check_unmask_sum(right_on_visible_only)
    monkeypatch.setenv(common.GRADING_SEED, "12345")  # cases drawn for a grading run
    with pytest.raises(common.HiddenTestFailed):
        ex.check_unmask_sum(right_on_visible_only)
    assert "correct" in ex.check_unmask_sum(unmask_sum)  # the hidden cases pass too
    # in the grader's kernel the data goes to a file and the verdict is the grader's
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "recorded" in ex.check_unmask_sum(right_on_visible_only)
    written = list(tmp_path.iterdir())
    assert [p.name for p in written] == ["000-lesson09.unmask_sum.json"]
    data = common.from_plain(json.loads(written[0].read_text()))
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson09.unmask_sum"](data)
