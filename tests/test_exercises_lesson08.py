"""Lesson 8's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson08)."""

import json

import numpy as np
import pytest

from course_lib import partitions as pt
from course_lib.data import load_digits
from course_lib.exercises import common
from course_lib.exercises import lesson08 as ex


def with_floor(labels, clients, alpha, min_size, seed, spread=None):
    """The right answer; ``spread`` replaces the Dirichlet split of the rest (wrong answers)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    parts = [list(order[: clients * min_size][i::clients]) for i in range(clients)]
    rest = order[clients * min_size:]
    for c in np.unique(labels):
        rows = rng.permutation(rest[labels[rest] == c])
        if spread is None:
            cuts = (np.cumsum(rng.dirichlet(np.full(clients, alpha))) * len(rows)).astype(int)
            pieces = np.split(rows, cuts[:-1])
        else:
            pieces = spread(rows, clients, rng)
        for i, piece in enumerate(pieces):
            parts[i] += list(piece)
    return [np.array(p, dtype=int) for p in parts]


def test_floor_partition_accepts_the_right_one_and_explains_redraws_even_splits_and_no_floor():
    assert "correct" in ex.check_dirichlet_with_floor(with_floor)
    with pytest.raises(common.ExerciseFailed, match="raised PartitionError"):  # the library's
        ex.check_dirichlet_with_floor(lambda labels, k, a, m, s: pt.dirichlet_per_class(
            labels, k, alpha=a, min_size=m, seed=s))
    with pytest.raises(common.ExerciseFailed, match="spread too evenly"):  # the rest dealt IID
        ex.check_dirichlet_with_floor(lambda *args: with_floor(
            *args, spread=lambda rows, k, rng: np.array_split(rows, k)))
    with pytest.raises(common.ExerciseFailed, match="give every client min_size"):  # no floor
        ex.check_dirichlet_with_floor(lambda labels, k, a, m, s: pt.dirichlet_per_class(
            labels, k, alpha=a, min_size=0, seed=s))
    with pytest.raises(common.ExerciseFailed, match="far from the global"):  # alpha ignored
        ex.check_dirichlet_with_floor(lambda labels, k, a, m, s: with_floor(
            labels, k, 0.01, m, s))
    with pytest.raises(common.ExerciseFailed, match="same seed"):  # not seeded
        ex.check_dirichlet_with_floor(lambda labels, k, a, m, s: with_floor(
            labels, k, a, m, np.random.randint(10**6)))


def uniform_tv(labels, parts):
    counts = pt.label_counts(labels, parts).astype(float)
    q = (counts / counts.sum(axis=1, keepdims=True)).mean(axis=0)
    return 0.5 * np.abs(q - counts.sum(axis=0) / counts.sum()).sum()


LABELS = np.random.default_rng(0).integers(0, 10, 600)


@pytest.mark.parametrize("alpha, seed", [(0.3, 0), (0.25, 4821), (0.97, 123456)])
def test_uniform_mix_accepts_this_runs_distance_for_any_drawn_alpha_and_seed(alpha, seed):
    parts = pt.dirichlet_per_class(LABELS, 20, alpha=alpha, min_size=5, seed=seed)
    tv = uniform_tv(LABELS, parts)
    assert tv > 0.003
    assert "correct" in ex.check_uniform_mix(tv, LABELS, 20, alpha, seed)
    assert "correct" in ex.check_uniform_mix(tv - 8e-4, LABELS, 20, np.float64(alpha),
                                             np.int64(seed))  # as numpy draws them


def test_uniform_mix_explains_l1_zero_the_clients_mean_and_a_copied_number():
    alpha, seed = 0.3, 7
    parts = pt.dirichlet_per_class(LABELS, 20, alpha=alpha, min_size=5, seed=seed)
    tv = uniform_tv(LABELS, parts)
    with pytest.raises(common.ExerciseFailed, match="half of it"):
        ex.check_uniform_mix(2 * tv, LABELS, 20, alpha, seed)
    with pytest.raises(common.ExerciseFailed, match="size-weighted"):
        ex.check_uniform_mix(0.0, LABELS, 20, alpha, seed)
    with pytest.raises(common.ExerciseFailed, match="clients' own mixes"):
        ex.check_uniform_mix(pt.earth_movers_distance(pt.label_counts(LABELS, parts)).mean() / 2,
                             LABELS, 20, alpha, seed)
    # another run's answer (a classmate's, or an earlier draw) is wrong for this run's draw
    for other_alpha, other_seed in ((0.3, 8), (0.8, 7)):
        copied = uniform_tv(LABELS, pt.dirichlet_per_class(LABELS, 20, alpha=other_alpha,
                                                            min_size=5, seed=other_seed))
        assert abs(copied - tv) > 2e-3
        with pytest.raises(common.ExerciseFailed, match="in code from this run's partition"):
            ex.check_uniform_mix(copied, LABELS, 20, alpha, seed)
    with pytest.raises(common.ExerciseFailed, match="as a number"):
        ex.check_uniform_mix("0.02", LABELS, 20, alpha, seed)
    with pytest.raises(common.ExerciseFailed, match="K, alpha and seed"):
        ex.check_uniform_mix(tv, LABELS, 20, -0.3, seed)
    with pytest.raises(common.ExerciseFailed, match="no such partition"):  # min_size 5 x 200
        ex.check_uniform_mix(tv, LABELS, 200, alpha, seed)


def test_uniform_mix_in_a_graded_run_must_be_for_the_runs_own_draw(monkeypatch):
    monkeypatch.setenv(common.GRADING_SEED, "7")  # the grader seeds the draw, kernel and judge
    alpha, seed = common.drawn("lesson08.partition", ex.draw_partition)
    assert (alpha, seed) == common.drawn("lesson08.partition", ex.draw_partition)
    assert 0.25 <= alpha <= 1 and 0 <= seed < 10**6
    labels = load_digits().y_train.numpy()  # the notebook's labels and K
    tv = uniform_tv(labels, pt.dirichlet_per_class(labels, 50, alpha=alpha, min_size=5,
                                                   seed=seed))
    assert "correct" in ex.check_uniform_mix(tv, labels, 50, float(alpha), int(seed))
    # a classmate's alpha and seed copied over the drawn ones, with their (right) answer
    other_alpha, other_seed = ex.draw_partition(np.random.default_rng(1))
    assert (other_alpha, other_seed) != (alpha, seed)
    copied = uniform_tv(labels, pt.dirichlet_per_class(labels, 50, alpha=other_alpha,
                                                       min_size=5, seed=other_seed))
    with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):
        ex.check_uniform_mix(copied, labels, 50, other_alpha, other_seed)
    # labels or K of the student's own making (all one label: a distance of 0 with any K)
    for fake_labels, k in ((np.zeros_like(labels), 2), (labels, 20), (labels[:-1], 50)):
        with pytest.raises(common.ExerciseFailed, match="pass the notebook's labels"):
            ex.check_uniform_mix(0.0, fake_labels, k, float(alpha), int(seed))


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    def right_on_visible_only(labels, clients, alpha, min_size, seed):
        if len(labels) == 1347:
            return with_floor(labels, clients, alpha, min_size, seed)
        return with_floor(labels, clients, alpha, 0, seed)  # forgets the floor

    assert "correct" in ex.check_dirichlet_with_floor(right_on_visible_only)
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")  # cases drawn for a grading run
    with pytest.raises(common.HiddenTestFailed):
        ex.check_dirichlet_with_floor(right_on_visible_only)
    assert "correct" in ex.check_dirichlet_with_floor(with_floor)  # the hidden cases pass too
    # in the grader's kernel the data goes to a file and the verdict is the grader's
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "recorded" in ex.check_dirichlet_with_floor(right_on_visible_only)
    written = list(tmp_path.iterdir())
    assert [p.name for p in written] == ["000-lesson08.dirichlet_with_floor.json"]
    data = common.from_plain(json.loads(written[0].read_text()))
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson08.dirichlet_with_floor"](data)
