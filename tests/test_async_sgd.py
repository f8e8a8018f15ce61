"""Synchronous vs asynchronous SGD with a parameter server (course_lib.async_sgd)."""

import statistics

import pytest
import torch

from course_lib import async_sgd as a
from course_lib import launch
from course_lib.erm import diabetes_problem


@pytest.fixture(scope="module")
def problem():
    return diabetes_problem()


def test_shards_split_every_row_once_and_batches_are_reproducible():
    shards = a.shard_rows(100, 3, seed=1)
    assert sorted(torch.cat(shards).tolist()) == list(range(100))
    assert [len(s) for s in shards] == [34, 33, 33]
    b = a.batch_rows(shards[0], 8, seed=1, worker=1, step=5)
    assert torch.equal(b, a.batch_rows(shards[0], 8, seed=1, worker=1, step=5))
    assert not torch.equal(b, a.batch_rows(shards[0], 8, seed=1, worker=1, step=6))
    assert set(b.tolist()) <= set(shards[0].tolist()) and len(set(b.tolist())) == 8
    with pytest.raises(ValueError, match="1 <= m <= n"):
        a.shard_rows(5, 6)


def test_staleness_aware_lr_divides_by_the_staleness():
    assert a.fixed_lr(0.3, 7) == 0.3
    assert a.staleness_aware_lr(0.3, 0) == 0.3
    assert a.staleness_aware_lr(0.3, 1) == 0.3
    assert a.staleness_aware_lr(0.3, 4) == pytest.approx(0.075)


def test_sequential_sgd_with_one_worker_and_the_whole_shard_is_gradient_descent(problem):
    shards = a.shard_rows(problem.n, 1)
    iterates = a.sequential_sgd(problem, shards, batch=problem.n, lr=0.1, steps=3)
    w = torch.zeros(problem.d, dtype=torch.float64)
    for _ in range(3):
        w = w - 0.1 * problem.gradient(w)
    torch.testing.assert_close(iterates[-1], w)


def test_synchronous_parameter_server_equals_sequential_minibatch_sgd(problem):
    results = launch(a.parameter_server, 2, args=(problem,),
                     kwargs=dict(mode="sync", lr=0.1, batch=8, gradients=12))
    log = a.server_log(results)
    want = a.sequential_sgd(problem, a.shard_rows(problem.n, 1), 8, 0.1, 12)
    torch.testing.assert_close(torch.stack(log["iterates"]), want, atol=1e-6, rtol=0)
    assert log["staleness"] == [0] * 12
    assert results[1]["steps"] == 12  # the reply to the 12th gradient tells the worker to stop


def test_synchronous_server_with_two_workers_averages_their_gradients(problem):
    with pytest.warns(RuntimeWarning, match="oversubscribed"):
        results = launch(a.parameter_server, 3, args=(problem,),
                         kwargs=dict(mode="sync", lr=0.1, batch=8, gradients=10))
    want = a.sequential_sgd(problem, a.shard_rows(problem.n, 2), 8, 0.1, 5)
    torch.testing.assert_close(torch.stack(results[0]["iterates"]), want, atol=1e-6, rtol=0)


def test_asynchronous_server_records_staleness_and_matches_the_simulator_rules(problem):
    with pytest.warns(RuntimeWarning, match="oversubscribed"):
        results = launch(a.parameter_server, 3, args=(problem,),
                         kwargs=dict(mode="async", lr=0.05, batch=8, gradients=20,
                                     compute_seconds=0.02, slowdown={2: 3.0}))
    log = a.server_log(results)
    assert len(log["staleness"]) == len(log["iterates"]) - 1 == 20
    assert log["staleness"][0] == 0 and max(log["staleness"]) >= 2  # the slow worker lags
    # worker 2 is three times slower: it pushes about a quarter of the gradients
    assert 3 <= log["worker"].count(2) <= 7
    kinds = {s[3] for s in log["spans"]}
    assert kinds == {"compute", "wait for the server"}


def test_a_parameter_server_needs_a_worker(problem):
    from course_lib import WorkerError

    with pytest.raises(WorkerError, match="world_size >= 2"):
        launch(a.parameter_server, 1, args=(problem,))


def test_unknown_mode_and_missing_bound_are_clear_errors(problem):
    with pytest.raises(ValueError, match="unknown mode"):
        a.simulate_parameter_server(problem, 2, mode="hogwild")
    with pytest.raises(ValueError, match="bound"):
        a.simulate_parameter_server(problem, 2, mode="ssp")


def test_simulated_staleness_of_equal_workers_is_m_minus_one(problem):
    log = a.simulate_parameter_server(problem, 5, gradients=100)
    assert log["staleness"][:5] == [0, 1, 2, 3, 4]  # the first round fills the pipeline
    assert set(log["staleness"][5:]) == {4}


def test_simulated_mean_staleness_is_m_minus_one_whatever_the_speeds(problem):
    # every update is seen by the m - 1 gradients in flight: the mean cannot depend on speeds
    log = a.simulate_parameter_server(problem, 4, gradients=3000, slowdown={4: 5.0}, jitter=0.5)
    assert statistics.mean(log["staleness"]) == pytest.approx(3, rel=0.02)


def test_simulated_straggler_staleness_is_slowdown_times_the_others(problem):
    k, m = 4, 3
    log = a.simulate_parameter_server(problem, m, gradients=400, slowdown={m: float(k)},
                                      jitter=0.05)
    slow = [t for t, w in zip(log["staleness"], log["worker"], strict=True) if w == m][2:]
    assert statistics.median(slow) == pytest.approx(k * (m - 1), abs=1)


def test_simulated_sync_rounds_take_the_slowest_workers_time(problem):
    log = a.simulate_parameter_server(problem, 3, mode="sync", gradients=30,
                                      compute_seconds=0.01, slowdown={2: 3.0})
    times = log["iterate_times"]
    gaps = [b - c for b, c in zip(times[2:], times[1:-1], strict=True)]
    assert gaps == pytest.approx([0.03] * len(gaps))
    assert set(log["staleness"]) == {0}


def test_ssp_keeps_every_worker_within_the_bound_of_the_slowest(problem):
    bound, m = 2, 3
    log = a.simulate_parameter_server(problem, m, mode="ssp", bound=bound, gradients=200,
                                      slowdown={3: 6.0})
    pushed = dict.fromkeys(range(1, m + 1), 0)
    for w in log["worker"]:
        pushed[w] += 1
        # a worker may push one gradient beyond the bound before it is held
        assert pushed[w] - min(pushed.values()) <= bound + 1
    free = a.simulate_parameter_server(problem, m, gradients=200, slowdown={3: 6.0})
    assert max(log["staleness"]) < max(free["staleness"])


def test_staleness_aware_lr_keeps_many_asynchronous_workers_stable(problem):
    # Zhang et al. 2016: with a fixed rate and many learners training fails; with alpha/tau not
    runs = {rule.__name__: a.simulate_parameter_server(problem, 16, lr=0.1, lr_rule=rule,
                                                       gradients=600, jitter=0.3)
            for rule in (a.fixed_lr, a.staleness_aware_lr)}
    sync = a.simulate_parameter_server(problem, 16, mode="sync", lr=0.1, gradients=600)
    final = {name: a.losses(problem, log)[-1] for name, log in runs.items()}
    assert final["fixed_lr"] > 10 * a.losses(problem, sync)[-1]
    assert final["staleness_aware_lr"] == pytest.approx(a.losses(problem, sync)[-1], rel=0.05)


def test_staleness_counts_histogram():
    counts = a.staleness_counts({"staleness": [0, 1, 1, 3, 9]}, largest=4)
    assert counts.tolist() == [1, 2, 0, 1, 1]
    assert a.staleness_counts({"staleness": [2, 2]}).tolist() == [0, 0, 2]


def test_convergence_and_spans_until_read_a_run(problem):
    log = a.simulate_parameter_server(problem, 2, gradients=6, compute_seconds=0.01,
                                      slowdown={2: 2.0})
    run = a.convergence(problem, log, best=0.1)
    assert run["step"] == list(range(7)) and len(run["time"]) == 7
    start = problem.loss(torch.zeros(problem.d, dtype=torch.float64))
    assert run["loss"][0] == pytest.approx(start - 0.1)
    cut = a.spans_until(log, 0.015)
    assert cut and all(start < 0.015 and start + length <= 0.015 + 1e-12
                       for _, start, length, _ in cut)
    assert (2, 0.0, 0.015, "compute") in cut  # worker 2's first gradient, cut at 15 ms
