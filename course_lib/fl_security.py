"""Privacy and robustness in federated learning: leaks, defences, attacks, robust aggregation.

Slides "Parallel computing for machine learning", part 4: direction 2, privacy (gradients leak
training data — for least squares the gradient is a multiple of x itself; defence by adding
noise) and direction 3, robustness (Byzantine generals; data and model poisoning; defences: the
server checks validation accuracy, checks update statistics, or aggregates in a
Byzantine-tolerant way). Methods: Deep Leakage from Gradients (Zhu et al. 2019), DP-FedAvg
(McMahan et al. 2018), coordinate-wise median and trimmed mean (Yin et al. 2018), Krum (Blanchard
et al. 2017); secure aggregation with pairwise masks (Bonawitz et al. 2017, without dropouts).

An aggregator (an aggregation rule) is a function ``aggregate(updates, w, state) -> update``
of the chosen clients' updates (rows w_k - w), the current model and a dict the federation loop
owns for it (DP's noise generator): it replaces FedAvg's weighted average, and its output goes
to the server's step ``server(w, update, state)``, lesson 8's. An :class:`Attack` names the
attackers and their poison. :func:`simulate_federation` is an in-process **simulator** of
lesson 8's FedAvg (the rules need every update at the server, not only their sum); lesson 8
checks the same clients against real processes, and a test checks the simulator against
lesson 8's ``federated``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from course_lib import federated as fl
from course_lib.models import DIGITS_MLP
from course_lib.training import check_whole, is_whole

# -- privacy: what a gradient reveals --------------------------------------------------------------


def least_squares_leak(x: torch.Tensor, y: float, w: torch.Tensor, b: float = 0.0):
    """The gradient of (1/2)(w.x + b - y)^2 for one example is r x (weights) and r (bias), r the
    residual: one over the other gives x back exactly. Returns (grad of w, grad of b, x back)."""
    r = w @ x + b - y
    if r == 0:
        raise ValueError("the residual w.x + b - y is 0: the gradient is zero and leaks nothing")
    grad_w, grad_b = r * x, r
    return grad_w, grad_b, grad_w / grad_b


def shared_gradient(model, x, y) -> list[torch.Tensor]:
    """What a FedSGD client sends for one example: the gradient of every trainable parameter."""
    loss = torch.nn.functional.cross_entropy(model(x.reshape(1, -1)), y.reshape(1))
    return [g.detach() for g in torch.autograd.grad(loss, trainable(model))]


def trainable(model) -> list[torch.Tensor]:
    """The parameters a client trains and shares (a frozen one has no gradient to send)."""
    return [p for p in model.parameters() if p.requires_grad]


def infer_label(gradients) -> int:
    """iDLG: with cross-entropy on one example, only the true class's last-layer bias gradient
    is negative (p_c - 1 < 0)."""
    if gradients[-1].dim() != 1:  # not a bias's gradient
        raise ValueError("infer_label reads the last layer's bias gradient: is that bias frozen?")
    return int(torch.argmin(gradients[-1]))


def deep_leakage(model, gradients, *, steps: int = 50, seed: int = 0) -> torch.Tensor:
    """Reconstruct the input from its shared gradient (Zhu et al. 2019): start from noise and
    move a dummy input until its gradient matches, by L-BFGS on ||grad(dummy) - grad||^2.
    The label comes from :func:`infer_label`; the input's width and dtype from the model's first
    linear layer."""
    first = next((m for m in model.modules() if isinstance(m, torch.nn.Linear)), None)
    if first is None:
        raise ValueError("deep_leakage reads the input's width off the model's first "
                         "torch.nn.Linear, and this model has none")
    label = torch.tensor([infer_label(gradients)])
    g = torch.Generator().manual_seed(seed)
    dummy = torch.randn(1, first.in_features, generator=g, dtype=first.weight.dtype)
    dummy.requires_grad_(True)
    opt = torch.optim.LBFGS([dummy], lr=1.0, max_iter=steps, history_size=50,
                            line_search_fn="strong_wolfe")
    params = trainable(model)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(dummy), label)
        dummy_grads = torch.autograd.grad(loss, params, create_graph=True)
        mismatch = sum(((a - b) ** 2).sum() for a, b in zip(dummy_grads, gradients, strict=True))
        mismatch.backward()
        return mismatch

    opt.step(closure)
    return dummy.detach().reshape(-1)


def check_clip_and_noise(clip: float, noise: float) -> None:
    """A clipping norm is positive and finite (a negative one would flip the update), and a noise
    multiplier is zero or more."""
    if not 0 < clip < float("inf") or not 0 <= noise < float("inf"):
        raise ValueError(f"clip must be positive and finite and noise zero or more, got "
                         f"clip={clip!r}, noise={noise!r}")


def clip_and_noise(update: torch.Tensor, clip: float, noise: float, generator=None):
    """Clip an update to norm ``clip`` and add N(0, (noise clip)^2) to every entry: the
    Gaussian mechanism, on one client's update."""
    check_clip_and_noise(clip, noise)
    norm = update.norm().item()
    clipped = update * min(1.0, clip / norm) if norm > 0 else update
    return clipped + noise * clip * torch.randn(update.shape, generator=generator,
                                                dtype=update.dtype)


# -- secure aggregation --------------------------------------------------------------------------


def pair_mask(i: int, j: int, d: int, seed: int = 0, scale: float = 1e3) -> torch.Tensor:
    """The mask m_ij of the pair of clients i < j: drawn from a generator both of them can seed
    (in a real protocol: from a key they agreed on), so either can reproduce it."""
    if not (all(map(is_whole, (i, j, d, seed))) and 0 <= i < j and d >= 0 and seed >= 0):
        raise ValueError(f"pair_mask(i, j) is the mask of clients 0 <= i < j, d >= 0 long, whole "
                         f"numbers with a seed >= 0, got i={i!r}, j={j!r}, d={d!r}, seed={seed!r}")
    key = np.random.SeedSequence([seed, i, j]).generate_state(1)[0]  # distinct for every pair
    g = torch.Generator().manual_seed(int(key))
    return torch.randn(d, generator=g, dtype=torch.float64) * scale


def pairwise_masks(clients: int, d: int, seed: int = 0, scale: float = 1e3) -> torch.Tensor:
    """One mask per client such that the masks sum to zero: client i adds m_ij (:func:`pair_mask`)
    for every j > i and subtracts m_ji for every j < i. Returns a (clients x d) tensor."""
    masks = torch.zeros(check_whole("clients", clients), check_whole("d", d, 0),
                        dtype=torch.float64)
    for i in range(clients):
        for j in range(i + 1, clients):
            m = pair_mask(i, j, d, seed, scale)
            masks[i] += m
            masks[j] -= m
    return masks


# -- robustness: attacks and aggregation rules ----------------------------------------------------


def check_updates(updates) -> torch.Tensor:
    """``updates``, if it is a (clients x parameters) tensor with a row: a clear error if not."""
    if not (isinstance(updates, torch.Tensor) and updates.dim() == 2 and len(updates)):
        raise ValueError(f"updates must be one row per client, at least one, got {updates!r:.80}")
    return updates


def mean(updates: torch.Tensor, w=None, state=None) -> torch.Tensor:
    """No defence: the plain average of the updates."""
    return check_updates(updates).mean(dim=0)


def coordinate_median(updates: torch.Tensor, w=None, state=None) -> torch.Tensor:
    """Coordinate-wise median of the rows (Yin et al. 2018); a NaN (a broken update) is left out."""
    updates = check_updates(updates)
    return updates.nanmedian(dim=0).values if len(updates) % 2 else updates.nanquantile(0.5, dim=0)


def trimmed_mean(updates: torch.Tensor, w=None, state=None, trim: float = 0.2) -> torch.Tensor:
    """Per coordinate, drop the ``trim`` fraction of largest and of smallest values, average
    the rest (Yin et al. 2018)."""
    if not 0 <= trim < 0.5:
        raise ValueError(f"trim is the share cut from each end: from 0 to under 0.5, got {trim!r}")
    k = int(trim * len(check_updates(updates)))  # under half of them from each end: some are left
    ordered = updates.sort(dim=0).values
    return ordered[k:len(updates) - k].mean(dim=0)


def krum(updates: torch.Tensor, w=None, state=None, byzantine: int = 1) -> torch.Tensor:
    """Krum (Blanchard et al. 2017): the update whose n - f - 2 nearest neighbours are closest
    (sum of squared distances), for at most f = ``byzantine`` Byzantine updates."""
    n = len(check_updates(updates))
    check_whole("byzantine (f)", byzantine, least=0)
    closest = n - byzantine - 2
    if closest < 1:
        raise ValueError(f"Krum needs n - f - 2 >= 1, got n = {n}, f = {byzantine}")
    distances = (torch.cdist(updates, updates) ** 2).nan_to_num(nan=float("inf"))  # NaN: far
    scores = distances.sort(dim=1).values[:, 1:closest + 1].sum(dim=1)  # skip itself
    return updates[int(scores.argmin())]


def norm_check(updates: torch.Tensor, w=None, state=None, factor: float = 2.0) -> torch.Tensor:
    """The server checks update statistics: average only the updates whose norm is at most
    ``factor`` times the median norm (a factor of 1 or more keeps half the finite ones or more)."""
    if not factor >= 1:
        raise ValueError(f"factor must be 1 or more (under 1 it can keep no update), got "
                         f"{factor!r}")
    norms = check_updates(updates).norm(dim=1)
    return updates[norms <= factor * norms.nanmedian()].mean(dim=0)


def validation_check(updates: torch.Tensor, w, state=None, *, validation, margin: float = 0.1,
                     model=DIGITS_MLP) -> torch.Tensor:
    """The server checks validation accuracy: score the model w + update of every update on
    ``validation`` = (x, y), data the server holds; average those at least the median score
    minus ``margin`` (a margin of 0 or more keeps at least half of them)."""
    if not margin >= 0:
        raise ValueError(f"margin must be 0 or more (below 0 it can keep no update), got "
                         f"{margin!r}")
    scores = torch.tensor([model.accuracy(w + u, *validation) for u in check_updates(updates)])
    return updates[scores >= scores.median() - margin].mean(dim=0)


def dp_mean(clip: float, noise: float, seed: int = 0):
    """DP-FedAvg's aggregator (McMahan et al. 2018): clip every update to norm ``clip``, average,
    add N(0, (noise clip / m)^2) per coordinate for m updates. ``noise`` is the noise multiplier
    sigma; turning it into an (epsilon, delta) guarantee needs a privacy accountant, which this
    lesson does not do. The noise generator lives in the run's ``state``: the same seed gives
    the same noise in every run."""
    check_clip_and_noise(clip, noise)

    def aggregate(updates, w=None, state=None):
        state = {} if state is None else state
        generator = state.setdefault("noise", torch.Generator().manual_seed(seed))
        m = len(check_updates(updates))
        clipped = torch.stack([clip_and_noise(u, clip, 0.0) for u in updates])
        return clipped.mean(dim=0) + noise * clip / m * torch.randn(
            updates.shape[1], generator=generator, dtype=updates.dtype)

    return aggregate


def flip_labels(y: torch.Tensor) -> torch.Tensor:
    """Data poisoning (an attack): train honestly on the labels 9 - y."""
    return 9 - y


def boost(update: torch.Tensor, factor: float = 10.0) -> torch.Tensor:
    """Model poisoning: send ``factor`` times the honest update."""
    return factor * update


def sign_flip(update: torch.Tensor, factor: float = 10.0) -> torch.Tensor:
    """Model poisoning: send -``factor`` times the honest update."""
    return -factor * update


@dataclass(frozen=True)
class Attack:
    """Who attacks and how: the clients in ``attackers`` train on ``poison_labels(y)`` (data
    poisoning) and send ``poison_update(update)`` (model poisoning), each when given."""

    attackers: tuple = ()
    poison_labels: Callable | None = None
    poison_update: Callable | None = None

    def labels(self, k, y):
        return self.poison_labels(y) if k in self.attackers and self.poison_labels else y

    def update(self, k, u):
        return self.poison_update(u) if k in self.attackers and self.poison_update else u


def client_updates(w, clients: fl.Clients, chosen, local: fl.LocalTraining, seed: int, round_,
                   attack: Attack = Attack()) -> torch.Tensor:
    """Each chosen client's update w_k - w after its local SGD (lesson 8's, all clients at once:
    ``local_training.train_clients``), as rows, with the ``attack``'s poison applied."""
    data = [(clients.data(k)[0], attack.labels(k, clients.data(k)[1])) for k in chosen]
    models, _ = fl.train_clients(w, data, local, [[seed, round_, k] for k in chosen])
    return torch.stack([attack.update(k, v - w) for k, v in zip(chosen, models, strict=True)])


def simulate_federation(split, parts, local: fl.LocalTraining, federation: fl.Federation, *,
                        aggregator=mean, attack: Attack = Attack()) -> dict:
    """Lesson 8's FedAvg in one process (a simulator: the rules need every update at the
    server, not only their sum), with two changes: the server combines the chosen clients'
    updates with ``aggregator(updates, w, state)`` instead of averaging them, and the
    ``attack``'s clients poison their labels or their update. Clients train as ``local`` says;
    the rounds, sampling, seed and server step (``federation.server``: the same steps as lesson
    8's) are the ``federation``'s. Returns the test ``accuracy`` per round (index 0: before
    training) and ``params``."""
    f = federation
    if f.scaffold or f.stragglers or f.target is not None:
        raise ValueError("the simulator runs plain rounds: SCAFFOLD, stragglers and a target "
                         "are lesson 8's federated()'s")
    clients = fl.Clients.of(split, parts)
    w, rule_state, server_state = DIGITS_MLP.init(f.seed), {}, {}
    server = f.server or fl.fedavg_server()
    accuracy = [DIGITS_MLP.accuracy(w, split.x_test, split.y_test)]
    for r in range(f.rounds):
        chosen = fl.sample_clients(len(clients), f.fraction, f.seed, r)
        updates = client_updates(w, clients, chosen, local, f.seed, r, attack)
        w = server(w, aggregator(updates, w, rule_state), server_state)
        accuracy.append(DIGITS_MLP.accuracy(w, split.x_test, split.y_test))
    return dict(accuracy=accuracy, params=w)


def reconstruction_error(x_hat: torch.Tensor, x: torch.Tensor) -> float:
    if x_hat.shape != x.shape:  # broadcasting would compare every pixel with every other
        raise ValueError(f"x_hat {tuple(x_hat.shape)} and x {tuple(x.shape)}: shapes differ")
    return ((x_hat - x) ** 2).mean().item()  # mean squared error of a reconstruction


def fraction_attackers(parts, share: float, seed: int = 0) -> list[int]:
    """A random ``share`` of the clients, as the attackers."""
    if not 0 <= share <= 1:
        raise ValueError(f"share is a fraction of the clients, from 0 to 1, got {share}")
    return sorted(np.random.default_rng(seed).choice(len(parts), round(share * len(parts)),
                                                     replace=False).tolist())
