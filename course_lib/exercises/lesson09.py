"""Checks for lesson 9's exercises: robust aggregation and secure aggregation.

Slides part 4 (directions 2 and 3).
"""

from __future__ import annotations

import torch

from course_lib.exercises.common import ExerciseFailed


def check_trimmed_mean(trimmed_mean) -> str:
    """Check ``trimmed_mean(updates, trim)`` (rows = clients) on hand-made updates with an
    outlier in every coordinate."""
    from course_lib import fl_security

    updates = torch.tensor([[1.0, 10.0, -3.0], [2.0, 20.0, -2.0], [3.0, 30.0, -1.0],
                            [4.0, 40.0, 0.0], [100.0, -500.0, 900.0]], dtype=torch.float64)
    for trim in (0.2, 0.4):
        got = trimmed_mean(updates.clone(), trim)
        want = fl_security.trimmed_mean(updates, trim=trim)
        if got is None or torch.as_tensor(got).shape != want.shape:
            raise ExerciseFailed(f"return one value per coordinate, shape {tuple(want.shape)}")
        got = torch.as_tensor(got, dtype=torch.float64)
        if not torch.allclose(got, want):
            hint = (" Sort each coordinate (column) on its own: an attacker can be extreme in "
                    "one coordinate and ordinary in another."
                    if torch.allclose(got, updates[1:4].mean(dim=0)) else
                    f" Drop int(trim * n) = {int(trim * len(updates))} values from each end of "
                    f"every column, then average what is left.")
            raise ExerciseFailed(f"with trim = {trim} you got {got.tolist()}, the trimmed mean "
                                 f"is {want.tolist()}.{hint}")
    return "correct: coordinate-wise trimmed mean, outliers in every coordinate removed"


def check_pairwise_masks(pairwise_masks) -> str:
    """Check ``pairwise_masks(clients, d, seed)``: masks that sum to zero, hide each update and
    are reproducible from the seed."""
    masks = pairwise_masks(5, 40, 0)
    if masks is None or tuple(torch.as_tensor(masks).shape) != (5, 40):
        raise ExerciseFailed("return a (clients x d) tensor: one mask per client")
    masks = torch.as_tensor(masks, dtype=torch.float64)
    total = masks.sum(dim=0).abs().max().item()
    if total > 1e-6:
        raise ExerciseFailed(f"the masks do not cancel: their sum is off by {total:.3g}. Client "
                             f"i adds m_ij for j > i and subtracts m_ji for j < i")
    if masks.norm(dim=1).min().item() < 1.0:
        raise ExerciseFailed("some mask is (nearly) zero: it would show that client's update")
    again = torch.as_tensor(pairwise_masks(5, 40, 0), dtype=torch.float64)
    if not torch.equal(masks, again):
        raise ExerciseFailed("the same seed gave other masks: a pair must be able to agree on "
                             "its mask, so draw it from a generator seeded by (seed, i, j)")
    return "correct: the masks cancel in the sum, and each one hides its client's update"
