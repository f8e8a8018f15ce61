"""Privacy and robustness in federated learning: leaks, defences, attacks, robust aggregation.

Slides "Parallel computing for machine learning", part 4: direction 2, privacy (gradients leak
training data — for least squares the gradient is a multiple of x itself; defence by adding
noise) and direction 3, robustness (Byzantine generals; data and model poisoning; defences: the
server checks validation accuracy, checks update statistics, or aggregates in a
Byzantine-tolerant way). Methods from the reference numbers: Deep Leakage from Gradients (Zhu et
al. 2019), DP-FedAvg (McMahan et al. 2018), coordinate-wise median and trimmed mean (Yin et al.
2018), Krum (Blanchard et al. 2017); secure aggregation with pairwise masks (Bonawitz et al.
2017, without its dropout handling).

Everything here is an in-process **simulator** of the federation (the aggregation rules need
every update at the server, not only their sum); lesson 8 checks the simulator against real
processes for plain FedAvg.
"""

from __future__ import annotations

import numpy as np
import torch

from course_lib import federated as fl

ATTACKS = ("none", "label flip", "boosted", "sign flip")
AGGREGATORS = ("mean", "median", "trimmed mean", "krum", "norm check", "validation check")


# -- privacy: what a gradient reveals --------------------------------------------------------------


def least_squares_leak(x: torch.Tensor, y: float, w: torch.Tensor, b: float = 0.0):
    """The gradient of (1/2)(w.x + b - y)^2 for one example is r x (weights) and r (bias), with
    r the residual: dividing one by the other gives x back exactly. Returns (gradient of w,
    gradient of b, the reconstruction)."""
    r = w @ x + b - y
    grad_w, grad_b = r * x, r
    return grad_w, grad_b, grad_w / grad_b


def leaky_model(seed: int = 0) -> torch.nn.Sequential:
    """A small digits MLP with sigmoid units, the kind of model Deep Leakage from Gradients
    inverts (its attack needs smooth activations)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Sigmoid(),
                               torch.nn.Linear(32, 10))


def shared_gradient(model, x, y) -> list[torch.Tensor]:
    """What a FedSGD client sends for one example: the gradient of every parameter."""
    loss = torch.nn.functional.cross_entropy(model(x.reshape(1, -1)), y.reshape(1))
    return [g.detach() for g in torch.autograd.grad(loss, list(model.parameters()))]


def infer_label(gradients) -> int:
    """iDLG: with cross-entropy on one example, only the true class's last-layer bias gradient
    is negative (p_c - 1 < 0)."""
    return int(torch.argmin(gradients[-1]))


def deep_leakage(model, gradients, *, steps: int = 50, seed: int = 0) -> torch.Tensor:
    """Reconstruct the input from its shared gradient (Zhu et al. 2019): start from noise and
    move a dummy input until its gradient matches, by L-BFGS on ||grad(dummy) - grad||^2.
    The label comes from :func:`infer_label`."""
    label = torch.tensor([infer_label(gradients)])
    g = torch.Generator().manual_seed(seed)
    dummy = torch.randn(1, 64, generator=g).requires_grad_(True)
    opt = torch.optim.LBFGS([dummy], lr=1.0, max_iter=steps, history_size=50,
                            line_search_fn="strong_wolfe")
    params = list(model.parameters())

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(dummy), label)
        dummy_grads = torch.autograd.grad(loss, params, create_graph=True)
        mismatch = sum(((a - b) ** 2).sum() for a, b in zip(dummy_grads, gradients, strict=True))
        mismatch.backward()
        return mismatch

    opt.step(closure)
    return dummy.detach().reshape(-1)


def clip_and_noise(update: torch.Tensor, clip: float, noise: float, generator=None):
    """Clip an update to norm ``clip`` and add N(0, (noise clip)^2) to every entry: the
    Gaussian mechanism, on one client's update."""
    norm = update.norm().item()
    clipped = update * min(1.0, clip / norm) if norm > 0 else update
    return clipped + noise * clip * torch.randn(update.shape, generator=generator,
                                                dtype=update.dtype)


# -- secure aggregation --------------------------------------------------------------------------


def pairwise_masks(clients: int, d: int, seed: int = 0, scale: float = 1e3) -> torch.Tensor:
    """One mask per client such that the masks sum to zero: client i adds m_ij for every j > i
    and subtracts m_ji for every j < i, m_ij drawn from a generator both i and j can seed
    (in a real protocol: from a key they agreed on). Returns a (clients x d) tensor."""
    masks = torch.zeros(clients, d, dtype=torch.float64)
    for i in range(clients):
        for j in range(i + 1, clients):
            g = torch.Generator().manual_seed(seed * 1_000_003 + i * 1009 + j)
            m = torch.randn(d, generator=g, dtype=torch.float64) * scale
            masks[i] += m
            masks[j] -= m
    return masks


# -- robustness: attacks and aggregation rules ----------------------------------------------------


def coordinate_median(updates: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median of the rows (Yin et al. 2018)."""
    return updates.median(dim=0).values if len(updates) % 2 else updates.quantile(0.5, dim=0)


def trimmed_mean(updates: torch.Tensor, trim: float = 0.2) -> torch.Tensor:
    """Per coordinate, drop the ``trim`` fraction of largest and of smallest values, average
    the rest (Yin et al. 2018)."""
    k = int(trim * len(updates))
    if 2 * k >= len(updates):
        raise ValueError(f"trimming {k} from each end of {len(updates)} updates leaves none")
    ordered = updates.sort(dim=0).values
    return ordered[k:len(updates) - k].mean(dim=0)


def krum(updates: torch.Tensor, byzantine: int) -> torch.Tensor:
    """Krum (Blanchard et al. 2017): the update whose n - f - 2 nearest neighbours are closest
    (sum of squared distances), for at most f Byzantine updates."""
    n = len(updates)
    closest = n - byzantine - 2
    if closest < 1:
        raise ValueError(f"Krum needs n - f - 2 >= 1, got n = {n}, f = {byzantine}")
    distances = torch.cdist(updates, updates) ** 2
    scores = distances.sort(dim=1).values[:, 1:closest + 1].sum(dim=1)  # skip itself
    return updates[int(scores.argmin())]


def norm_check(updates: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
    """The server checks update statistics: average only the updates whose norm is at most
    ``factor`` times the median norm."""
    norms = updates.norm(dim=1)
    keep = norms <= factor * norms.median()
    return updates[keep].mean(dim=0)


def validation_check(updates: torch.Tensor, w: torch.Tensor, validation,
                     margin: float = 0.1) -> torch.Tensor:
    """The server checks validation accuracy: score the model w + update of every update on
    data the server holds, keep those at least the median score minus ``margin``, and average
    them."""
    scores = torch.tensor([fl.accuracy(w + u, *validation) for u in updates])
    return updates[scores >= scores.median() - margin].mean(dim=0)


def attack_update(update: torch.Tensor, attack: str, boost: float = 10.0) -> torch.Tensor:
    """Model poisoning of one honest-looking update: ``boosted`` (x boost) or ``sign flip``
    (-boost x)."""
    if attack == "boosted":
        return boost * update
    if attack == "sign flip":
        return -boost * update
    return update


def _client_updates(w, x, y, parts, chosen, round_, epochs, batch, lr, seed, flipped=()):
    """Each chosen client's update w_k - w after its local SGD; clients in ``flipped`` train on
    labels 9 - y (label-flipping attackers)."""
    updates = []
    for k in chosen:
        rows = parts[k]
        labels = 9 - y[rows] if k in flipped else y[rows]
        v, _ = fl.client_update(w, x[rows], labels, epochs=epochs, batch=batch, lr=lr,
                                seed=[seed, round_, k])
        updates.append(v - w)
    return updates


def robust_federated(split, parts, *, rounds: int, attackers=(), attack: str = "none",
                     aggregator: str = "mean", fraction: float = 0.5, epochs: int = 2,
                     batch: int | None = 10, lr: float = 0.1, validation=None,
                     byzantine: int | None = None, seed: int = 0) -> dict:
    """FedAvg where the clients in ``attackers`` attack and the server aggregates the chosen
    clients' updates (w_k - w) with one of ``AGGREGATORS`` (a simulator, in one process).

    "label flip" attackers train on labels 9 - y (data poisoning); "boosted" and "sign flip"
    ones scale their update (model poisoning). "validation check" keeps the updates whose
    model, alone, scores at least the median accuracy minus 10 points on ``validation`` (a
    held-out (x, y) pair the server owns). Returns the test ``accuracy`` per round.
    """
    if attack not in ATTACKS or aggregator not in AGGREGATORS:
        raise ValueError(f"attack must be one of {ATTACKS} and aggregator one of {AGGREGATORS}")
    if aggregator == "validation check" and validation is None:
        raise ValueError("the validation check needs validation=(x, y), data the server holds")
    x, y = split.x_train.double(), split.y_train
    w = fl.init_model(seed=seed)
    attackers = set(attackers)
    acc = [fl.accuracy(w, split.x_test, split.y_test)]
    for r in range(rounds):
        chosen = fl.sample_clients(len(parts), fraction, seed, r)
        flipped = attackers if attack == "label flip" else set()
        updates = torch.stack([attack_update(u, attack) if k in attackers else u
                               for k, u in zip(chosen, _client_updates(
                                   w, x, y, parts, chosen, r, epochs, batch, lr, seed, flipped),
                                   strict=True)])
        f = byzantine if byzantine is not None else max(1, len(attackers) * len(chosen)
                                                        // len(parts))
        if aggregator == "mean":
            step = updates.mean(dim=0)
        elif aggregator == "median":
            step = coordinate_median(updates)
        elif aggregator == "trimmed mean":
            step = trimmed_mean(updates, 0.2)
        elif aggregator == "krum":
            step = krum(updates, f)
        elif aggregator == "norm check":
            step = norm_check(updates)
        else:
            step = validation_check(updates, w, validation)
        w = w + step
        acc.append(fl.accuracy(w, split.x_test, split.y_test))
    return dict(accuracy=acc, w=w)


def dp_federated(split, parts, *, rounds: int, clip: float, noise: float,
                 fraction: float = 0.5, epochs: int = 2, batch: int | None = 10,
                 lr: float = 0.1, seed: int = 0) -> dict:
    """DP-FedAvg (McMahan et al. 2018), a simulator: every chosen client's update is clipped to
    norm ``clip``; the server averages them and adds N(0, (noise clip / m)^2) per coordinate,
    m the clients of the round. ``noise`` is the noise multiplier sigma; turning it into an
    (epsilon, delta) guarantee needs a privacy accountant, which this lesson does not do."""
    x, y = split.x_train.double(), split.y_train
    w = fl.init_model(seed=seed)
    g = torch.Generator().manual_seed(seed)
    acc = [fl.accuracy(w, split.x_test, split.y_test)]
    for r in range(rounds):
        chosen = fl.sample_clients(len(parts), fraction, seed, r)
        total = torch.zeros_like(w)
        for update in _client_updates(w, x, y, parts, chosen, r, epochs, batch, lr, seed):
            total += clip_and_noise(update, clip, 0.0)
        m = len(chosen)
        w = w + total / m + noise * clip / m * torch.randn(w.shape, generator=g,
                                                           dtype=w.dtype)
        acc.append(fl.accuracy(w, split.x_test, split.y_test))
    return dict(accuracy=acc, w=w)


def reconstruction_error(x_hat: torch.Tensor, x: torch.Tensor) -> float:
    """Mean squared error between a reconstruction and the true input."""
    return ((x_hat - x) ** 2).mean().item()


def fraction_attackers(parts, share: float, seed: int = 0) -> list[int]:
    """A random ``share`` of the clients, as the attackers."""
    return sorted(np.random.default_rng(seed).choice(len(parts), round(share * len(parts)),
                                                     replace=False).tolist())
