"""Checks for lesson 8's exercises: FedAvg's aggregation and non-IID partitions.

Slides part 4; McMahan et al. 2017.
"""

from __future__ import annotations

import torch

from course_lib.exercises.common import ExerciseFailed


def check_weighted_average(aggregate) -> str:
    """Check ``aggregate(models, sizes)``: the average of the client models weighted by their
    number of rows, sum_k (n_k / n) w_k."""
    g = torch.Generator().manual_seed(0)
    models = [torch.randn(5, generator=g, dtype=torch.float64) for _ in range(3)]
    sizes = [10, 300, 40]
    want = sum(n / 350 * w for n, w in zip(sizes, models, strict=True))
    got = aggregate([m.clone() for m in models], list(sizes))
    if got is None:
        raise ExerciseFailed("aggregate returned None: return the new global model")
    got = torch.as_tensor(got, dtype=torch.float64)
    if got.shape != want.shape:
        raise ExerciseFailed(f"the average has shape {tuple(got.shape)}, a model has "
                             f"{tuple(want.shape)}")
    if not torch.allclose(got, want, atol=1e-12):
        plain = torch.stack(models).mean(dim=0)
        hint = (" That is the plain mean: weight each model by n_k / n." if
                torch.allclose(got, plain, atol=1e-12) else
                " Multiply each model by its share n_k / n of the rows and add them up.")
        raise ExerciseFailed(f"off by {(got - want).abs().max().item():.3g}.{hint}")
    return "correct: client models averaged with weights n_k / n"


def check_label_shards(partition, labels, clients: int = 20) -> str:
    """Check ``partition(labels, clients, seed)`` for McMahan et al.'s pathological split:
    disjoint, complete, near-equal sizes, at most two labels per client, seeded."""
    import numpy as np

    labels = np.asarray(labels)
    parts = partition(labels, clients, 0)
    if parts is None or len(parts) != clients:
        raise ExerciseFailed(f"return a list with one array of row indices per client "
                             f"({clients})")
    rows = np.concatenate([np.asarray(p) for p in parts])
    if len(rows) != len(set(rows.tolist())):
        raise ExerciseFailed("some row is given to two clients: deal every shard once")
    if len(rows) != len(labels):
        raise ExerciseFailed(f"{len(labels) - len(rows)} rows belong to no client: cut all of "
                             f"the sorted rows into shards")
    kinds = [len(set(labels[np.asarray(p)].tolist())) for p in parts]
    if max(kinds) > 2:
        raise ExerciseFailed(f"a client holds {max(kinds)} labels: cut each class into its "
                             f"own shards so that no shard straddles two labels")
    sizes = [len(p) for p in parts]
    if max(sizes) > 2 * min(sizes):
        raise ExerciseFailed(f"client sizes range from {min(sizes)} to {max(sizes)}: give "
                             f"every client the same number of shards")
    again = partition(labels, clients, 0)
    if any(not np.array_equal(np.sort(a), np.sort(b)) for a, b in zip(parts, again,
                                                                        strict=True)):
        raise ExerciseFailed("the same seed gave a different partition: draw every random "
                             "choice from a generator seeded with seed")
    return (f"correct: {clients} disjoint clients cover all {len(labels)} rows, at most two "
            f"labels each (mean {np.mean(kinds):.1f})")
