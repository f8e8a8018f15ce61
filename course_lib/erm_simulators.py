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
import operator

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
    if isinstance(rounds, bool) or not isinstance(rounds, numbers.Integral) or rounds < 0:
        raise ValueError(f"rounds must be a whole number of at least 0, got {rounds!r}")
    for _ in range(rounds):
        w = fedavg_round(problem, w, client_rows, q, lr)
        losses.append(problem.loss(w))
    return losses


def check_graph(graph: dict) -> dict:
    """A graph is {node: [neighbours]} over nodes 0..n-1, undirected, without self-loops.
    Returns it with every node a Python int (neighbours from numpy or a tensor's nonzero())."""
    def node(j):
        if isinstance(j, bool) or not hasattr(j, "__index__"):
            raise ValueError(f"a node is a whole number 0..n-1, got {j!r}")
        return operator.index(j)

    graph = {node(i): [node(j) for j in neighbours] for i, neighbours in dict(graph).items()}
    nodes = sorted(graph)
    if not nodes or nodes != list(range(len(nodes))):
        raise ValueError(f"nodes must be 0..n-1, at least one, got {nodes}")
    for i, neighbours in graph.items():
        if len(set(neighbours)) < len(neighbours):
            twice = sorted({j for j in neighbours if list(neighbours).count(j) > 1})
            raise ValueError(f"node {i} lists neighbour(s) {twice} more than once: an edge is "
                             f"listed once (a ring of 2 nodes is {{0: [1], 1: [0]}})")
        for j in neighbours:
            if j == i or j not in graph:
                raise ValueError(f"node {i} lists neighbour {j}: not another node of the graph")
            if i not in graph[j]:
                raise ValueError(f"edge {i}-{j} is one-way: node {j} must list {i} too "
                                 f"(messages go both ways)")
    return graph


def decentralized_step(problem: ERMProblem, params, client_rows, graph, lr: float):
    """One step of decentralized gradient descent on a graph (no server).

    Node i averages its own parameters with its neighbours' (equal weights over {i} and its
    neighbours), then steps along its own local gradient taken at its current parameters.
    """
    params, client_rows, graph = list(params), list(client_rows), check_graph(graph)
    if not len(params) == len(client_rows) == len(graph):
        raise ValueError(f"one parameter vector and one set of rows per node: {len(params)} "
                         f"params and {len(client_rows)} client_rows for {len(graph)} nodes")
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
