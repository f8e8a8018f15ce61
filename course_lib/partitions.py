"""Partitions of a labelled dataset over federated clients: IID and the usual non-IID schemes.

Slides "Parallel computing for machine learning", part 4: in federated learning the data are
not IID and their amounts are severely imbalanced. The schemes are the published ones (see the
course's reference numbers): label shards (McMahan et al. 2017), k classes per client, Dirichlet
in both conventions (per class, as NIID-Bench and Flower; per client, as Hsu et al. 2019), and
quantity skew. Every function returns one tensor of row indices per client; the clients are
disjoint, cover every row, and the same seed gives the same partition.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch


class PartitionError(ValueError):
    """A partition cannot be drawn with these settings; the message says what to change."""


def _rng(seed):
    return np.random.default_rng(seed)


def _as_tensors(parts):
    return [torch.as_tensor(np.sort(np.asarray(p, dtype=np.int64))) for p in parts]


def _check_alpha(alpha):
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or \
            not math.isfinite(alpha) or alpha <= 0:
        raise PartitionError(f"alpha must be a positive, finite number (the Dirichlet "
                             f"concentration: small means skewed, large means even), got "
                             f"{alpha!r}")


def _check_count(name, value, least=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise PartitionError(f"{name} must be a whole number of at least {least}, got {value!r}")


def _check(labels, clients):
    labels = _check_labels(labels)
    if isinstance(clients, bool) or not isinstance(clients, numbers.Integral) or \
            not 1 <= clients <= len(labels):
        raise PartitionError(f"clients must be a whole number between 1 and {len(labels)} (the "
                             f"number of rows), got {clients!r}")
    return labels


def _check_labels(labels):
    """Labels as a 1-D array, one class per row (a float label must be a whole number)."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise PartitionError(f"labels must be one class per row (a 1-D array, not one-hot), got "
                             f"shape {labels.shape}")
    if labels.dtype.kind == "f" and labels.size:
        if not (np.isfinite(labels).all() and (labels == np.round(labels)).all()):
            raise PartitionError("labels must be whole class numbers; they hold NaN, inf or "
                                 "fractions")
        labels = labels.astype(np.int64)
    elif labels.dtype.kind not in "iub" and labels.size:
        raise PartitionError(f"labels must be whole class numbers, got dtype {labels.dtype}")
    return labels


def _no_empty(parts, why):
    if empty := [i for i, p in enumerate(parts) if len(p) == 0]:
        raise PartitionError(f"client {empty[0]} gets no rows ({len(empty)} clients in all): "
                             f"{why}")
    return parts


def iid(labels, clients: int, seed: int = 0) -> list[torch.Tensor]:
    """Shuffle and deal out: every client gets the same label mix, sizes differ by at most 1."""
    labels = _check(labels, clients)
    return _as_tensors(np.array_split(_rng(seed).permutation(len(labels)), clients))


def label_shards(labels, clients: int, shards_per_client: int = 2,
                 seed: int = 0) -> list[torch.Tensor]:
    """McMahan et al.'s pathological non-IID split: sort by label, cut into
    clients x shards_per_client shards, deal each client that many random shards.

    Each class is cut on its own (its share of the shards, by its size), so no shard straddles
    two labels and a client with two shards holds at most two labels."""
    labels = _check(labels, clients)
    _check_count("shards_per_client", shards_per_client)
    rng = _rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    total = clients * shards_per_client
    if total < len(classes):
        raise PartitionError(f"{total} shards cannot cover {len(classes)} classes without mixing "
                             f"labels: use more clients or shards_per_client")
    # shards per class, proportional to its size, at least one each (largest remainders)
    exact = counts / counts.sum() * total
    per_class = np.maximum(1, np.floor(exact).astype(int))
    while per_class.sum() < total:
        per_class[np.argmax(exact - per_class)] += 1
    while per_class.sum() > total:
        per_class[np.argmax(np.where(per_class > 1, per_class - exact, -np.inf))] -= 1
    shards = []
    for c, k in zip(classes, per_class, strict=True):
        rows = rng.permutation(np.flatnonzero(labels == c))
        shards += np.array_split(rows, k)
    order = rng.permutation(len(shards))
    parts = [np.concatenate([shards[s] for s in order[i::clients]]) for i in range(clients)]
    return _as_tensors(_no_empty(parts, f"{total} shards are more than the rows of the small "
                                        f"classes: use fewer clients or shards_per_client"))


def k_classes(labels, clients: int, k: int, seed: int = 0) -> list[torch.Tensor]:
    """Each client holds exactly k classes (classes dealt round-robin so every class has owners);
    each class is split evenly among the clients that hold it."""
    labels = _check(labels, clients)
    _check_count("k", k)
    rng = _rng(seed)
    classes = np.unique(labels)
    if not 1 <= k <= len(classes):
        raise PartitionError(f"k must be between 1 and {len(classes)} classes, got {k}")
    if clients * k < len(classes):
        raise PartitionError(f"{clients} clients with {k} classes each leave some of the "
                             f"{len(classes)} classes without an owner: raise clients or k")
    owners = {c: [] for c in classes}
    start = rng.permutation(len(classes))
    for i in range(clients):
        for j in range(k):
            owners[classes[start[(i * k + j) % len(classes)]]].append(i)
    parts = [[] for _ in range(clients)]
    for c, holders in owners.items():
        rows = rng.permutation(np.flatnonzero(labels == c))
        for holder, piece in zip(holders, np.array_split(rows, len(holders)), strict=True):
            parts[holder].append(piece)
    parts = [np.concatenate(p) for p in parts]
    return _as_tensors(_no_empty(parts, "a class has fewer rows than the clients that hold it: "
                                        "use fewer clients or a smaller k"))


def dirichlet_split(rows, clients: int, alpha: float, rng) -> list:
    """Cut ``rows`` into ``clients`` consecutive pieces, their proportions drawn from Dir(alpha)
    with the generator ``rng`` (one class's rows, in :func:`dirichlet_per_class`)."""
    cuts = (np.cumsum(rng.dirichlet(np.full(clients, alpha))) * len(rows)).astype(int)
    return np.split(rows, cuts[:-1])


def dirichlet_per_class(labels, clients: int, alpha: float, min_size: int = 10,
                        seed: int = 0, retries: int = 100) -> list[torch.Tensor]:
    """Split every class over the clients with proportions drawn from Dir(alpha) (NIID-Bench,
    Flower's DirichletPartitioner). Sizes vary; draws are repeated until every client has at
    least ``min_size`` rows, and after ``retries`` failures a PartitionError says what to change.
    Small alpha: each class lives on few clients."""
    labels = _check(labels, clients)
    _check_alpha(alpha)
    _check_count("min_size", min_size, least=0)
    if min_size * clients > len(labels):
        raise PartitionError(f"{clients} clients x min_size {min_size} exceeds the "
                             f"{len(labels)} rows")
    rng = _rng(seed)
    for _ in range(retries):
        parts = [[] for _ in range(clients)]
        for c in np.unique(labels):
            rows = rng.permutation(np.flatnonzero(labels == c))
            for i, piece in enumerate(dirichlet_split(rows, clients, alpha, rng)):
                parts[i].append(piece)
        parts = [np.concatenate(p) for p in parts]
        if min(len(p) for p in parts) >= min_size:
            return _as_tensors(parts)
    raise PartitionError(f"after {retries} draws some client still had fewer than {min_size} "
                         f"rows (alpha = {alpha}, {clients} clients): raise alpha, lower "
                         f"min_size or use fewer clients")


def dirichlet_per_client(labels, clients: int, alpha: float,
                         seed: int = 0) -> list[torch.Tensor]:
    """Each client's class mix drawn from Dir(alpha p), p the global class distribution (Hsu et
    al. 2019), with fixed sizes (n / clients). Clients draw their rows in turn from what is left;
    when a class runs out its share goes to the classes still available, so the last clients'
    mixes can differ from their draw: a client whose classes have run out goes on with the
    class that has the most rows left, so it stays as concentrated as it can."""
    labels = _check(labels, clients)
    _check_alpha(alpha)
    rng = _rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    pools = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    prior = counts / counts.sum()
    sizes = [len(a) for a in np.array_split(np.arange(len(labels)), clients)]
    parts = []
    for size in sizes:
        mix = np.nan_to_num(rng.dirichlet(alpha * prior))
        rows = []
        while len(rows) < size:
            left = np.array([len(pools[c]) for c in classes], dtype=float)
            if not (mix * (left > 0)).sum() > 0:  # its classes ran out: take the fullest one
                mix = np.eye(len(classes))[np.argmax(left)]
            weights = mix * (left > 0)
            c = classes[rng.choice(len(classes), p=weights / weights.sum())]
            rows.append(pools[c].pop())
        parts.append(rows)
    return _as_tensors(parts)


def quantity_skew(labels, clients: int, alpha: float = 1.0, min_size: int = 1,
                  seed: int = 0) -> list[torch.Tensor]:
    """IID label mixes but sizes drawn from Dir(alpha) (at least ``min_size`` each): some clients
    hold much more data than others."""
    labels = _check(labels, clients)
    _check_alpha(alpha)
    _check_count("min_size", min_size, least=0)
    if min_size * clients > len(labels):
        raise PartitionError(f"{clients} clients x min_size {min_size} exceeds the "
                             f"{len(labels)} rows")
    rng = _rng(seed)
    spare = len(labels) - min_size * clients
    sizes = min_size + np.floor(rng.dirichlet(np.full(clients, alpha)) * spare).astype(int)
    sizes[: len(labels) - sizes.sum()] += 1  # hand out what flooring left over
    return _as_tensors(np.split(rng.permutation(len(labels)), np.cumsum(sizes)[:-1]))


# -- how skewed is a partition? -------------------------------------------------------------------


def label_counts(labels, parts, num_classes: int | None = None) -> np.ndarray:
    """clients x classes matrix of how many rows of each label each client holds (``parts``:
    each client's row indices; ``num_classes``: default the largest label + 1)."""
    labels = _check_labels(labels)
    if num_classes is None:
        num_classes = 1 + int(labels.max()) if labels.size else 0
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) \
            or num_classes < 1 \
            or (labels.size and not 0 <= labels.min() <= labels.max() < num_classes):
        raise PartitionError(f"labels must be classes 0 to num_classes - 1, at least one: got "
                             f"num_classes={num_classes!r}, labels from "
                             f"{labels.min() if labels.size else None} to "
                             f"{labels.max() if labels.size else None}")
    rows = [np.asarray(p) for p in parts]
    if not rows:
        raise PartitionError("parts is empty: give each client's row indices")
    if bad := [i for i, r in enumerate(rows) if r.size and (r.dtype.kind not in "iu" or r.min() < 0
                                                            or r.max() >= len(labels))]:
        raise PartitionError(f"client {bad[0]}'s rows must be whole row numbers 0 to "
                             f"{len(labels) - 1}, got {rows[bad[0]].tolist()[:8]}")
    return np.stack([np.bincount(labels[r.astype(int)], minlength=num_classes) for r in rows])


def earth_movers_distance(counts: np.ndarray) -> np.ndarray:
    """Per client, Zhao et al.'s skew score: sum over classes of |p_client - p_global| (0 for
    the global mix, approaching 2 for a small client whose classes no one else has)."""
    counts = np.asarray(counts, dtype=float)
    if counts.ndim != 2 or not counts.sum() > 0 or not np.isfinite(counts).all() \
            or (counts < 0).any():
        raise PartitionError(f"counts must be a clients x classes matrix of row counts, some "
                             f"rows in all (label_counts gives one), got shape {counts.shape}")
    global_mix = counts.sum(axis=0) / counts.sum()
    mixes = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    return np.abs(mixes - global_mix).sum(axis=1)
