"""Federated learning's remedies outside the clients' SGD: server optimisers and SCAFFOLD.

Lecture: slides part 4 and the papers on heterogeneity. The server's step is a function
``server(w, update, state) -> new model`` of the current model, the round's aggregated update
(Reddi et al. 2021's Delta: the clients' weighted average minus w in FedAvg, a robust rule's
output in lesson 9) and its own state: :func:`fedavg_server` (w + update: the average itself),
:func:`fedavgm_server` and :func:`fedadam_server` (Hsu et al. 2019; Reddi et al. 2021).
:class:`ControlVariates` are SCAFFOLD's (Karimireddy et al. 2020). :mod:`course_lib.federated`
uses them (and re-exports these names).
"""

from __future__ import annotations

import numbers

import torch
import torch.distributed as dist

# -- the server's step: a function of the current model, the round's update and its state -------
# (the state, e.g. momentum, is a dict the training loop owns: a step function can be reused)


def fedavg_server():
    """FedAvg: the new global model is w plus the round's update (in FedAvg: the average)."""
    return lambda w, update, state: w + update


def fedavgm_server(lr: float = 1.0, momentum: float = 0.9):
    """FedAvgM: heavy-ball momentum on the round's update (the pseudo-gradient is -update)."""

    def step(w, update, state):
        state["m"] = momentum * state.get("m", torch.zeros_like(w)) + update
        return w + lr * state["m"]

    return step


def fedadam_server(lr: float = 0.01, betas=(0.9, 0.99), tau: float = 1e-3):
    """FedAdam: Adam on the round's update Delta (tau plays Adam's epsilon). As torch's Adam,
    each beta lies in [0, 1)."""
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ValueError(f"betas must be two numbers in [0, 1), as Adam's, got {betas!r}")

    def step(w, update, state):
        state["m"] = betas[0] * state.get("m", torch.zeros_like(w)) + (1 - betas[0]) * update
        state["v"] = betas[1] * state.get("v", torch.zeros_like(w)) + (1 - betas[1]) * update ** 2
        return w + lr * state["m"] / (state["v"].sqrt() + tau)

    return step


class ControlVariates:
    """SCAFFOLD's control variates (Karimireddy et al. 2020): the server's c and each client's
    c_k, held where the client's data is. A client corrects every local gradient by c - c_k."""

    def __init__(self, d: int, clients: int, device=None):
        if isinstance(clients, bool) or not isinstance(clients, numbers.Integral) or clients < 1:
            raise ValueError(f"clients (K, the server's divisor) must be a whole number of at "
                             f"least 1, got {clients!r}")
        self.c = torch.zeros(d, dtype=torch.float64, device=device)
        self.c_k, self.clients, self.delta = {}, clients, torch.zeros_like(self.c)

    def correction(self, k):
        return self.c - self.c_k.get(k, torch.zeros_like(self.c))

    def update(self, k, w, v, steps: int, lr: float) -> None:
        """Option II of the paper: c_k+ = c_k - c + (w - v) / (steps lr)."""
        if not (steps >= 1 and lr > 0):
            raise ValueError(f"SCAFFOLD's option II divides by steps x lr: a client needs at "
                             f"least one step and lr above 0, got steps={steps!r}, lr={lr!r}")
        old = self.c_k.get(k, torch.zeros_like(self.c))
        self.c_k[k] = old - self.c + (w - v) / (steps * lr)
        self.delta += self.c_k[k] - old

    def end_round(self, group=None) -> None:
        """c += (sum of this round's changes of c_k) / K, the sum taken over all ranks."""
        self.c = self.c + sum_over_ranks(self.delta, group) / self.clients
        self.delta = torch.zeros_like(self.c)


def sum_over_ranks(t, group=None):
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, group=group)
    return t
