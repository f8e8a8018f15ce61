"""Simulators for the lecture's two problems (course_lib.erm_simulators) and their checks."""

import pytest
import torch

from course_lib import erm
from course_lib import erm_simulators as sim
from course_lib.data import shard_rows


@pytest.fixture(scope="module")
def problem():
    return erm.diabetes_problem()


def test_fedavg_with_one_local_step_is_one_gradient_step(problem):
    rows = list(torch.arange(problem.n).split([100, 42, 300]))
    w = torch.randn(problem.d, dtype=torch.float64)
    torch.testing.assert_close(sim.fedavg_round(problem, w, rows, q=1, lr=0.1),
                               w - 0.1 * problem.gradient(w))


def test_fedavg_with_more_local_steps_lowers_the_loss_faster_per_round(problem):
    rows = shard_rows(problem.n, 4)
    w1 = w5 = torch.zeros(problem.d, dtype=torch.float64)
    for _ in range(5):
        w1 = sim.fedavg_round(problem, w1, rows, q=1, lr=0.1)
        w5 = sim.fedavg_round(problem, w5, rows, q=5, lr=0.1)
    assert problem.loss(w5) < problem.loss(w1)


def test_gossip_preserves_the_mean_on_a_regular_graph_and_reaches_consensus(problem):
    ring = {i: [(i - 1) % 7, (i + 1) % 7] for i in range(7)}  # regular: weights doubly stochastic
    rows = shard_rows(problem.n, 7)
    params = [torch.randn(problem.d, dtype=torch.float64) for _ in range(7)]
    mean = torch.stack(params).mean(dim=0)
    for _ in range(200):
        params = sim.decentralized_step(problem, params, rows, ring, lr=0.0)
    torch.testing.assert_close(torch.stack(params).mean(dim=0), mean)
    assert sim.consensus_distance(params) < 1e-8


def test_seven_node_graph_reaches_consensus_and_the_disconnected_one_does_not(problem):
    rows = shard_rows(problem.n, 7)
    start = [torch.full((problem.d,), float(i), dtype=torch.float64) for i in range(7)]
    for graph, agrees in ((sim.SEVEN_NODE_GRAPH, True), (sim.DISCONNECTED_GRAPH, False)):
        params = start
        for _ in range(300):
            params = sim.decentralized_step(problem, params, rows, graph, lr=0.0)
        assert (sim.consensus_distance(params) < 1e-6) is agrees


def test_graphs_are_undirected():
    for graph in (sim.SEVEN_NODE_GRAPH, sim.DISCONNECTED_GRAPH):
        assert all(i in graph[j] for i in graph for j in graph[i])


def test_consensus_distance():
    assert sim.consensus_distance([torch.ones(3), torch.ones(3)]) == pytest.approx(0.0)
    assert sim.consensus_distance([torch.zeros(1), torch.full((1,), 2.0)]) == pytest.approx(1.0)



def test_fedavg_losses_are_the_objective_after_each_round_from_zero(problem):
    rows = shard_rows(problem.n, 4)
    losses = sim.fedavg_losses(problem, rows, 3, 0.1, 5)
    w = torch.zeros(problem.d, dtype=torch.float64)
    for got in losses:
        w = sim.fedavg_round(problem, w, rows, 3, 0.1)
        assert got == pytest.approx(problem.loss(w), rel=1e-12)
    assert len(losses) == 5 and losses[-1] < losses[0]
    assert sim.fedavg_losses(problem, rows, 3, 0.1, 0) == []


def test_a_client_or_worker_without_rows_is_refused_not_averaged_into_nan():
    problem = erm.diabetes_problem()
    w = torch.zeros(problem.d, dtype=torch.float64)
    with pytest.raises(ValueError, match="has no rows"):
        sim.local_gradient(problem, [], w)
    with pytest.raises(ValueError, match="has no rows"):  # it used to return NaN everywhere
        sim.fedavg_round(problem, w, [list(range(10)), []], 1, 0.1)


def test_decentralized_step_refuses_a_neighbour_or_a_node_that_is_not_there(problem):
    rows = shard_rows(problem.n, 3)
    params = [torch.zeros(problem.d, dtype=torch.float64) for _ in range(3)]
    for graph, said in (({0: [1], 1: [0, -1], 2: [1]}, "node 1 lists neighbour -1"),  # was node 2
                        ({0: [1], 1: [0, 3], 2: [1]}, "node 1 lists neighbour 3"),
                        ({0: [0, 1], 1: [0], 2: []}, "node 0 lists neighbour 0"),  # itself: twice
                        ({0: [1, 1], 1: [0], 2: []}, "node 0 lists neighbour"),
                        ({0: [True], 1: [0], 2: []}, "a node is a whole number"),
                        ({0: [1], 1: [0]}, "3 params and 3 client_rows for 2 nodes")):
        with pytest.raises(ValueError, match=said):
            sim.decentralized_step(problem, params, rows, graph, lr=0.1)
    ring = {i: [(i - 1) % 3, (i + 1) % 3] for i in range(3)}
    with pytest.raises(ValueError, match="2 params and 3 client_rows for 3 nodes"):
        sim.decentralized_step(problem, params[:2], rows, ring, lr=0.1)  # node 2 was dropped
    assert len(sim.decentralized_step(problem, params, rows, ring, lr=0.1)) == 3


@pytest.mark.parametrize("clients, q", [([], 1), (None, 0), (None, -2), (None, 1.5)])
def test_a_fedavg_round_without_clients_or_local_steps_is_refused(problem, clients, q):
    # no clients or q <= 0 used to return w unchanged
    w = torch.ones(problem.d, dtype=torch.float64)
    rows = shard_rows(problem.n, 2) if clients is None else clients
    with pytest.raises(ValueError, match="a round needs clients"):
        sim.fedavg_round(problem, w, rows, q, lr=0.1)


def test_consensus_distance_of_no_nodes_is_refused():
    with pytest.raises(ValueError, match="at least one node"):
        sim.consensus_distance([])
    assert sim.consensus_distance(torch.ones(3, 2)) == 0.0
