"""Synchronous parallel AGD with a parameter server (course_lib.parameter_server)."""

import math

import pytest
import torch

from course_lib import erm, launch
from course_lib import parameter_server as ps


@pytest.fixture(scope="module")
def problem():
    return erm.breast_cancer_problem()


@pytest.mark.parametrize("topology", ["star", "tree"])
def test_parallel_agd_on_two_ranks_equals_sequential_agd(problem, topology):
    alpha, beta, iters = 1 / problem.smoothness(), 0.9, 20
    logs = launch(ps.parallel_agd, 2, args=(problem, alpha, beta, iters),
                  kwargs=dict(topology=topology))
    torch.testing.assert_close(logs[0]["iterates"], erm.agd(problem, alpha, beta, iters),
                               atol=1e-6, rtol=0)


def test_tree_on_three_ranks_equals_sequential_and_counts_the_scheduled_words(problem):
    alpha, beta, iters = 1 / problem.smoothness(), 0.9, 5
    with pytest.warns(RuntimeWarning, match="oversubscribed"):
        logs = launch(ps.parallel_agd, 3, args=(problem, alpha, beta, iters),
                      kwargs=dict(topology="tree"))
    torch.testing.assert_close(logs[0]["iterates"], erm.agd(problem, alpha, beta, iters),
                               atol=1e-6, rtol=0)
    sent = sum(log["words_sent"][0] for log in logs)
    assert sent == ps.words_per_iteration(3, problem.d, "tree")["total"]


def test_a_straggler_sets_the_pace_of_every_iteration(problem):
    logs = launch(ps.parallel_agd, 2, args=(problem, 0.1, 0.9, 4),
                  kwargs=dict(delays={1: 0.2}))
    # synchronous: the server cannot finish an iteration before the slow worker's gradient
    assert min(ps.iteration_times(logs)) >= 0.2
    assert {span[3] for span in ps.timeline_spans(logs)} == {"compute", "communicate / wait"}


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


def test_word_counts_match_the_lectures_orders():
    d = 100
    for m in (2, 4, 8, 16, 64):
        star, tree = ps.words_per_iteration(m, d, "star"), ps.words_per_iteration(m, d, "tree")
        assert star["server"] == ps.words_formula(m, d, "star") == 2 * d * (m - 1)
        assert tree["server"] == ps.words_formula(m, d, "tree") == 2 * d * math.ceil(math.log2(m))
        assert star["total"] == tree["total"] == 2 * d * (m - 1)  # same words, fewer at the hub


def test_unknown_topology():
    with pytest.raises(ValueError, match="unknown topology"):
        ps.broadcast_schedule(4, "ring")


def test_bsp_timeline_makes_everyone_wait_for_the_slowest():
    spans = ps.bsp_timeline([0.01, 0.03], communication=0.005, iterations=2)
    idle = [s for s in spans if s[3].startswith("idle")]
    assert len(idle) == 2 and all(s[0] == 0 and s[2] == pytest.approx(0.02) for s in idle)
    assert max(s[1] + s[2] for s in spans) == pytest.approx(2 * (0.03 + 0.005))


def test_probability_that_one_of_fifty_workers_fails():
    assert ps.probability_any_fails(50, 0.01).item() == pytest.approx(0.395, abs=5e-4)
    assert ps.probability_any_fails(1, 0.01).item() == pytest.approx(0.01)
