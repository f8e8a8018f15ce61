"""The clients of a federated round, trained as one batch: the single-process engine of lessons
8 and 9.

``federated.client_update`` is one client's local SGD, the lecture's algorithm line by line. A
simulated round calls it for every chosen client, one after the other: dozens of tiny matrix
products each, where Python's overhead costs more than the arithmetic. :func:`train_clients`
does the same for all chosen clients at once: their models are the rows of one (k, d) tensor,
step t of every client is one batched forward and backward pass (``FlatMLP
.loss_and_gradient_batched``), and a client that has run out of steps (fewer rows, or a
straggler's budget) simply stops moving. Each client draws its mini-batches from its own
generator exactly as ``client_update`` does, so the result equals the loop's to rounding
(float64: about 1e-15; the tests hold it to 1e-10).

Real processes (``fedavg_round`` on ranks) keep the per-client loop: there, each rank trains
only the clients it hosts, and the loop is the lesson's code.
"""

from __future__ import annotations

import numpy as np
import torch

from course_lib.models import DIGITS_MLP


def _mini_batches(n: int, local, seed, budget) -> torch.Tensor:
    """The rows of one client's steps, drawn as ``client_update`` draws them, as a (steps,
    batch) table: row t holds step t's rows, padded with -1 where a batch is short."""
    g = torch.Generator().manual_seed(int(np.random.default_rng(seed).integers(2 ** 62)))
    width = n if local.batch is None else min(local.batch, n)
    per_epoch = -(-n // width)  # ceil: the last batch of an epoch may be short
    table = torch.full((local.epochs, per_epoch * width), -1, dtype=torch.long)
    for epoch in range(local.epochs):
        table[epoch, :n] = torch.randperm(n, generator=g)
    table = table.view(local.epochs * per_epoch, width)
    return table if budget is None else table[:budget]


def train_clients(w, data, local, seeds, *, budgets=None, corrections=None, model=DIGITS_MLP):
    """Local SGD of every client in ``data`` (a list of (x_k, y_k)) from the global model w, as
    ``federated.client_update`` does it for one: E epochs of mini-batches of B rows, with
    FedProx's proximal term when ``local.mu``, SCAFFOLD's ``corrections`` (one per client) added
    to every gradient, and at most ``budgets[i]`` steps for client i when given.

    Returns the clients' models as the rows of a (k, d) tensor and the steps each took.
    """
    k = len(data)
    if k == 0:
        return w.new_zeros(0, len(w)), []
    if any(len(x) == 0 for x, _ in data):
        raise ValueError("a client holds no rows: every client needs at least one")
    budgets = budgets if budgets is not None else [None] * k
    schedules = [_mini_batches(len(x), local, s, b) for (x, _), s, b in
                 zip(data, seeds, budgets, strict=True)]
    steps = [len(s) for s in schedules]
    longest, widest = max(steps), max(s.shape[1] for s in schedules)
    # pad every client's data and every batch to one shape; padded rows weigh 0
    dev = w.device
    rows = max(len(x) for x, _ in data)
    X = torch.zeros(k, rows, data[0][0].shape[1], dtype=w.dtype, device=dev)
    Y = torch.zeros(k, rows, dtype=torch.long, device=dev)
    index = torch.full((longest, k, widest), -1, dtype=torch.long)
    for i, ((x, y), schedule) in enumerate(zip(data, schedules, strict=True)):
        X[i, :len(x)], Y[i, :len(y)] = x.to(dev, w.dtype), y.to(dev)
        index[:len(schedule), i, :schedule.shape[1]] = schedule
    real = (index >= 0).to(w.dtype)
    weight = real / real.sum(dim=2, keepdim=True).clamp(min=1)  # each batch's mean
    index, weight = index.clamp(min=0).to(dev), weight.to(dev)
    active = (weight.sum(dim=2) > 0)[..., None]  # (steps, k, 1): client i still training
    clients = torch.arange(k, device=dev)[:, None]
    correction = torch.stack(list(corrections)).to(dev) if corrections is not None else None
    V = w.expand(k, -1).clone()
    for t in range(longest):
        x_t, y_t = X[clients, index[t]], Y[clients, index[t]]
        grad = model.loss_and_gradient_batched(V, x_t, y_t, weight[t])[1]
        if local.mu:
            grad = grad + local.mu * (V - w)
        if correction is not None:
            grad = grad + correction
        V = torch.where(active[t], V - local.lr * grad, V)
    return V, steps
