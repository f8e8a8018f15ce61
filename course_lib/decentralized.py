"""Decentralized SGD on a graph, and local SGD: training without a parameter server.

Slides "Parallel computing for machine learning", part 2 (decentralized network: peer-to-peer;
each node computes a local gradient, pulls its neighbours' parameters, takes a weighted average,
then steps; it converges — Lian et al. 2017 — at a rate set by how well the graph is connected,
and not at all on a disconnected graph) and the lecture note's problem 4.2 (seven workers
on a graph). Local SGD (Lin et al. 2020): H local steps between averages.

Every node is one rank of ``group`` (default: all ranks), node i = group rank i; its
neighbours' parameters arrive by point-to-point messages (``isend``/``irecv``), never through a
server or a collective. Each node computes on its rank's device.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from course_lib.data import batch_rows, shard_rows
from course_lib.erm import ERMProblem
from course_lib.erm_simulators import (  # noqa: F401  (consensus_distance: for the lessons)
    DISCONNECTED_GRAPH,
    SEVEN_NODE_GRAPH,
    check_graph,
    consensus_distance,
    local_gradient,
)
from course_lib.runtime.devices import device
from course_lib.runtime.timing import synchronize
from course_lib.training import check_whole

RING_7 = {i: [(i - 1) % 7, (i + 1) % 7] for i in range(7)}
COMPLETE_7 = {i: [j for j in range(7) if j != i] for i in range(7)}
# the four seven-node graphs of lesson 6, by spectral gap (how fast gossip agrees), smallest first
GRAPHS = {"disconnected": DISCONNECTED_GRAPH, "seven-node (lecture)": SEVEN_NODE_GRAPH,
          "ring": RING_7, "complete": COMPLETE_7}


# -- the graph's mixing matrix ---------------------------------------------------------------------


def mixing_matrix(graph: dict, rule: str = "metropolis") -> torch.Tensor:
    """W with W[i, j] > 0 only for j = i or a neighbour of i; every row sums to 1.

    ``"metropolis"``: W[i, j] = 1 / (1 + max(deg i, deg j)) and the rest on the diagonal —
    symmetric, so columns sum to 1 too (doubly stochastic) and averaging keeps the mean.
    ``"equal"``: node i weighs itself and each neighbour 1 / (deg i + 1), as in the lecture
    note's problem; on a graph whose degrees differ this is not symmetric.
    """
    graph = check_graph(graph)
    if rule not in ("metropolis", "equal"):
        raise ValueError(f"unknown rule {rule!r}: use 'metropolis' or 'equal'")
    n = len(graph)
    W = torch.zeros(n, n, dtype=torch.float64)
    for i, neighbours in graph.items():
        for j in neighbours:
            if rule == "metropolis":
                W[i, j] = 1.0 / (1 + max(len(neighbours), len(graph[j])))
            else:
                W[i, j] = 1.0 / (len(neighbours) + 1)
        W[i, i] = 1.0 - W[i].sum()
    return W


def spectral_gap(W: torch.Tensor) -> float:
    """1 - |lambda_2|, with lambda_2 the eigenvalue of W second largest in magnitude.

    Pure averaging x <- W x shrinks the distance to consensus by |lambda_2| per step (for a
    symmetric W): a gap near 1 agrees in a few steps, a gap of 0 (disconnected) never."""
    W = torch.as_tensor(W)
    if W.dim() != 2 or W.shape[0] != W.shape[1] or not len(W) or not torch.isfinite(W).all():
        raise ValueError(f"W must be a square matrix of finite numbers, at least 1 x 1, got "
                         f"shape {tuple(W.shape)}")
    magnitudes = torch.linalg.eigvals(W).abs().sort(descending=True).values
    return max(0.0, 1.0 - magnitudes[1].item()) if len(magnitudes) > 1 else 1.0


# -- one node's part -------------------------------------------------------------------------------


def gossip_average(x: torch.Tensor, graph: dict, W: torch.Tensor, group=None) -> torch.Tensor:
    """Run on every rank: send x to each neighbour, receive theirs, return sum_j W[i, j] x_j.

    All sends and receives are posted together, as one batch, before any is waited on, so no
    pair of neighbours can block each other whatever the graph."""
    i, x = dist.get_rank(group), x.to(device(group))
    received = {j: torch.empty_like(x) for j in graph[i]}
    ops = [dist.P2POp(dist.isend, x, group=group, group_peer=j) for j in graph[i]]
    ops += [dist.P2POp(dist.irecv, received[j], group=group, group_peer=j) for j in graph[i]]
    for request in dist.batch_isend_irecv(ops) if ops else []:
        request.wait()
    return float(W[i, i]) * x + sum(float(W[i, j]) * received[j] for j in graph[i])


def decentralized_sgd(problem: ERMProblem, graph: dict, *, steps: int, lr: float,
                      batch: int | None = None, rule: str = "metropolis", x0=None,
                      shards=None, seed: int = 0, group=None) -> dict:
    """Run on every rank of ``group``: node i = rank i of a graph with as many nodes as ranks.

    Each step, node i averages with its neighbours and steps along its own gradient at its
    current parameters (Lian et al.'s D-PSGD; the note's problem):
    x_i <- sum_j W[i, j] x_j - lr g_i(x_i). ``batch=None`` uses node i's whole shard (gradient
    descent), else a mini-batch; ``lr=0`` is pure gossip. ``x0`` is a (nodes x d) tensor of
    starting points (default zeros); ``shards`` the rows each node holds (default: shuffled,
    near-equal shards). Returns node i's iterates and the time of each step.
    """
    torch.set_num_threads(1)
    i, n, dev = dist.get_rank(group), dist.get_world_size(group), device(group)
    graph, steps = check_graph(graph), check_whole("steps", steps, least=0)  # as the simulator
    if len(graph) != n:
        raise ValueError(f"the graph has {len(graph)} nodes but {n} ranks were launched: "
                         f"launch with world_size={len(graph)}")
    W = mixing_matrix(graph, rule)
    local = ERMProblem(problem.X.to(dev), problem.y.to(dev), problem.lam, problem.kind)
    shards = shard_rows(problem.n, n, seed) if shards is None else list(shards)
    if len(shards) != n:
        raise ValueError(f"{len(shards)} shards for a graph of {n} nodes: give one per node")
    shard = shards[i].to(dev)
    x = (torch.zeros(problem.d, dtype=problem.X.dtype) if x0 is None else x0[i].clone()).to(dev)
    iterates, times = [x.clone()], []
    dist.barrier(group=group)
    start = time.time()
    for step in range(steps):
        rows = shard if batch is None else batch_rows(shard, batch, seed, i, step)
        g = local_gradient(local, rows, x)
        x = gossip_average(x, graph, W, group) - lr * g
        iterates.append(x.clone())
        synchronize(dev)  # on a GPU the step is done when its kernels are
        times.append(time.time() - start)
    return dict(iterates=torch.stack(iterates), times=times)


def simulate_decentralized(problem: ERMProblem, graph: dict, *, steps: int, lr: float,
                           batch: int | None = None, rule: str = "metropolis", x0=None,
                           shards=None, seed: int = 0) -> torch.Tensor:
    """The same algorithm on one process (a simulator, for checks and sweeps): the iterates as a
    (steps + 1) x nodes x d tensor."""
    n = len(graph)
    W = mixing_matrix(graph, rule)
    shards = shard_rows(problem.n, n, seed) if shards is None else list(shards)
    if len(shards) != n:
        raise ValueError(f"{len(shards)} shards for a graph of {n} nodes: give one per node")
    x = torch.zeros(n, problem.d, dtype=problem.X.dtype) if x0 is None else \
        torch.as_tensor(x0, dtype=problem.X.dtype).clone()  # the problem's dtype, as torch casts
    if x.shape != (n, problem.d):
        raise ValueError(f"x0 is one row per node: shape ({n}, {problem.d}), got {tuple(x.shape)}")
    history = [x.clone()]
    for step in range(check_whole("steps", steps, least=0)):
        rows = [s if batch is None else batch_rows(s, batch, seed, i, step)
                for i, s in enumerate(shards)]
        g = torch.stack([local_gradient(problem, rows[i], x[i]) for i in range(n)])
        x = W @ x - lr * g
        history.append(x.clone())
    return torch.stack(history)


def gather_iterates(results) -> torch.Tensor:
    """(steps + 1) x nodes x d from what ``launch(decentralized_sgd, ...)`` returned."""
    return torch.stack([r["iterates"] for r in results], dim=1)


# -- local SGD -------------------------------------------------------------------------------------


def local_sgd(problem: ERMProblem, *, local_steps: int, rounds: int, lr: float, batch: int,
              seed: int = 0, group=None) -> dict:
    """Run on every rank of ``group``: each worker takes ``local_steps`` (H) mini-batch SGD steps
    on its shard, then all workers average their parameters (one all-reduce: one communication
    round).

    H = 1 is synchronous mini-batch SGD; larger H communicates H times less. Returns the averaged
    model after every round.
    """
    torch.set_num_threads(1)
    rank, m, dev = dist.get_rank(group), dist.get_world_size(group), device(group)
    check_whole("local_steps", local_steps), check_whole("rounds", rounds, least=0)
    local = ERMProblem(problem.X.to(dev), problem.y.to(dev), problem.lam, problem.kind)
    shard = shard_rows(problem.n, m, seed)[rank].to(dev)
    w = torch.zeros(problem.d, dtype=problem.X.dtype, device=dev)
    averaged, step = [w.clone()], 0
    for _ in range(rounds):
        for _ in range(local_steps):
            rows = batch_rows(shard, batch, seed, rank + 1, step)
            w = w - lr * local_gradient(local, rows, w)
            step += 1
        dist.all_reduce(w, group=group)  # the only communication: one average per round
        w /= m
        averaged.append(w.clone())
    return dict(averaged=torch.stack(averaged))
