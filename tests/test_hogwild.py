"""Hogwild!: lock-free SGD on a model in shared memory (course_lib.hogwild)."""

import math

import numpy as np
import pytest
import torch

from course_lib import WorkerError
from course_lib import hogwild as h


@pytest.fixture(scope="module")
def problem():
    return h.sparse_logistic_problem(n=4000, d=2000, nnz=8)


def test_the_problem_is_sparse_and_its_loss_starts_at_log_2(problem):
    assert problem.indices.shape == problem.values.shape == (4000, 8)
    assert all(len(set(row)) == 8 for row in problem.indices[:50])
    assert set(np.unique(problem.y)) == {-1.0, 1.0}
    assert problem.loss(np.zeros(problem.d)) == pytest.approx(math.log(2))


def test_one_update_is_a_logistic_sgd_step_on_the_samples_coordinates_only(problem):
    w = np.random.default_rng(0).normal(size=problem.d)
    before = w.copy()
    h.sgd_updates(w, problem, [7], lr=0.3)
    wt = torch.tensor(before, requires_grad=True)
    idx, x, y = (torch.tensor(a) for a in (problem.indices[7], problem.values[7], problem.y[7]))
    torch.nn.functional.softplus(-y * (wt[idx] * x).sum()).backward()
    np.testing.assert_allclose(w, before - 0.3 * wt.grad.numpy(), atol=1e-12)
    assert np.count_nonzero(w - before) == 8


def test_collision_probability_matches_a_count(problem):
    rng = np.random.default_rng(1)
    pairs = rng.integers(problem.n, size=(20_000, 2))
    shared = [len(np.intersect1d(problem.indices[a], problem.indices[b])) > 0
              for a, b in pairs if a != b]
    assert np.mean(shared) == pytest.approx(problem.collision_probability(), abs=0.01)
    assert problem.collision_probability() == pytest.approx(8 * 8 / 2000, rel=0.1)


def test_hogwild_with_and_without_lock_converges_like_one_process(problem):
    runs = h.hogwild(problem, [(1, False), (2, False), (2, True)], epochs=2, lr=1.0)
    one, free, locked = runs
    # one process is plain sequential SGD over the same shuffled epochs
    w = np.zeros(problem.d)
    for e in range(2):
        h.sgd_updates(w, problem, h.epoch_order(problem.n, 0, 0, e), lr=1.0)
    assert one["losses"][-1] == pytest.approx(problem.loss(w), rel=1e-12)
    for run in (free, locked):  # other orders and rare collisions: the same progress
        assert run["losses"][-1] == pytest.approx(one["losses"][-1], rel=0.02)
        assert run["losses"][-1] < 0.8 * run["losses"][0]
        assert len(run["seconds"]) == 2 and run["updates_per_second"] > 0
    assert (free["processes"], free["locked"]) == (2, False)


def test_configurations_take_turns_epoch_by_epoch():
    assert h.turns(3, 2) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert h.turns(1, 3) == [(0, 0), (1, 0), (2, 0)]


def test_each_configuration_trains_its_own_model(problem):
    runs = h.hogwild(problem, [(1, False), (1, False)], epochs=2, lr=1.0)
    for c, run in enumerate(runs):  # sequential SGD over configuration c's own epochs
        w = np.zeros(problem.d)
        for e in range(2):
            h.sgd_updates(w, problem, h.epoch_order(problem.n, 0, c, e), lr=1.0)
        assert run["losses"][-1] == pytest.approx(problem.loss(w), rel=1e-12)


def test_a_failing_process_is_named_and_nothing_is_left_behind(problem):
    broken = h.SparseProblem(problem.indices.copy(), problem.values, problem.y, problem.d)
    broken.indices[5, 0] = problem.d + 3  # one sample points past the end of w
    with pytest.raises(WorkerError, match=r"Hogwild process [01] raised IndexError") as info:
        h.hogwild(broken, [(2, False)], epochs=1, timeout=30)
    assert "sgd_updates" in info.value.worker_traceback


def test_a_process_that_cannot_start_raises_its_own_error_and_stops_the_others(problem,
                                                                             monkeypatch):
    spawn_process = h.mp.get_context("spawn").Process
    real_start, started = spawn_process.start, []

    def start(self):  # the second process fails to start, as without a main guard
        started.append(self)
        if len(started) == 2:
            raise RuntimeError("cannot start a second process")
        real_start(self)

    monkeypatch.setattr(spawn_process, "start", start)
    with pytest.raises(RuntimeError, match="cannot start a second process"):
        h.hogwild(problem, [(2, False)], epochs=1, timeout=30)
    assert not started[0].is_alive()


@pytest.mark.parametrize("configs, epochs", [([], 1), ([(0, False)], 1), ([(2, "yes")], 1),
                                             ([(1, False)], 0), ([(True, False)], 1),
                                             ([(1, False)], True)])
def test_bad_configurations_are_rejected_before_any_process_starts(problem, configs, epochs):
    with pytest.raises(ValueError):
        h.hogwild(problem, configs, epochs=epochs)


@pytest.mark.parametrize("change", [dict(n=0), dict(nnz=0), dict(d=5, nnz=6), dict(noise=-0.1),
                                    dict(noise=1.5), dict(n=10.0), dict(d=True, nnz=1)])
def test_sparse_problem_refuses_impossible_sizes_by_name(change):
    with pytest.raises(ValueError, match="need whole numbers n >= 1 and 1 <= nnz <= d"):
        h.sparse_logistic_problem(**dict(dict(n=10, d=20, nnz=3), **change))
    assert h.sparse_logistic_problem(n=10, d=3, nnz=3).indices.shape == (10, 3)
