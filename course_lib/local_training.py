"""The clients of a federation, and their local training in a round: the lecture's loop, and every
client at once.

Slides "Parallel computing for machine learning", part 4 (each client runs several local updates
from the global model and sends back its model) and McMahan et al. 2017's E, B and lr.
:func:`client_update` is one client's local SGD, the lecture's algorithm line by line. Its two
parts are written once and used by both engines: :func:`mini_batches` (which rows each step
takes, drawn from the client's own seed) and :func:`local_step` (the update itself, with
FedProx's proximal term and SCAFFOLD's correction).

A simulated round in one process calls ``client_update`` for every chosen client, one after the
other: dozens of tiny matrix products each, where Python's overhead costs more than the
arithmetic. :func:`train_clients` runs the same two parts for all chosen clients at once: their
models are the rows of one (k, d) tensor, step t of every client is one batched forward and
backward pass (``FlatMLP.loss_and_gradient_batched``), and a client that has run out of steps
(fewer rows, or a straggler's budget) stops moving. Only the gradient's evaluation differs, so
the models equal the loop's to rounding (float64: about 1e-15; the tests hold them to 1e-10).
Real processes (``federated.fedavg_round`` on ranks) keep the per-client loop: there, each rank
trains only the clients it hosts. :class:`Clients` is the federation's data: who holds which rows.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import numpy as np
import torch

from course_lib.models import DIGITS_MLP


@dataclass(frozen=True)
class LocalTraining:
    """What each client does in a round: ``epochs`` (E) passes over its rows in mini-batches of
    ``batch`` (B; None: all its rows at once) with learning rate ``lr``; ``mu`` > 0 adds
    FedProx's proximal term (mu/2)||v - w||^2."""

    epochs: int = 1
    batch: int | None = 10
    lr: float = 0.1
    mu: float = 0.0

    def __post_init__(self):
        if not _at_least_one(self.epochs):
            raise ValueError(f"epochs E must be a whole number >= 1, got {self.epochs!r}")
        if self.batch is not None and not _at_least_one(self.batch):
            raise ValueError(f"batch B must be a whole number >= 1 or None, got {self.batch!r}")
        if not (0 <= self.lr < float("inf") and 0 <= self.mu < float("inf")):
            raise ValueError(f"lr and mu must be zero or more and finite (as torch's SGD asks of "
                             f"lr), got lr={self.lr!r}, mu={self.mu!r}")

    def steps(self, n: int) -> int:
        """SGD steps E epochs take on n rows (one per epoch when B = None)."""
        return self.epochs * (1 if self.batch is None else math.ceil(n / self.batch))


@dataclass(frozen=True, eq=False)
class Clients:
    """The federation's data: client k holds the rows ``parts[k]`` of (x, y)."""

    x: torch.Tensor
    y: torch.Tensor
    parts: list

    @classmethod
    def of(cls, split, parts) -> Clients:
        """The training rows of a ``data`` split (x as float64), shared out by ``parts``."""
        return cls(split.x_train.double(), split.y_train, list(parts))

    def __len__(self) -> int:
        return len(self.parts)

    def rows(self, k) -> int:
        return len(self.parts[k])

    def data(self, k, dev=None):
        """Client k's (x_k, y_k), on ``dev`` (default: where x is)."""
        dev = self.x.device if dev is None else dev
        index = torch.as_tensor(self.parts[k]).to(self.x.device)
        return self.x[index].to(dev), self.y[index].to(dev)


def _at_least_one(value) -> bool:
    if isinstance(value, bool):  # True is 1 to Python, not a count
        return False
    try:
        return operator.index(value) >= 1
    except TypeError:
        return False


def mini_batches(n: int, local: LocalTraining, seed, budget: int | None = None) -> torch.Tensor:
    """The rows each local step of a client with n rows takes: a fresh random order per epoch,
    cut into batches of B, from a generator seeded by ``seed`` (a number or a list of numbers).
    A (steps, width) table: row t holds step t's rows, padded with -1 where a batch is short;
    at most ``budget`` steps (a straggler's) when given."""
    if n < 1:
        raise ValueError("a client holds no rows: every client needs at least one")
    g = torch.Generator().manual_seed(int(np.random.default_rng(seed).integers(2 ** 62)))
    width = n if local.batch is None else min(local.batch, n)
    per_epoch = -(-n // width)  # ceil: the last batch of an epoch may be short
    table = torch.full((local.epochs, per_epoch * width), -1, dtype=torch.long)
    for epoch in range(local.epochs):
        table[epoch, :n] = torch.randperm(n, generator=g)
    table = table.view(local.epochs * per_epoch, width)
    return table if budget is None else table[:budget]


def local_step(v, w, grad, local: LocalTraining, correction=None):
    """One local SGD step from v, the client's model (w: the round's global model): FedProx adds
    mu (v - w) to the gradient, SCAFFOLD its ``correction`` c - c_k."""
    if local.mu:
        grad = grad + local.mu * (v - w)
    if correction is not None:
        grad = grad + correction
    return v - local.lr * grad


def client_update(w, x, y, local: LocalTraining, seed, *, correction=None,
                  max_steps: int | None = None, model=DIGITS_MLP):
    """E epochs of mini-batch SGD from the global model w on one client's rows (x, y).

    ``correction`` (SCAFFOLD's c - c_k) is added to every gradient; ``max_steps`` cuts the work
    short (a straggler). Returns the local model and the number of steps taken.
    """
    v, schedule = w.clone(), mini_batches(len(x), local, seed, max_steps)
    for rows in schedule.to(x.device):
        rows = rows[rows >= 0]
        grad = model.loss_and_gradient(v, x[rows], y[rows])[1]
        v = local_step(v, w, grad, local, correction)
    return v, len(schedule)


def train_clients(w, data, local, seeds, *, budgets=None, corrections=None, model=DIGITS_MLP):
    """Local SGD of every client in ``data`` (a list of (x_k, y_k)) from the global model w, as
    :func:`client_update` does it for one: the same :func:`mini_batches` from each client's seed
    and the same :func:`local_step`, with SCAFFOLD's ``corrections`` (one per client) and at most
    ``budgets[i]`` steps for client i when given.

    Returns the clients' models as the rows of a (k, d) tensor and the steps each took.
    """
    k = len(data)
    if k == 0:
        return w.new_zeros(0, len(w)), []
    budgets = budgets if budgets is not None else [None] * k
    schedules = [mini_batches(len(x), local, s, b) for (x, _), s, b in
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
        V = torch.where(active[t], local_step(V, w, grad, local, correction), V)
    return V, steps
