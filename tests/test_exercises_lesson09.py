"""Lesson 9's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson09)."""

import json

import numpy as np
import pytest
import torch

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


def _reading_the_probe(received, senders, clients, seed):
    """A student who does not unmask: it takes the case from the check's frame, redraws the
    check's inputs with the library's own helper, and sums the senders' rows of any other
    (clients x d) tensor it finds there — the true updates, if the inputs held them."""
    import inspect

    case = inspect.currentframe().f_back.f_locals["case"]
    found = [t for t in ex._inputs(case) if isinstance(t, torch.Tensor)
             and tuple(t.shape) == (clients, received.shape[1])]
    return found[0][senders].sum(dim=0) if found else received.sum(dim=0)


def test_what_the_check_draws_in_the_kernel_does_not_hold_the_answer(monkeypatch):
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")
    with pytest.raises(common.ExerciseFailed):
        ex.check_unmask_sum(_reading_the_probe)
    assert "correct" in ex.check_unmask_sum(unmask_sum)


def count(m, share, attack_seed, rounds, seeds, tolerated, at_least=False):
    over = 0
    for s in seeds:
        attackers = set(sec.fraction_attackers(range(20), share, seed=s + attack_seed))
        for r in range(rounds):
            b = len(attackers & set(fl.sample_clients(20, m / 20, s, r)))
            over += b >= tolerated if at_least else b > tolerated
    return over


def right(m, trim, share, attack_seed, rounds=12, seeds=(0, 1, 2)):
    """The right answer for one draw of the exercise cell."""
    run = (m, share, attack_seed, rounds, seeds)
    return {"trimmed mean": [int(trim * m), count(*run, int(trim * m))],
            "median": [(m - 1) // 2, count(*run, (m - 1) // 2)]}


DRAWS = [(10, 0.2, 0.3, 1), (7, 0.3, 0.4, 52_113), (14, 0.1, 0.2, 999_999), (5, 0.4, 0.25, 0)]


@pytest.mark.parametrize("draw", DRAWS)
def test_breakdown_accepts_the_counts_of_any_drawn_federation(draw):
    rounds, seeds = 12, (0, 1, 2)
    assert "correct" in ex.check_breakdown(right(*draw), *draw, rounds, seeds)


def test_breakdown_accepts_draws_from_the_notebooks_ranges():
    rng = np.random.default_rng(0)  # the exercise cell's draw, here with a seed
    for _ in range(8):
        draw = ex.draw_federation(rng)
        assert "correct" in ex.check_breakdown(right(*draw), *draw, 12, (0, 1, 2))


def test_breakdown_in_a_graded_run_must_be_for_the_runs_own_draw(monkeypatch):
    monkeypatch.setenv(common.GRADING_SEED, "7")  # the grader seeds the draw, kernel and judge
    draw = common.drawn("lesson09.federation", ex.draw_federation)
    assert draw == common.drawn("lesson09.federation", ex.draw_federation)
    assert "correct" in ex.check_breakdown(right(*draw), *draw, 12, (0, 1, 2))
    # a classmate's federation copied over the drawn values, with their (right) answer
    other = ex.draw_federation(np.random.default_rng(1))
    assert other != draw
    with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):
        ex.check_breakdown(right(*other), *other, 12, (0, 1, 2))


def test_breakdown_of_section_5_and_bigger_runs():
    assert right(10, 0.2, 0.3, 1) == {"trimmed mean": [2, 24], "median": [4, 4]}  # section 5
    assert "correct" in ex.check_breakdown(  # bigger runs: the counts follow the run
        right(10, 0.2, 0.3, 1, 20, range(5)), 10, 0.2, 0.3, 1, 20, range(5))


def test_breakdown_rejects_a_copied_answer_and_explains_wrong_tolerances_and_counts():
    rounds, seeds, draw = 12, (0, 1, 2), (9, 0.25, 0.35, 4321)
    m, trim, share, attack_seed = draw
    mine = right(*draw)
    run = (m, share, attack_seed, rounds, seeds)
    # another run's answer (section 5's, a classmate's) is wrong for this run's draw
    for other in ((10, 0.2, 0.3, 1), (9, 0.25, 0.35, 4322), (12, 0.25, 0.35, 4321)):
        assert right(*other) != mine
        with pytest.raises(common.ExerciseFailed, match="this run"):
            ex.check_breakdown(right(*other), *draw, rounds, seeds)
    with pytest.raises(common.ExerciseFailed, match="trimmed mean: 3 attackers"):  # ceil
        ex.check_breakdown(mine | {"trimmed mean": [3, count(*run, 3)]}, *draw, rounds, seeds)
    with pytest.raises(common.ExerciseFailed, match="median: 5 attackers"):  # ceil(m / 2)
        ex.check_breakdown(mine | {"median": [5, count(*run, 5)]}, *draw, rounds, seeds)
    with pytest.raises(common.ExerciseFailed, match="exactly 2"):
        ex.check_breakdown(mine | {"trimmed mean": [2, count(*run, 2, True)]}, *draw, rounds,
                           seeds)
    with pytest.raises(common.ExerciseFailed, match="every seed"):
        ex.check_breakdown(mine | {"median": [4, count(m, share, attack_seed, rounds, (0,), 4)]},
                           *draw, rounds, seeds)
    with pytest.raises(common.ExerciseFailed, match="whole numbers"):
        ex.check_breakdown({"trimmed mean": 2, "median": 4}, *draw, rounds, seeds)
    with pytest.raises(common.ExerciseFailed, match="exercise cell drew"):
        ex.check_breakdown(mine, m, 0.5, share, attack_seed, rounds, seeds)  # trims everything
    with pytest.raises(common.ExerciseFailed, match="ROUNDS and SEEDS"):
        ex.check_breakdown(mine, *draw, 0, seeds)


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    def right_on_visible_only(received, senders, clients, seed):
        total = unmask_sum(received, senders, clients, seed)
        return total if seed in (1, 2, 3, 7) else total + 1

    assert "correct" in ex.check_unmask_sum(right_on_visible_only)
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")  # cases drawn for a grading run
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


def test_breakdown_in_a_graded_run_must_use_section_5s_rounds_and_seeds(monkeypatch):
    monkeypatch.setenv(common.GRADING_SEED, "7")
    draw = common.drawn("lesson09.federation", ex.draw_federation)
    for rounds, seeds in ((1, (0,)), (12, (0,)), (11, (0, 1, 2))):  # a count one can guess
        with pytest.raises(common.ExerciseFailed, match="ROUNDS and SEEDS"):
            ex.check_breakdown(right(*draw, rounds, seeds), *draw, rounds, seeds)
    assert "correct" in ex.check_breakdown(right(*draw), *draw, 12, (0, 1, 2))
