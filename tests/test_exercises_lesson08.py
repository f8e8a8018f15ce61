"""Lesson 8's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson08)."""

import json

import numpy as np
import pytest

from course_lib import partitions as pt
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


def test_uniform_mix_accepts_the_distance_and_explains_l1_zero_and_the_clients_mean():
    labels = np.random.default_rng(0).integers(0, 10, 600)
    parts = pt.dirichlet_per_class(labels, 20, alpha=0.3, min_size=5)
    tv = uniform_tv(labels, parts)
    assert tv > 0.01
    assert "correct" in ex.check_uniform_mix(tv, labels, parts)
    assert "correct" in ex.check_uniform_mix(tv + 8e-4, labels, parts)
    with pytest.raises(common.ExerciseFailed, match="half of it"):
        ex.check_uniform_mix(2 * tv, labels, parts)
    with pytest.raises(common.ExerciseFailed, match="size-weighted"):
        ex.check_uniform_mix(0.0, labels, parts)
    with pytest.raises(common.ExerciseFailed, match="clients' own mixes"):
        ex.check_uniform_mix(pt.earth_movers_distance(pt.label_counts(labels, parts)).mean() / 2,
                             labels, parts)
    with pytest.raises(common.ExerciseFailed, match="different sizes"):
        ex.check_uniform_mix(0.0, labels, pt.iid(labels, 20))
    with pytest.raises(common.ExerciseFailed, match="partition of them"):
        ex.check_uniform_mix(tv, labels, parts[1:])


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    def right_on_visible_only(labels, clients, alpha, min_size, seed):
        if len(labels) == 1347:
            return with_floor(labels, clients, alpha, min_size, seed)
        return with_floor(labels, clients, alpha, 0, seed)  # forgets the floor

    assert "correct" in ex.check_dirichlet_with_floor(right_on_visible_only)
    monkeypatch.setenv(common.GRADING_SEED, "12345")  # cases drawn for a grading run
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
