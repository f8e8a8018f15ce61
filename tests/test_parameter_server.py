"""The parameter server, one protocol for lessons 2 and 6 (course_lib.parameter_server)."""

import math

import pytest
import torch

from course_lib import WorkerError, erm, launch
from course_lib import async_sgd as a
from course_lib import parameter_server as ps
from course_lib.cost_models import parameter_server_words
from course_lib.data import shard_rows


@pytest.fixture(scope="module")
def problem():
    return erm.breast_cancer_problem()


@pytest.mark.parametrize("topology", ["star", "tree"])
def test_synchronous_agd_with_two_workers_equals_sequential_agd(problem, topology):
    alpha, beta, iters = 1 / problem.smoothness(), 0.9, 12
    with pytest.warns(RuntimeWarning, match="oversubscribed"):
        results = launch(ps.parameter_server, 3, args=(problem, ps.heavy_ball(alpha, beta)),
                         kwargs=dict(topology=topology, gradients=2 * iters, seed=None))
    log = ps.server_log(results)
    torch.testing.assert_close(torch.stack(log["iterates"]), erm.agd(problem, alpha, beta, iters),
                               atol=1e-6, rtol=0)
    assert log["staleness"] == [0] * len(log["staleness"])


def test_a_tree_of_four_workers_relays_and_sends_the_scheduled_words(problem):
    iters = 3
    with pytest.warns(RuntimeWarning, match="oversubscribed"):
        results = launch(ps.parameter_server, 5, args=(problem, ps.sgd(0.5)),
                         kwargs=dict(topology="tree", gradients=4 * iters, seed=None))
    log = ps.server_log(results)
    gd = torch.zeros(problem.d, dtype=torch.float64)
    for _ in range(iters):  # whole shards: every round is one step of gradient descent
        gd = gd - 0.5 * problem.gradient(gd)
    torch.testing.assert_close(log["iterates"][-1], gd, atol=1e-9, rtol=0)
    tree = ps.words_per_iteration(5, problem.d, "tree")
    assert sum(log["words_sent"]) == iters * tree["total"]
    assert log["words_sent"][0] == iters * tree["server"] // 2  # the server only sends w down
    assert tree["server"] < ps.words_per_iteration(5, problem.d, "star")["server"]


def test_synchronous_sgd_equals_sequential_minibatch_sgd(problem):
    with pytest.warns(RuntimeWarning, match="oversubscribed"):
        results = launch(ps.parameter_server, 3, args=(problem, ps.sgd(0.1)),
                         kwargs=dict(mode="sync", batch=8, gradients=10))
    want = a.sequential_sgd(problem, shard_rows(problem.n, 2, seed=0), 8, 0.1, 5)
    torch.testing.assert_close(torch.stack(results[0]["iterates"]), want, atol=1e-6, rtol=0)
    assert [r["steps"] for r in results[1:]] == [5, 5]


def test_a_straggler_sets_the_pace_of_every_synchronous_iteration(problem):
    results = launch(ps.parameter_server, 2, args=(problem, ps.sgd(0.1)),
                     kwargs=dict(gradients=4, pad={1: 0.2}))
    log = ps.server_log(results)
    # synchronous: the server cannot finish an iteration before the slow worker's gradient
    assert min(ps.iteration_times(log)) >= 0.2
    assert {s.kind for s in log["spans"]} == {"compute", "communicate / wait"}
    assert all(s.lane == 1 and s.start >= 0 for s in log["spans"])
    compute = [s.duration for s in log["spans"] if s.kind == "compute"]
    assert len(compute) == 4 and min(compute) >= 0.2


def test_asynchronous_server_records_staleness_of_a_slow_worker(problem):
    with pytest.warns(RuntimeWarning, match="oversubscribed"):
        results = launch(ps.parameter_server, 3, args=(problem, ps.sgd(0.05)),
                         kwargs=dict(mode="async", batch=8, gradients=20,
                                     pad={1: 0.02, 2: 0.06}))
    log = ps.server_log(results)
    assert len(log["staleness"]) == len(log["iterates"]) - 1 == 20
    assert log["staleness"][0] == 0 and max(log["staleness"]) >= 2  # the slow worker lags
    # worker 2 is three times slower: it pushes about a quarter of the gradients
    assert 3 <= log["worker"].count(2) <= 7


def test_asynchronous_run_stops_on_the_clock(problem):
    with pytest.warns(RuntimeWarning, match="oversubscribed"):
        results = launch(ps.parameter_server, 3, args=(problem, ps.sgd(0.05)),
                         kwargs=dict(mode="async", batch=8, gradients=10**9, seconds=0.3,
                                     pad=0.01))
    log = ps.server_log(results)
    # the server looks at the clock, then waits for the next push: the last update is applied
    # about one gradient (10 ms) before or after 0.3 s (slack for a busy machine); two workers
    # of >= 10 ms each push at most 60 in 0.3 s
    assert 0.2 <= log["iterate_times"][-1] < 0.5 and 5 <= len(log["staleness"]) <= 62


def test_a_parameter_server_needs_a_worker_and_asynchrony_needs_a_star(problem):
    with pytest.raises(WorkerError, match="world_size >= 2"):
        launch(ps.parameter_server, 1, args=(problem, ps.sgd(0.1)))
    with pytest.raises(WorkerError, match="needs topology 'star'"):
        launch(ps.parameter_server, 2, args=(problem, ps.sgd(0.1)),
               kwargs=dict(mode="async", topology="tree"))


def test_server_rules_reject_unknown_modes_and_ssp_without_bound():
    w = torch.zeros(3)
    with pytest.raises(ValueError, match="unknown mode"):
        ps.ServerState(w, [1], "hogwild", None, ps.sgd(0.1), 10, None, 0.0)
    with pytest.raises(ValueError, match="bound"):
        ps.ServerState(w, [1], "ssp", None, ps.sgd(0.1), 10, None, 0.0)


def test_the_server_divides_by_rows_and_steps_with_its_optimizer():
    state = ps.ServerState(torch.zeros(2), [1, 2], "sync", None, ps.sgd(0.5), 10, None, 0.0)
    assert state.push(1, torch.tensor([2.0, 4.0]), 2.0, 1, 0, 0.1) == []  # waits for worker 2
    assert sorted(state.push(2, torch.tensor([6.0, 0.0]), 2.0, 1, 0, 0.2)) == [1, 2]
    torch.testing.assert_close(state.w, -0.5 * torch.tensor([2.0, 1.0]))  # mean of 4 rows
    assert state.applied == 2 and state.version == 1


def test_heavy_ball_is_the_notes_momentum():
    step, w, g, state = ps.heavy_ball(0.1, 0.9), torch.ones(2), torch.tensor([1.0, -1.0]), {}
    w1 = step(w, g, 0, state)
    w2 = step(w1, g, 0, state)
    torch.testing.assert_close(w1, w - 0.1 * g)
    torch.testing.assert_close(w2, w1 - 0.1 * (0.9 * g + g))
    torch.testing.assert_close(ps.sgd(0.5)(w, g, 3, {}), w - 0.5 * g)
    torch.testing.assert_close(ps.sgd(0.5, lambda lr, tau: lr / tau)(w, g, 2, {}), w - 0.25 * g)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 13])
def test_schedules_reach_every_rank_and_sum_into_the_server(m):
    for topology in ps.TOPOLOGIES:
        have = {0}
        for round_ in ps.broadcast_schedule(m, topology):
            assert all(src in have for src, _ in round_)  # only a rank that has w sends it
            have |= {dst for _, dst in round_}
        assert have == set(range(m))
        sent = [src for round_ in ps.reduce_schedule(m, topology) for src, _ in round_]
        assert sorted(sent) == list(range(1, m))  # every worker's sum goes up exactly once


def test_tree_links_follow_the_schedule():
    assert ps.tree_links(0, 5, "tree") == (None, [1, 2, 4])
    assert ps.tree_links(1, 5, "tree") == (0, [3])
    assert ps.tree_links(3, 5, "tree") == (1, [])
    assert ps.tree_links(4, 5, "star") == (0, [])


def test_word_counts_match_the_lectures_orders():
    d = 100
    for m in (2, 4, 8, 16, 64):
        star, tree = ps.words_per_iteration(m, d, "star"), ps.words_per_iteration(m, d, "tree")
        assert star["server"] == parameter_server_words(m, d, "star") == 2 * d * (m - 1)
        assert tree["server"] == parameter_server_words(m, d, "tree") == \
            2 * d * math.ceil(math.log2(m))
        assert star["total"] == tree["total"] == 2 * d * (m - 1)  # same words, fewer at the hub


def test_unknown_topology():
    with pytest.raises(ValueError, match="unknown topology"):
        ps.broadcast_schedule(4, "ring")
