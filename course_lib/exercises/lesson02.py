"""Checks for lesson 2's exercises: the lecture note's FedAvg and decentralized problems.

Lecture note "Parallel computing for empirical risk minimization", sections 4.1 and 4.2.
"""

from __future__ import annotations

import torch

from course_lib.exercises.common import ExerciseFailed


def _small_federation():
    from course_lib.erm import diabetes_problem

    problem = diabetes_problem()
    sizes = [40, 120, 90, 192]  # unequal on purpose: the weights matter
    return problem, list(torch.arange(problem.n).split(sizes))


def check_fedavg_round(fedavg_round) -> str:
    """Check a student's ``fedavg_round(problem, w, client_rows, q, lr)`` against the reference
    simulator on clients of unequal size, for q = 1 and q = 5."""
    from course_lib import erm_simulators as sim

    problem, rows = _small_federation()
    w = torch.linspace(-0.5, 0.5, problem.d, dtype=torch.float64)
    for q in (1, 5):
        got = fedavg_round(problem, w.clone(), rows, q, 0.1)
        want = sim.fedavg_round(problem, w, rows, q, 0.1)
        if got is None:
            raise ExerciseFailed("fedavg_round returned None: return the new global model")
        got = torch.as_tensor(got)
        if got.shape != want.shape:
            raise ExerciseFailed(f"the new model has shape {tuple(got.shape)}, but w has "
                                 f"{tuple(want.shape)}")
        if not torch.allclose(got, want, atol=1e-10):
            unweighted = w - torch.stack([w - _local_steps(sim, problem, r, w, q, 0.1)
                                          for r in rows]).mean(dim=0)
            hint = (" It equals the plain mean of the clients' models: weight each client by its "
                    "number of samples n_k / n." if torch.allclose(got, unweighted, atol=1e-10)
                    else " Each client takes q steps from the same w on its own rows only.")
            raise ExerciseFailed(f"with q = {q}, the new model differs from the right one by "
                                 f"{(got - want).abs().max().item():.3g} (largest entry).{hint}")
    return "correct: FedAvg matches the reference for q = 1 (one GD step) and q = 5"


def _local_steps(sim, problem, rows, w, q, lr):
    w_k = w.clone()
    for _ in range(q):
        w_k = w_k - lr * sim.local_gradient(problem, rows, w_k)
    return w_k


def check_decentralized_step(decentralized_step) -> str:
    """Check ``decentralized_step(problem, params, client_rows, graph, lr)`` on the seven-node
    graph: equal to the reference, and with lr = 0 pure averaging that never leaves the range
    of the nodes' values."""
    from course_lib import erm_simulators as sim
    from course_lib.data import shard_rows
    from course_lib.erm import diabetes_problem

    problem = diabetes_problem()
    rows = shard_rows(problem.n, 7)
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(problem.d, generator=g, dtype=torch.float64) for _ in range(7)]
    for lr in (0.0, 0.05):
        got = decentralized_step(problem, [p.clone() for p in params], rows,
                                 sim.SEVEN_NODE_GRAPH, lr)
        want = sim.decentralized_step(problem, params, rows, sim.SEVEN_NODE_GRAPH, lr)
        if got is None or len(got) != 7:
            raise ExerciseFailed("decentralized_step must return a list with one parameter "
                                 "vector per node (7)")
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            if not torch.allclose(torch.as_tensor(a), b, atol=1e-10):
                what = ("pure averaging (lr = 0)" if lr == 0 else f"a step with lr = {lr}")
                raise ExerciseFailed(
                    f"node {i} is wrong after {what}: off by "
                    f"{(torch.as_tensor(a) - b).abs().max().item():.3g}. Node {i} averages "
                    f"itself and its neighbours {sim.SEVEN_NODE_GRAPH[i]} with equal weights, "
                    f"then subtracts lr times its own gradient at its current parameters.")
    return "correct: every node of the seven-node graph matches the reference"
