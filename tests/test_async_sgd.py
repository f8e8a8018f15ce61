"""Staleness, its remedies and the simulator (course_lib.async_sgd); the real runs are in
test_parameter_server."""

import math
import statistics

import pytest
import torch

from course_lib import async_sgd as a
from course_lib.data import shard_rows
from course_lib.erm import diabetes_problem
from course_lib.parameter_server import fixed_lr, sgd
from course_lib.runtime.timing import spans_until


@pytest.fixture(scope="module")
def problem():
    return diabetes_problem()


def test_staleness_aware_lr_divides_by_the_staleness():
    assert fixed_lr(0.3, 7) == pytest.approx(0.3)
    assert a.staleness_aware_lr(0.3, 0) == pytest.approx(0.3)
    assert a.staleness_aware_lr(0.3, 1) == pytest.approx(0.3)
    assert a.staleness_aware_lr(0.3, 4) == pytest.approx(0.075)


def test_sequential_sgd_with_one_worker_and_the_whole_shard_is_gradient_descent(problem):
    shards = shard_rows(problem.n, 1)
    iterates = a.sequential_sgd(problem, shards, batch=problem.n, lr=0.1, steps=3)
    w = torch.zeros(problem.d, dtype=torch.float64)
    for _ in range(3):
        w = w - 0.1 * problem.gradient(w)
    torch.testing.assert_close(iterates[-1], w)
    with pytest.raises(ValueError, match="steps must be a whole number of at least 0, got -1"):
        a.sequential_sgd(problem, shards, batch=8, lr=0.1, steps=-1)
    with pytest.raises(ValueError, match="shards: give at least one worker's rows"):
        a.sequential_sgd(problem, [], batch=8, lr=0.1, steps=2)


def test_unknown_mode_and_missing_bound_are_clear_errors(problem):
    with pytest.raises(ValueError, match="unknown mode"):
        a.simulate_parameter_server(problem, 2, sgd(0.1), mode="hogwild")
    with pytest.raises(ValueError, match="bound"):
        a.simulate_parameter_server(problem, 2, sgd(0.1), mode="ssp")
    with pytest.raises(ValueError, match="workers must be"):
        a.simulate_parameter_server(problem, 0, sgd(0.1))
    with pytest.raises(ValueError, match="every worker 1..3"):
        a.simulate_parameter_server(problem, 3, sgd(0.1), pad={3: 0.05})


def test_simulated_staleness_of_equal_workers_is_m_minus_one(problem):
    log = a.simulate_parameter_server(problem, 5, sgd(0.1), gradients=100)
    assert log["staleness"][:5] == [0, 1, 2, 3, 4]  # the first round fills the pipeline
    assert set(log["staleness"][5:]) == {4}


def test_simulated_mean_staleness_is_m_minus_one_whatever_the_speeds(problem):
    # every update is seen by the m - 1 gradients in flight: the mean cannot depend on speeds
    pad = {1: 0.01, 2: 0.01, 3: 0.01, 4: 0.05}
    log = a.simulate_parameter_server(problem, 4, sgd(0.1), gradients=3000, pad=pad, jitter=0.5)
    assert statistics.mean(log["staleness"]) == pytest.approx(3, rel=0.02)


def test_simulated_straggler_staleness_is_slowdown_times_the_others(problem):
    k, m = 4, 3
    pad = {1: 0.01, 2: 0.01, m: 0.01 * k}
    log = a.simulate_parameter_server(problem, m, sgd(0.1), gradients=400, pad=pad, jitter=0.05)
    slow = [t for t, w in zip(log["staleness"], log["worker"], strict=True) if w == m][2:]
    assert statistics.median(slow) == pytest.approx(k * (m - 1), abs=1)


def test_simulated_sync_rounds_take_the_slowest_workers_time(problem):
    log = a.simulate_parameter_server(problem, 3, sgd(0.1), mode="sync", gradients=30,
                                      pad={1: 0.01, 2: 0.03, 3: 0.01})
    times = log["iterate_times"]
    gaps = [b - c for b, c in zip(times[2:], times[1:-1], strict=True)]
    assert gaps == pytest.approx([0.03] * len(gaps))
    assert set(log["staleness"]) == {0}


def test_ssp_keeps_every_worker_within_the_bound_of_the_slowest(problem):
    bound, m = 2, 3
    log = a.simulate_parameter_server(problem, m, sgd(0.1), mode="ssp", bound=bound,
                                      gradients=200, pad={1: 0.01, 2: 0.01, 3: 0.06})
    pushed = dict.fromkeys(range(1, m + 1), 0)
    for w in log["worker"]:
        pushed[w] += 1
        # a worker may push one gradient beyond the bound before it is held
        assert pushed[w] - min(pushed.values()) <= bound + 1
    free = a.simulate_parameter_server(problem, m, sgd(0.1), gradients=200,
                                       pad={1: 0.01, 2: 0.01, 3: 0.06})
    assert max(log["staleness"]) < max(free["staleness"])


def test_staleness_aware_lr_keeps_many_asynchronous_workers_stable(problem):
    # Zhang et al. 2016: with a fixed rate and many learners training fails; with alpha/tau not
    runs = {rule.__name__: a.simulate_parameter_server(problem, 16, sgd(0.1, rule),
                                                       gradients=600, jitter=0.3)
            for rule in (fixed_lr, a.staleness_aware_lr)}
    sync = a.simulate_parameter_server(problem, 16, sgd(0.1), mode="sync", gradients=600)
    final = {name: a.losses(problem, log)[-1] for name, log in runs.items()}
    assert final["fixed_lr"] > 10 * a.losses(problem, sync)[-1]
    assert final["staleness_aware_lr"] == pytest.approx(a.losses(problem, sync)[-1], rel=0.05)


def test_staleness_counts_histogram():
    counts = a.staleness_counts({"staleness": [0, 1, 1, 3, 9]}, largest=4)
    assert counts.tolist() == [1, 2, 0, 1, 1]
    assert a.staleness_counts({"staleness": [2, 2]}).tolist() == [0, 0, 2]
    assert a.staleness_counts({"staleness": []}).tolist() == []  # no gradient applied
    assert a.staleness_counts({"staleness": []}, largest=1).tolist() == [0, 0]
    with pytest.raises(ValueError, match="largest is a staleness, 0 or more"):
        a.staleness_counts({"staleness": [1]}, largest=-1)


def test_the_simulator_refuses_times_that_go_negative(problem):
    for kwargs in (dict(pad=-1.0), dict(jitter=2.0), dict(latency=-0.1), dict(pad={1: -0.1})):
        with pytest.raises(ValueError, match="compute times and latency are zero or more"):
            a.simulate_parameter_server(problem, 1, sgd(0.1), gradients=3, **kwargs)
    # a worker that takes no time never lets a seconds limit come: refused, not a hang
    with pytest.raises(ValueError, match="a seconds limit needs time to pass"):
        a.simulate_parameter_server(problem, 2, sgd(0.1), gradients=10**9, seconds=1.0, pad=0.0)
    out = a.simulate_parameter_server(problem, 2, sgd(0.1), gradients=3, pad=0.0)  # no limit
    sync = a.simulate_parameter_server(problem, 2, sgd(0.1), mode="sync", gradients=10**9,
                                       seconds=0.05, pad={1: 0.0, 2: 0.01})  # rounds take 0.01
    assert sync["iterate_times"][-1] >= 0.04
    assert out["iterate_gradients"][-1] == 3


def test_convergence_and_cut_spans_read_a_run(problem):
    log = a.simulate_parameter_server(problem, 2, sgd(0.1), gradients=6, pad={1: 0.01, 2: 0.02})
    run = a.convergence(problem, log, best=0.1)
    assert run["step"] == list(range(7)) and len(run["time"]) == 7
    start = problem.loss(torch.zeros(problem.d, dtype=torch.float64))
    assert run["loss"][0] == pytest.approx(start - 0.1)
    cut = spans_until(log["spans"], 0.015)
    assert cut and all(start < 0.015 and start + length <= 0.015 + 1e-12
                       for _, start, length, _ in cut)
    assert (2, 0.0, 0.015, "compute") in cut  # worker 2's first gradient, cut at 15 ms
    assert {span.kind for span in log["spans"]} == {"compute", "communicate / wait"}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0, -5, 2.5, True])
def test_a_gradient_limit_that_is_no_whole_number_is_refused_not_run_forever(bad):
    # NaN used to run forever (no count reaches it), 2.5 applied 3, -5 ran nothing
    with pytest.raises(ValueError, match="gradients must be a whole number of at least 1"):
        a.simulate_parameter_server(diabetes_problem(), 2, sgd(0.01), gradients=bad)


def test_a_numpy_count_and_a_time_limit_alone_still_run():
    import math

    import numpy as np

    log = a.simulate_parameter_server(diabetes_problem(), 2, sgd(0.01), gradients=np.int64(5))
    assert len(log["staleness"]) == 5
    timed = a.simulate_parameter_server(diabetes_problem(), 2, sgd(0.01), gradients=math.inf,
                                        seconds=0.1, pad=0.01)
    assert 5 <= len(timed["staleness"]) <= 25 and timed["time"][-1] <= 0.1 + 1e-9


@pytest.mark.parametrize("bound", [float("nan"), -1, 1.5, None])
def test_an_ssp_bound_that_is_no_whole_number_is_refused(bound):
    # NaN used to stop the run after 3 updates: no worker was ever within the bound
    with pytest.raises(ValueError, match="needs a staleness bound, a whole number >= 0"):
        a.simulate_parameter_server(diabetes_problem(), 3, sgd(0.01), mode="ssp", bound=bound,
                                    gradients=50)


@pytest.mark.parametrize("seconds", [math.inf, math.nan, 0, -1.0, "1"])
def test_a_time_limit_that_is_no_positive_finite_number_is_refused(seconds):
    # inf with gradients=math.inf used to run forever; NaN never came either
    with pytest.raises(ValueError, match="seconds, the time limit, must be a positive finite"):
        a.simulate_parameter_server(diabetes_problem(), 2, sgd(0.01), gradients=math.inf,
                                    seconds=seconds)


def test_ssp_with_a_worker_that_takes_no_time_needs_time_to_pass_too():
    # a huge bound let worker 1 push at time 0 until the bound: a hang
    with pytest.raises(ValueError, match="a seconds limit needs time to pass"):
        a.simulate_parameter_server(diabetes_problem(), 2, sgd(0.01), mode="ssp", bound=10**12,
                                    gradients=math.inf, seconds=0.1, pad={1: 0.0, 2: 0.01})
    log = a.simulate_parameter_server(diabetes_problem(), 2, sgd(0.01), mode="ssp", bound=2,
                                      gradients=math.inf, seconds=0.1, pad={1: 0.0, 2: 0.01},
                                      latency=0.001)  # a latency: time passes
    assert log["time"][-1] <= 0.1 + 1e-9


@pytest.mark.parametrize("kwargs", [dict(pad=math.inf), dict(pad={1: 0.01, 2: math.inf}),
                                    dict(latency=math.inf)])
def test_infinite_compute_times_or_latency_are_refused(kwargs):
    # every time used to come out infinite
    with pytest.raises(ValueError, match="nor is it infinite"):
        a.simulate_parameter_server(diabetes_problem(), 2, sgd(0.01), gradients=5, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(pad=None), dict(pad={1: "fast", 2: 0.01}),
                                    dict(latency=None)])
def test_a_pad_or_latency_that_is_no_number_is_named(kwargs):
    # pad=None was a raw TypeError
    with pytest.raises(ValueError, match=r"pad \(seconds, or \{worker: seconds\}\), jitter and "
                                         r"latency are numbers"):
        a.simulate_parameter_server(diabetes_problem(), 2, sgd(0.01), gradients=5, **kwargs)
