"""Federated learning: FedSGD, FedAvg and its non-IID remedies, in one process or on real ranks.

Slides "Parallel computing for machine learning", part 4 (direction 1, communication
efficiency: each client runs several local updates and sends back its model; the server
averages) and the lecture note's FedAvg problem. McMahan et al. 2017's parameters: K clients,
a fraction C of them per round, E local epochs of mini-batches of B rows (B = None: the whole
local dataset, "B = infinity"), learning rate lr. FedSGD is FedAvg with E = 1, B = infinity.

The lecture's steps, one function each: :func:`sample_clients` (the server picks C K clients),
``client_update`` (a client's local SGD, :mod:`course_lib.local_training`), :func:`fedavg_round`
(the chosen clients train; their models averaged, weighted by their data), :func:`federated`
(rounds of that, each ending with the server's step). What the clients do is a
:class:`LocalTraining`, how the server runs the rounds a :class:`Federation`. Remedies for
heterogeneity: FedProx (a proximal term; stragglers' partial work kept), SCAFFOLD
(:class:`ControlVariates`), and server steps ``server(w, update, state) -> new model`` on the
round's update (the weighted average minus w): :func:`fedavg_server`, :func:`fedavgm_server`,
:func:`fedadam_server` (Hsu et al. 2019; Reddi et al. 2021; :mod:`course_lib.fl_remedies`).

The model is ``models.FlatMLP``, one flat float64 vector: averaging, control variates and server
optimisers are vector arithmetic. The same code runs in one process or on every rank of
``group`` (rank r hosts the clients k with k % p == r, on its device; the server's sums are
all-reduced): the same result for the same seed.

Lesson 8's check, FedAvg on ranks against FedAvg in one process (K = 50 clients holding label
shards of the digits, C = 0.2, E = 5, B = 10)::

    python -m course_lib.federated --world-size 2 [--rounds 5] [--fraction 0.2]
    torchrun --standalone --nproc-per-node 2 -m course_lib.federated
"""

from __future__ import annotations

import numbers
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from course_lib.cost_models import federated_bytes_per_round
from course_lib.fl_remedies import (  # noqa: F401  (fl.fedadam_server ...: the lessons')
    ControlVariates,
    fedadam_server,
    fedavg_server,
    fedavgm_server,
    sum_over_ranks,
)
from course_lib.local_training import (  # noqa: F401  (fl.client_update ...: the lessons')
    Clients,
    LocalTraining,
    client_update,
    train_clients,
)
from course_lib.models import DIGITS_MLP
from course_lib.runtime.devices import device
from course_lib.runtime.torchrun import run_command, run_main
from course_lib.training import check_whole, rank_and_size


@dataclass(frozen=True)
class Federation:
    """How the server runs federated training: ``rounds`` rounds, each sampling a ``fraction`` C
    of the clients (the draws seeded by ``seed``) and ending with the server's step ``server``
    (default :func:`fedavg_server`). ``scaffold``: SCAFFOLD's control variates. A share
    ``stragglers`` of each round's clients manage only part of their steps: they are dropped, or
    with ``keep_partial`` their partial work is averaged in (FedProx). Stops at ``target``."""

    rounds: int
    fraction: float = 0.1
    server: Callable | None = None
    scaffold: bool = False
    stragglers: float = 0.0
    keep_partial: bool = False
    target: float | None = None
    seed: int = 0

    def __post_init__(self):
        for name in ("rounds", "seed"):
            check_whole(name, getattr(self, name), least=0)
        for name in ("fraction", "stragglers"):
            if isinstance(getattr(self, name), bool | str):
                raise ValueError(f"{name} must be a number, got {getattr(self, name)!r}")
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction C must be in (0, 1], got {self.fraction}")
        if not 0 <= self.stragglers <= 1:
            raise ValueError(f"stragglers is a share of the clients, in [0, 1]; got "
                             f"{self.stragglers}")


def _as_tuple(round_) -> tuple:
    return round_ if isinstance(round_, tuple) else (round_,)


def sample_clients(clients: int, fraction: float, seed: int, round_) -> list[int]:
    """The max(1, round(C K)) clients of one round (``round_``: a number, or a tuple naming a
    round inside a round), the same on every rank for the same seed."""
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) \
            or not 0 < fraction <= 1:
        raise ValueError(f"fraction C must be a number in (0, 1], got {fraction!r}")
    m = max(1, round(fraction * check_whole("clients", clients)))
    return sorted(np.random.default_rng([seed, *_as_tuple(round_)])
                  .choice(clients, m, replace=False).tolist())


def fedavg_round(w, clients: Clients, chosen, local: LocalTraining, *, seed, round_,
                 budgets=None, control: ControlVariates | None = None, model=DIGITS_MLP,
                 group=None, batched: bool = True):
    """One round of FedAvg: each client k in ``chosen`` trains from w on its rows (at most
    ``budgets[k]`` steps when given); returns the average of their models weighted by their
    number of rows -- FedAvg's new global model -- or None if nobody reported (every chosen
    client dropped). On ranks, this rank trains the clients k % p == its rank, one after the
    other, and the weighted sums are all-reduced; in one process (``batched``) all clients train
    at once (``local_training.train_clients``: the same models, faster)."""
    rank, p = rank_and_size(group)
    dev = device(group)
    w = w.to(dev)
    total = torch.zeros(len(w) + 1, dtype=w.dtype, device=dev)  # sum n_k w_k, and n_k
    mine = [k for k in chosen if k % p == rank]  # the other clients are other ranks'
    seeds = [[seed, *_as_tuple(round_), k] for k in mine]
    if batched and p == 1 and hasattr(model, "loss_and_gradient_batched"):
        V, steps = train_clients(
            w, [clients.data(k, dev) for k in mine], local, seeds,
            budgets=None if budgets is None else [budgets.get(k) for k in mine],
            corrections=None if control is None else [control.correction(k) for k in mine],
            model=model)
        trained = zip(mine, V, steps, strict=True)
    else:  # one client after the other; a generator, so each reads its correction in turn
        trained = ((k, *client_update(
            w, *clients.data(k, dev), local, s, model=model,
            correction=None if control is None else control.correction(k),
            max_steps=None if budgets is None else budgets.get(k)))
            for k, s in zip(mine, seeds, strict=True))
    for k, v, steps in trained:
        if control is not None:
            control.update(k, w, v, steps, local.lr)
        total[:-1] += clients.rows(k) * v
        total[-1] += clients.rows(k)
    total = sum_over_ranks(total, group)
    if control is not None:
        control.end_round(group)
    return total[:-1] / total[-1] if total[-1] > 0 else None


def straggler_budgets(chosen, clients: Clients, local: LocalTraining, share: float, seed: int,
                      round_):
    """A random ``share`` of the chosen clients are stragglers: each finishes a random number of
    its local steps (at least one). Returns {client: steps it manages}."""
    slow = np.random.default_rng([seed, round_, 1]).choice(chosen, round(share * len(chosen)),
                                                    replace=False).tolist()
    return {k: int(np.random.default_rng([seed, round_, k]).integers(
        1, local.steps(clients.rows(k)) + 1)) for k in slow}


def federated(split, parts, local: LocalTraining, federation: Federation, *,
              model=DIGITS_MLP, group=None, batched: bool = True) -> dict:
    """Federated training of ``model`` on ``split``: client k holds the training rows
    ``parts[k]`` and trains as ``local`` says; the server runs the rounds as ``federation``
    says. ``batched``: see :func:`fedavg_round`.

    Returns the test ``accuracy`` after every round (index 0: before training), ``best`` (the
    best-so-far curve), ``rounds_to_target``, ``bytes_per_round``, ``seconds`` per round and the
    final model ``params``.
    """
    f, dev = federation, device(group)
    clients = Clients.of(split, parts)
    x_test, y_test = split.x_test.to(dev), split.y_test.to(dev)
    w, server, server_state = model.init(f.seed).to(dev), f.server or fedavg_server(), {}
    if not len(parts):
        raise ValueError("parts is empty: a federation needs at least one client")
    if f.scaffold and not local.lr > 0:
        raise ValueError("SCAFFOLD's control variates divide by the local steps x lr: lr must be "
                         "positive")
    control = ControlVariates(len(w), len(parts), dev) if f.scaffold else None
    log = dict(accuracy=[model.accuracy(w, x_test, y_test)], bytes_per_round=[], seconds=[])
    for r in range(f.rounds):
        start = time.perf_counter()
        sampled = sample_clients(len(clients), f.fraction, f.seed, r)
        budgets = straggler_budgets(sampled, clients, local, f.stragglers, f.seed, r)
        chosen = sampled
        if not f.keep_partial:  # dropped: the server does not wait for them
            chosen, budgets = [k for k in sampled if k not in budgets], None
        average = fedavg_round(w, clients, chosen, local, seed=f.seed, round_=r,
                               budgets=budgets, control=control, model=model, group=group,
                               batched=batched)
        if average is not None:  # else every chosen client dropped: keep w
            w = server(w, average - w, server_state)
        log["accuracy"].append(model.accuracy(w, x_test, y_test))
        log["bytes_per_round"].append(federated_bytes_per_round(  # w went to every sampled one
            len(sampled), len(w), messages=2 if f.scaffold else 1))
        log["seconds"].append(time.perf_counter() - start)
        if f.target is not None and log["accuracy"][-1] >= f.target:
            break
    log["best"] = np.maximum.accumulate(log["accuracy"]).tolist()
    log["rounds_to_target"] = (rounds_to_target(log["accuracy"], f.target)
                               if f.target is not None else None)
    return log | dict(params=w)


def rounds_to_target(accuracy_per_round, target: float) -> int | None:
    """The first round whose best-so-far accuracy reaches ``target`` (None if none does)."""
    best = np.maximum.accumulate(np.asarray(accuracy_per_round))
    hits = np.flatnonzero(best >= target)
    return int(hits[0]) if len(hits) else None


def fedsgd_step(split, parts, w, lr: float, model=DIGITS_MLP) -> torch.Tensor:
    """One FedSGD round with every client: w - lr sum_k (n_k/n) grad F_k(w)."""
    if not len(parts) or any(len(p) == 0 for p in parts):
        raise ValueError("parts must hold at least one client, each with rows")
    x, y, n = split.x_train.double(), split.y_train, sum(len(p) for p in parts)
    return w - lr * sum(len(p) / n * model.loss_and_gradient(w, x[p], y[p])[1] for p in parts)


def hierarchical(split, parts, edges, local: LocalTraining, *, cloud_rounds: int,
                 edge_rounds: int, fraction: float = 0.5, seed: int = 0,
                 model=DIGITS_MLP, batched: bool = True) -> dict:
    """Hierarchical FedAvg (the article's clients -> edge aggregators -> cloud), in one process.

    ``edges`` lists each edge's clients. Each cloud round, every edge starts from the cloud
    model and runs ``edge_rounds`` FedAvg rounds with its own clients (a fraction of them per
    round); the cloud then averages the edge models, weighted by their data. Returns the test
    ``accuracy`` after every cloud round and the bytes that crossed the ``edge_to_cloud`` and
    the ``client_to_edge`` links in all."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction C must be in (0, 1], got {fraction}")
    check_whole("cloud_rounds", cloud_rounds, 0), check_whole("edge_rounds", edge_rounds, 0)
    edges = [list(m) for m in edges]  # lists, numpy's array_split parts too
    if not edges or any(not m or not all(k == int(k) and 0 <= k < len(parts) for k in m)
                        for m in edges):
        raise ValueError(f"every edge lists one or more of the clients 0 to {len(parts) - 1}, "
                         f"got edges={edges!r}")
    listed = Counter(int(k) for m in edges for k in m)
    if twice := sorted(k for k, n in listed.items() if n > 1):
        raise ValueError(f"client(s) {twice} appear more than once in edges={edges!r}: a client "
                         f"reports to one edge")
    clients, w, d = Clients.of(split, parts), model.init(seed), model.num_parameters
    log = dict(accuracy=[model.accuracy(w, split.x_test, split.y_test)], edge_to_cloud=0,
               client_to_edge=0)
    for r in range(cloud_rounds):
        edge_models, edge_sizes = [], []
        for e, members in enumerate(edges):
            w_e = w
            for q in range(edge_rounds):
                chosen = [members[i] for i in  # cloud round r, edge e, its round q
                          sample_clients(len(members), fraction, seed, (r, e, q))]
                w_e = fedavg_round(w_e, clients, chosen, local, seed=seed, round_=(r, e, q),
                                   model=model, batched=batched)
                log["client_to_edge"] += federated_bytes_per_round(len(chosen), d)
            edge_models.append(w_e)
            edge_sizes.append(sum(len(parts[k]) for k in members))
        total = sum(edge_sizes)
        w = sum(s / total * m for s, m in zip(edge_sizes, edge_models, strict=True))
        log["edge_to_cloud"] += federated_bytes_per_round(len(edges), d)
        log["accuracy"].append(model.accuracy(w, split.x_test, split.y_test))
    return log


def lesson_setup(clients: int = 50):
    """Lesson 8's check, as a command (:func:`main`): the digits and lesson 8's non-IID
    partition, two label shards per client."""
    from course_lib.data import load_digits
    from course_lib.partitions import label_shards

    digits = load_digits()
    return digits, label_shards(digits.y_train.numpy(), clients)


def fedavg_on_ranks(rounds: int = 5, fraction: float = 0.2, epochs: int = 5, batch: int = 10,
                    lr: float = 0.1, clients: int = 50, seed: int = 0, group=None) -> dict:
    """Run on every rank of ``group``: :func:`federated` with the clients shared out over the
    ranks. Returns the final model ``params`` and the test ``accuracy`` per round."""
    digits, parts = lesson_setup(clients)
    log = federated(digits, parts, LocalTraining(epochs, batch, lr),
                    Federation(rounds, fraction, seed=seed), group=group)
    return dict(params=log["params"], accuracy=log["accuracy"])


def main(argv=None):
    args, results = run_command(
        fedavg_on_ranks, "Lesson 8: FedAvg with the clients on ranks, against one process",
        (("--rounds", int, 5), ("--fraction", float, 0.2, {"above": True, "most": 1}),
         ("--epochs", int, 5), ("--batch", int, 10), ("--lr", float, 0.1), ("--clients", int, 50),
         ("--seed", int, 0)), argv)
    if results is not None:  # the launcher, or rank 0 under torchrun
        digits, parts = lesson_setup(args.clients)
        one = federated(digits, parts, LocalTraining(args.epochs, args.batch, args.lr),
                        Federation(args.rounds, args.fraction, seed=args.seed))
        gap = max((r["params"] - one["params"]).abs().max().item() for r in results)
        print(f"FedAvg, K = {args.clients} clients (label shards), C = {args.fraction:g}, E = "
              f"{args.epochs}, B = {args.batch}, lr {args.lr:g}, clients on {len(results)} ranks")
        print(f"after {args.rounds} rounds: max |{len(results)} processes - 1 process| = "
              f"{gap:.1e}; test accuracy {results[0]['accuracy'][-1]:.1%} (one process "
              f"{one['accuracy'][-1]:.1%})")
    return results


if __name__ == "__main__":
    run_main(main)
