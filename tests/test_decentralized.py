"""Decentralized SGD on a graph and local SGD (course_lib.decentralized)."""

import pytest
import torch

from course_lib import async_sgd, launch
from course_lib import decentralized as dec
from course_lib.data import shard_rows
from course_lib.erm import diabetes_problem

RING_4 = {0: [1, 3], 1: [0, 2], 2: [1, 3], 3: [2, 0]}
SPLIT_4 = {0: [1], 1: [0], 2: [3], 3: [2]}
PATH_3 = {0: [1], 1: [0, 2], 2: [1]}  # degrees 1, 2, 1: equal weights are not symmetric


@pytest.fixture(scope="module")
def problem():
    return diabetes_problem()


def _start(nodes, d, seed=0):
    return torch.randn(nodes, d, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


@pytest.mark.parametrize("graph", [*dec.GRAPHS.values(), PATH_3], ids=[*dec.GRAPHS, "path"])
def test_metropolis_weights_are_doubly_stochastic_on_the_graph(graph):
    W = dec.mixing_matrix(graph)
    ones = torch.ones(len(graph), dtype=torch.float64)
    torch.testing.assert_close(W.sum(dim=1), ones)
    torch.testing.assert_close(W.sum(dim=0), ones)
    for i in graph:
        for j in graph:
            if j != i and j not in graph[i]:
                assert W[i, j] == 0


def test_equal_weights_follow_the_note_and_are_not_symmetric_on_uneven_degrees():
    W = dec.mixing_matrix(PATH_3, "equal")
    torch.testing.assert_close(W[1], torch.full((3,), 1 / 3, dtype=torch.float64))
    assert W[0, 1].item() == pytest.approx(0.5) and not torch.allclose(W, W.T)


def test_graph_mistakes_are_named():
    with pytest.raises(ValueError, match="one-way"):
        dec.mixing_matrix({0: [1], 1: []})
    with pytest.raises(ValueError, match="not another node"):
        dec.mixing_matrix({0: [0]})
    with pytest.raises(ValueError, match="nodes must be"):
        dec.mixing_matrix({1: [2], 2: [1]})
    # a ring of two built as a ring of n, (i - 1) % n and (i + 1) % n: the same edge twice, which
    # gossip would add twice (rows summing to 4/3, diverging) while the matrix counts degree 2
    with pytest.raises(ValueError, match=r"node 0 lists neighbour\(s\) \[1\] more than once"):
        dec.mixing_matrix({i: [(i - 1) % 2, (i + 1) % 2] for i in range(2)})
    with pytest.raises(ValueError, match="unknown rule"):
        dec.mixing_matrix(RING_4, "max")


def test_spectral_gap_orders_the_lessons_graphs_and_is_zero_when_disconnected():
    gaps = [dec.spectral_gap(dec.mixing_matrix(g)) for g in dec.GRAPHS.values()]
    assert gaps[0] == pytest.approx(0.0, abs=1e-12) and gaps[-1] == pytest.approx(1.0)
    assert gaps == sorted(gaps)


def test_gossip_on_four_ranks_equals_the_mixing_matrix_and_keeps_the_mean(problem):
    x0 = _start(4, problem.d)
    with pytest.warns(RuntimeWarning, match="oversubscribed"):
        results = launch(dec.decentralized_sgd, 4, args=(problem, RING_4),
                         kwargs=dict(steps=30, lr=0.0, x0=x0))
    x = dec.gather_iterates(results)
    W = dec.mixing_matrix(RING_4)
    torch.testing.assert_close(x[1], W @ x0)
    torch.testing.assert_close(x[-1].mean(dim=0), x0.mean(dim=0))  # the mean is preserved
    assert dec.consensus_distance(x[-1]) < 1e-3 * dec.consensus_distance(x0)


def test_gossip_never_reaches_consensus_on_a_disconnected_graph(problem):
    x0 = _start(4, problem.d)
    x = dec.simulate_decentralized(problem, SPLIT_4, steps=200, lr=0.0, x0=x0)
    # each component agrees on its own mean; the two means stay apart
    torch.testing.assert_close(x[-1][0], x0[:2].mean(dim=0))
    torch.testing.assert_close(x[-1][2], x0[2:].mean(dim=0))
    assert dec.consensus_distance(x[-1]) > 0.1


def test_consensus_distance_shrinks_by_lambda_2_per_step():
    graph = dec.GRAPHS["ring"]
    W = dec.mixing_matrix(graph)
    x = dec.simulate_decentralized(diabetes_problem(), graph, steps=60, lr=0.0,
                                   x0=_start(7, 11))
    ratio = (dec.consensus_distance(x[60]) / dec.consensus_distance(x[40])) ** (1 / 20)
    assert ratio == pytest.approx(1 - dec.spectral_gap(W), rel=0.02)


def test_decentralized_sgd_on_two_ranks_equals_the_simulator(problem):
    graph = {0: [1], 1: [0]}
    results = launch(dec.decentralized_sgd, 2, args=(problem, graph),
                     kwargs=dict(steps=10, lr=0.05, batch=16, x0=_start(2, problem.d)))
    want = dec.simulate_decentralized(problem, graph, steps=10, lr=0.05, batch=16,
                                      x0=_start(2, problem.d))
    torch.testing.assert_close(dec.gather_iterates(results), want)
    assert len(results[0]["times"]) == 10


def test_decentralized_gradient_descent_converges_on_a_connected_graph(problem):
    x = dec.simulate_decentralized(problem, dec.GRAPHS["seven-node (lecture)"], steps=300,
                                   lr=0.1)
    best = async_sgd.sequential_sgd(problem, [torch.arange(problem.n)], problem.n, 0.1, 300)
    assert problem.loss(x[-1].mean(dim=0)) == pytest.approx(problem.loss(best[-1]), rel=0.01)
    assert dec.consensus_distance(x[-1]) < 0.05


def test_wrong_number_of_ranks_for_the_graph_is_a_clear_error(problem):
    from course_lib import WorkerError

    with pytest.raises(WorkerError, match="world_size=4"):
        launch(dec.decentralized_sgd, 2, args=(problem, RING_4), kwargs=dict(steps=1, lr=0.1))


def workers_refusals(problem, group=None):
    """On each rank: the error each bad argument of the workers' functions gives."""
    said = []
    for fn, kwargs in ((dec.decentralized_sgd, dict(graph={0: [1], 1: [0]}, steps=-2, lr=0.1)),
                       (dec.decentralized_sgd, dict(graph={0: [1], 1: [0]}, steps=2.5, lr=0.1)),
                       (dec.decentralized_sgd, dict(graph={0: [1], 1: [0]}, steps=1, lr=0.1,
                                                    shards=shard_rows(problem.n, 3))),
                       (dec.local_sgd, dict(local_steps=-3, rounds=1, lr=0.1, batch=8)),
                       (dec.local_sgd, dict(local_steps=1, rounds=1.5, lr=0.1, batch=8))):
        try:
            fn(problem, group=group, **kwargs)
        except ValueError as error:
            said.append(str(error))
    return said


def test_the_workers_take_a_graph_from_tensors_and_refuse_bad_sizes_as_the_simulator(problem):
    adjacency = torch.tensor([[0, 1, 1], [1, 0, 1], [1, 1, 0]])
    graph = {i: adjacency[i].nonzero().flatten() for i in range(3)}  # tensors, as check_graph
    results = launch(dec.decentralized_sgd, 3, args=(problem, graph),
                     kwargs=dict(steps=3, lr=0.1, x0=_start(3, problem.d)))
    want = dec.simulate_decentralized(problem, graph, steps=3, lr=0.1, x0=_start(3, problem.d))
    torch.testing.assert_close(dec.gather_iterates(results), want)
    said = launch(workers_refusals, 2, args=(problem,))[0]
    assert [m.split(",")[0] for m in said] == [
        "steps must be a whole number of at least 0", "steps must be a whole number of at least 0",
        "3 shards for a graph of 2 nodes: give one per node",
        "local_steps must be a whole number of at least 1",
        "rounds must be a whole number of at least 0"]


def test_local_sgd_with_one_local_step_is_synchronous_sgd(problem):
    results = launch(dec.local_sgd, 2, args=(problem,),
                     kwargs=dict(local_steps=1, rounds=8, lr=0.1, batch=8))
    want = async_sgd.sequential_sgd(problem, shard_rows(problem.n, 2, seed=0), 8, 0.1, 8)
    torch.testing.assert_close(results[0]["averaged"], want)
    torch.testing.assert_close(results[1]["averaged"], want)


def test_local_sgd_with_more_local_steps_needs_fewer_rounds(problem):
    results = launch(dec.local_sgd, 2, args=(problem,),
                     kwargs=dict(local_steps=8, rounds=5, lr=0.1, batch=8))
    h1 = async_sgd.sequential_sgd(problem, shard_rows(problem.n, 2, seed=0), 8, 0.1, 5)
    assert problem.loss(results[0]["averaged"][-1]) < problem.loss(h1[-1])


def test_explicit_shards_are_the_rows_each_node_holds(problem):
    from course_lib.erm_simulators import local_gradient

    shards = [torch.arange(0, 50), torch.arange(50, 442)]
    graph = {0: [1], 1: [0]}
    x0 = _start(2, problem.d)
    x = dec.simulate_decentralized(problem, graph, steps=1, lr=0.1, x0=x0, shards=shards)
    W = dec.mixing_matrix(graph)
    for i in range(2):
        want = W[i] @ x0 - 0.1 * local_gradient(problem, shards[i], x0[i])
        torch.testing.assert_close(x[1][i], want)


def test_shards_that_do_not_match_the_nodes_and_an_unknown_rule_are_refused():
    problem, ring = diabetes_problem(), {0: [1], 1: [0]}
    for shards in (shard_rows(problem.n, 3), shard_rows(problem.n, 1)):  # 3 used to drop one
        with pytest.raises(ValueError, match=f"{len(shards)} shards for a graph of 2 nodes"):
            dec.simulate_decentralized(problem, ring, steps=2, lr=0.1, shards=shards)
    for graph in ({0: [], 1: []}, ring):  # no edges used to skip the check: the identity
        with pytest.raises(ValueError, match="unknown rule 'bogus'"):
            dec.mixing_matrix(graph, rule="bogus")


def test_graphs_from_tensors_work_and_impossible_graphs_or_matrices_are_refused():
    adjacency = torch.tensor([[0, 1], [1, 0]])
    from_tensors = {i: list(adjacency[i].nonzero().flatten()) for i in range(2)}
    torch.testing.assert_close(dec.mixing_matrix(from_tensors), dec.mixing_matrix({0: [1], 1: [0]}))
    with pytest.raises(ValueError, match="at least one"):
        dec.mixing_matrix({})
    with pytest.raises(ValueError, match="a node is a whole number 0..n-1, got True"):
        dec.mixing_matrix({0: [True], 1: [0]})
    for W in (torch.full((2, 2), float("nan")), torch.zeros(0, 0), torch.ones(2, 3)):
        with pytest.raises(ValueError, match="W must be a square matrix of finite numbers"):
            dec.spectral_gap(W)  # NaN reached LAPACK, which can crash the kernel


def test_a_float32_start_is_cast_as_torch_casts_and_bad_starts_or_steps_are_refused(problem):
    ring = dec.GRAPHS["ring"]
    n = len(ring)
    x32 = torch.zeros(n, problem.d)  # torch's default dtype, beside a float64 problem
    torch.testing.assert_close(
        dec.simulate_decentralized(problem, ring, steps=2, lr=0.1, x0=x32),
        dec.simulate_decentralized(problem, ring, steps=2, lr=0.1))
    with pytest.raises(ValueError, match=rf"x0 is one row per node: shape \({n}, {problem.d}\)"):
        dec.simulate_decentralized(problem, ring, steps=2, lr=0.1, x0=torch.zeros(n, 3))
    with pytest.raises(ValueError, match="steps must be a whole number of at least 0"):
        dec.simulate_decentralized(problem, ring, steps=-1, lr=0.1)
