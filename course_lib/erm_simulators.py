"""In-process simulators for the lecture note's two problems for the reader.

Lecture note "Parallel computing for empirical risk minimization", section 4: (1) simulate
Federated Averaging — q local steps per worker, the server averages the directions; (2) simulate
decentralized optimisation — seven workers on a graph, each averages its neighbours' parameters,
then takes a gradient step, and we monitor the average model.

These are **simulators**: one process plays every worker, which is what the note asks for and
what makes sweeps cheap. The real, multi-process versions come in lessons 6 and 8.
"""

from __future__ import annotations

import numbers

import torch

from course_lib.erm import ERMProblem

# A seven-node graph in the spirit of the note's figure (our choice of edges: connected, not
# complete, nodes of degree 2 to 4).
SEVEN_NODE_GRAPH = {0: [1, 2], 1: [0, 2, 3], 2: [0, 1, 4], 3: [1, 4, 5], 4: [2, 3, 6],
                    5: [3, 6], 6: [4, 5]}
# The same nodes cut into two groups that never talk: consensus is impossible.
DISCONNECTED_GRAPH = {0: [1, 2], 1: [0, 2], 2: [0, 1], 3: [4, 5], 4: [3, 6], 5: [3, 6],
                      6: [4, 5]}


def local_gradient(problem: ERMProblem, rows, w):
    """Gradient of worker k's own objective (1/n_k) sum_{j in rows} L(w; x_j, y_j) + R(w)."""
    if not len(rows):
        raise ValueError("a worker or client has no rows: its mean gradient is undefined")
    return problem.gradient_sum(w, rows) / len(rows) + problem.lam * w


def fedavg_round(problem: ERMProblem, w, client_rows, q: int, lr: float):
    """One round of Federated Averaging.

    Each client starts from w and takes q gradient steps on its own data; it returns its
    direction w - w_k; the server moves w by the average direction, weighted by client size.
    With q = 1 this is exactly one gradient-descent step on all the data.
    """
    client_rows = list(client_rows)
    if isinstance(q, bool) or not (isinstance(q, numbers.Integral) and q >= 1) or not client_rows:
        raise ValueError(f"a round needs clients (client_rows, one list of rows each) and q >= 1 "
                         f"local steps, a whole number; got {len(client_rows)} clients, q={q!r}")
    n = sum(len(rows) for rows in client_rows)
    step = torch.zeros_like(w)
    for rows in client_rows:
        w_k = w.clone()
        for _ in range(q):
            w_k = w_k - lr * local_gradient(problem, rows, w_k)
        step += len(rows) / n * (w - w_k)
    return w - step


def fedavg_losses(problem: ERMProblem, client_rows, q: int, lr: float, rounds: int) -> list:
    """The objective after each of ``rounds`` rounds of :func:`fedavg_round` from w = 0."""
    w, losses = torch.zeros(problem.d, dtype=torch.float64), []
    for _ in range(rounds):
        w = fedavg_round(problem, w, client_rows, q, lr)
        losses.append(problem.loss(w))
    return losses


def decentralized_step(problem: ERMProblem, params, client_rows, graph, lr: float):
    """One step of decentralized gradient descent on a graph (no server).

    Node i averages its own parameters with its neighbours' (equal weights over {i} and its
    neighbours), then steps along its own local gradient taken at its current parameters.
    """
    params, client_rows = list(params), list(client_rows)
    if len(params) != len(client_rows):
        raise ValueError(f"one parameter vector per node: {len(params)} params for "
                         f"{len(client_rows)} nodes' client_rows")
    for i in range(len(params)):
        try:
            bad = [j for j in graph[i]
                   if not (isinstance(j, numbers.Integral) and 0 <= j < len(params))]
        except (KeyError, IndexError):
            bad = ["(node missing)"]
        if bad:
            raise ValueError(f"graph must give node {i}'s neighbours among nodes "
                             f"0..{len(params) - 1}, got {bad}")
    new = []
    for i, rows in enumerate(client_rows):
        group = [i, *graph[i]]
        average = torch.stack([params[j] for j in group]).mean(dim=0)
        new.append(average - lr * local_gradient(problem, rows, params[i]))
    return new


def consensus_distance(params) -> float:
    """sqrt(mean_i ||x_i - mean x||^2): how far the nodes are from agreeing."""
    params = list(params)
    if not params:
        raise ValueError("consensus_distance needs the parameters of at least one node")
    stacked = torch.stack(list(params))
    return ((stacked - stacked.mean(dim=0)) ** 2).sum(dim=1).mean().sqrt().item()
