"""Federated learning: FedSGD, FedAvg and its non-IID remedies, in one process or on real ranks.

Slides "Parallel computing for machine learning", part 4 (direction 1, communication
efficiency: each client runs several local updates and sends back its model; the server
averages) and the lecture note's FedAvg problem. McMahan et al. 2017's parameters: K clients,
a fraction C of them per round, E local epochs of mini-batches of B rows (B = None: the whole
local dataset, "B = infinity"), learning rate lr. FedSGD is FedAvg with E = 1, B = infinity.

Remedies for heterogeneity from the reference numbers: FedProx (Li et al. 2020, a squared
proximal term, and stragglers' partial work kept), SCAFFOLD (Karimireddy et al. 2020, control
variates), and server optimisers FedAvgM and FedAdam (Hsu et al. 2019; Reddi et al. 2021).

The model is a small MLP held as one flat float64 vector, so that averaging, control variates
and server optimisers are vector arithmetic, and so that the same seed gives the same model in
one process and on several ranks (float64 makes the different summation orders agree to 1e-12).
One function runs both modes: on ranks, rank r hosts the clients k with k % world_size == r and
the server's sums are all-reduces.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.distributed as dist

SIZES = (64, 32, 10)  # the digits MLP: 64 pixels, 32 hidden units, 10 classes
METHODS = ("fedavg", "fedprox", "scaffold")
SERVERS = ("avg", "avgm", "adam")


# -- the model as a flat vector ------------------------------------------------------------------


def num_parameters(sizes=SIZES) -> int:
    return sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))


def init_model(sizes=SIZES, seed: int = 0) -> torch.Tensor:
    """PyTorch's default initialisation of each Linear layer, U(-1/sqrt(fan_in), +), flattened."""
    g = torch.Generator().manual_seed(seed)
    pieces = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        bound = 1 / math.sqrt(a)
        pieces.append((torch.rand(b * a + b, generator=g, dtype=torch.float64) * 2 - 1) * bound)
    return torch.cat(pieces)


def _layers(w, sizes):
    """(weight, bias) views of each layer inside the flat vector w."""
    start, layers = 0, []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers.append((w[start:start + a * b].view(b, a), w[start + a * b:start + a * b + b]))
        start += a * b + b
    return layers


def forward(w: torch.Tensor, x: torch.Tensor, sizes=SIZES) -> torch.Tensor:
    """The MLP's logits, reading each layer's weight and bias out of the flat vector w."""
    h = x.double()
    layers = _layers(w, sizes)
    for i, (weight, bias) in enumerate(layers):
        h = h @ weight.T + bias
        if i < len(layers) - 1:
            h = torch.relu(h)
    return h


def loss_and_gradient(w, x, y, sizes=SIZES):
    """Mean cross-entropy on (x, y) and its gradient with respect to w, by backpropagation
    written out (lesson 1): several times faster than autograd for a model this small."""
    layers = _layers(w, sizes)
    inputs, h = [], x.double()
    for i, (weight, bias) in enumerate(layers):
        inputs.append(h)
        h = h @ weight.T + bias
        if i < len(layers) - 1:
            h = torch.relu(h)
    log_p = torch.log_softmax(h, dim=1)
    loss = -log_p[torch.arange(len(y)), y].mean()
    delta = log_p.exp()
    delta[torch.arange(len(y)), y] -= 1
    delta /= len(y)  # dQ/dZ of the last layer
    grads = []
    for i in range(len(layers) - 1, -1, -1):
        weight, _ = layers[i]
        grads.append(torch.cat([(delta.T @ inputs[i]).flatten(), delta.sum(dim=0)]))
        if i > 0:
            delta = (delta @ weight) * (inputs[i] > 0)  # through the ReLU that made inputs[i]
    return loss.item(), torch.cat(grads[::-1])


def accuracy(w, x, y, sizes=SIZES) -> float:
    with torch.no_grad():
        return (forward(w, x, sizes).argmax(dim=1) == y).double().mean().item()


# -- a client's local work -----------------------------------------------------------------------


def local_steps(n: int, epochs: int, batch: int | None) -> int:
    """How many SGD steps E epochs of mini-batches of B rows take on n rows (B = None: one per
    epoch)."""
    return epochs * (1 if batch is None else math.ceil(n / batch))


def client_update(w, x, y, *, epochs: int, batch: int | None, lr: float, seed, mu: float = 0.0,
                  correction=None, max_steps: int | None = None, sizes=SIZES):
    """E epochs of mini-batch SGD from the global model w on one client's rows.

    ``mu`` > 0 adds FedProx's (mu/2)||v - w||^2; ``correction`` (SCAFFOLD's c - c_k) is added to
    every gradient; ``max_steps`` cuts the work short (a straggler). Returns the local model
    and the number of steps taken.
    """
    g = torch.Generator().manual_seed(int(np.random.default_rng(seed).integers(2 ** 62)))
    v, steps, budget = w.clone(), 0, max_steps if max_steps is not None else math.inf
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=g)
        for rows in ([order] if batch is None else order.split(batch)):
            if steps >= budget:
                return v, steps
            _, grad = loss_and_gradient(v, x[rows], y[rows], sizes)
            if mu:
                grad = grad + mu * (v - w)
            if correction is not None:
                grad = grad + correction
            v = v - lr * grad
            steps += 1
    return v, steps


# -- the server ------------------------------------------------------------------------------------


def sample_clients(clients: int, fraction: float, seed: int, round_: int) -> list[int]:
    """The max(1, round(C K)) clients of one round, the same on every rank for the same seed."""
    m = max(1, round(fraction * clients))
    key = [seed, *(round_ if isinstance(round_, tuple) else (round_,))]
    return sorted(np.random.default_rng(key).choice(clients, m, replace=False).tolist())


def server_step(w, average, state: dict, server: str, server_lr: float, momentum: float = 0.9,
                betas=(0.9, 0.99), tau: float = 1e-3):
    """Move the global model towards the clients' weighted average ``average``.

    "avg": take the average (FedAvg). With the pseudo-gradient delta = w - average, "avgm":
    heavy-ball momentum (FedAvgM); "adam": Adam on delta (FedAdam, tau as Adam's epsilon)."""
    if server == "avg":
        return average
    delta = w - average
    if server == "avgm":
        state["m"] = momentum * state.get("m", torch.zeros_like(w)) + delta
        return w - server_lr * state["m"]
    if server == "adam":
        state["m"] = betas[0] * state.get("m", torch.zeros_like(w)) + (1 - betas[0]) * delta
        state["v"] = betas[1] * state.get("v", torch.zeros_like(w)) + (1 - betas[1]) * delta ** 2
        return w - server_lr * state["m"] / (state["v"].sqrt() + tau)
    raise ValueError(f"unknown server {server!r}: use one of {SERVERS}")


def _sum_over_ranks(t):
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t


def federated(split, parts, *, rounds: int, fraction: float = 0.1, epochs: int = 1,
              batch: int | None = 10, lr: float = 0.1, method: str = "fedavg", mu: float = 0.0,
              server: str = "avg", server_lr: float = 1.0, stragglers: float = 0.0,
              keep_partial: bool = False, target: float | None = None, seed: int = 0,
              sizes=SIZES) -> dict:
    """Federated training of the digits MLP; clients are ``parts`` (row indices of the training
    set). Runs in this process, or, when called on every rank of a process group, with rank r
    hosting the clients k % world_size == r (same result for the same seed).

    ``stragglers``: the fraction of each round's clients that finish only part of their local
    steps (a random number); they are dropped, or with ``keep_partial`` their partial work is
    averaged in (as FedProx does). Stops early once test accuracy reaches ``target``.

    Returns the test ``accuracy`` after every round (index 0: before training), ``best`` (the
    best-so-far curve), ``rounds_to_target``, ``bytes_per_round`` (models as float32, both ways)
    and the final model ``w``.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: use one of {METHODS}")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction C must be in (0, 1], got {fraction}")
    rank, world = ((dist.get_rank(), dist.get_world_size())
                   if dist.is_available() and dist.is_initialized() else (0, 1))
    K, d = len(parts), num_parameters(sizes)
    x, y = split.x_train.double(), split.y_train
    w = init_model(sizes, seed)
    c_global, c_client, server_state = torch.zeros(d, dtype=torch.float64), {}, {}
    acc = [accuracy(w, split.x_test, split.y_test, sizes)]
    messages = 2 if method == "scaffold" else 1  # SCAFFOLD also sends control variates
    log = dict(accuracy=acc, bytes_per_round=[], seconds=[])
    for r in range(rounds):
        start = time.perf_counter()
        chosen = sample_clients(K, fraction, seed, r)
        slow = set(np.random.default_rng([seed, r, 1]).choice(
            chosen, round(stragglers * len(chosen)), replace=False).tolist())
        total = torch.zeros(d + 1, dtype=torch.float64)  # sum of n_k w_k, and of n_k
        c_delta = torch.zeros(d, dtype=torch.float64)
        for k in chosen:
            if k % world != rank:
                continue
            rows = parts[k]
            full = local_steps(len(rows), epochs, batch)
            budget = None
            if k in slow:
                if not keep_partial:
                    continue  # dropped: the server does not wait for it
                budget = int(np.random.default_rng([seed, r, k]).integers(1, full + 1))
            correction = None
            if method == "scaffold":
                correction = c_global - c_client.get(k, torch.zeros(d, dtype=torch.float64))
            v, steps = client_update(w, x[rows], y[rows], epochs=epochs, batch=batch, lr=lr,
                                     seed=[seed, r, k], mu=mu if method == "fedprox" else 0.0,
                                     correction=correction, max_steps=budget, sizes=sizes)
            if method == "scaffold":  # option II of the paper: c_k+ = c_k - c + (w - v)/(K lr)
                old = c_client.get(k, torch.zeros(d, dtype=torch.float64))
                new = old - c_global + (w - v) / (steps * lr)
                c_delta += new - old
                c_client[k] = new
            total[:d] += len(rows) * v
            total[d] += len(rows)
        total = _sum_over_ranks(total)
        if method == "scaffold":
            c_global = c_global + _sum_over_ranks(c_delta) / K
        if total[d] > 0:  # every chosen client was a dropped straggler: keep w
            w = server_step(w, total[:d] / total[d], server_state, server, server_lr)
        acc.append(accuracy(w, split.x_test, split.y_test, sizes))
        log["bytes_per_round"].append(2 * len(chosen) * d * 4 * messages)
        log["seconds"].append(time.perf_counter() - start)
        if target is not None and acc[-1] >= target:
            break
    log["best"] = np.maximum.accumulate(acc).tolist()
    log["rounds_to_target"] = rounds_to_target(acc, target) if target is not None else None
    log["w"] = w
    return log


def rounds_to_target(accuracy_per_round, target: float) -> int | None:
    """The first round whose best-so-far accuracy reaches ``target`` (None if none does)."""
    best = np.maximum.accumulate(np.asarray(accuracy_per_round))
    hits = np.flatnonzero(best >= target)
    return int(hits[0]) if len(hits) else None


def fedsgd_step(split, parts, w, lr: float, sizes=SIZES) -> torch.Tensor:
    """One FedSGD round with every client: w - lr sum_k (n_k/n) grad F_k(w)."""
    x, y = split.x_train.double(), split.y_train
    n = sum(len(p) for p in parts)
    step = sum(len(p) / n * loss_and_gradient(w, x[p], y[p], sizes)[1] for p in parts)
    return w - lr * step


def hierarchical(split, parts, edges, *, cloud_rounds: int, edge_rounds: int,
                 fraction: float = 0.5, epochs: int = 1, batch: int | None = 10,
                 lr: float = 0.1, seed: int = 0, sizes=SIZES) -> dict:
    """Hierarchical FedAvg (in one process): clients -> edge aggregators -> cloud.

    ``edges`` lists each edge's clients. Each cloud round, every edge starts from the cloud
    model and runs ``edge_rounds`` FedAvg rounds with its own clients (a fraction of them per
    round); the cloud then averages the edge models, weighted by their data. Returns the test
    ``accuracy`` after every cloud round and the bytes that crossed the ``edge_to_cloud`` links
    and the ``client_to_edge`` links in all (models as float32, both ways)."""
    x, y = split.x_train.double(), split.y_train
    d = num_parameters(sizes)
    w = init_model(sizes, seed)
    log = dict(accuracy=[accuracy(w, split.x_test, split.y_test, sizes)], edge_to_cloud=0,
               client_to_edge=0)
    for r in range(cloud_rounds):
        edge_models, edge_sizes = [], []
        for e, members in enumerate(edges):
            w_e = w.clone()
            for q in range(edge_rounds):
                chosen = [members[i] for i in
                          sample_clients(len(members), fraction, seed, (r, e, q))]
                n = sum(len(parts[k]) for k in chosen)
                w_e = sum(len(parts[k]) / n * client_update(
                    w_e, x[parts[k]], y[parts[k]], epochs=epochs, batch=batch, lr=lr,
                    seed=[seed, r, e, q, k], sizes=sizes)[0] for k in chosen)
                log["client_to_edge"] += 2 * len(chosen) * d * 4
            edge_models.append(w_e)
            edge_sizes.append(sum(len(parts[k]) for k in members))
        total = sum(edge_sizes)
        w = sum(s / total * m for s, m in zip(edge_sizes, edge_models, strict=True))
        log["edge_to_cloud"] += 2 * len(edges) * d * 4
        log["accuracy"].append(accuracy(w, split.x_test, split.y_test, sizes))
    return log
