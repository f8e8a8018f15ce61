"""Checks that compare what each rank of a launch ended with, and a gradient with the right one.

Lecture: all of them; an exercise that launches workers checks what each rank ended with (lesson
1's gradients, lesson 3's collectives). :mod:`course_lib.exercises.common` imports both.
"""

from __future__ import annotations

import torch

from course_lib.exercises.common import ExerciseFailed


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        a, b = torch.as_tensor(a), torch.as_tensor(b)
        return a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=1e-6)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def check_rank_results(results, expected, what: str = "the result", *,
                       per_rank: bool = False) -> str:
    """Compare what each rank returned with what it should have returned.

    ``expected`` is the value every rank should hold, or with ``per_rank=True`` a list with one
    value per rank. Raises :class:`ExerciseFailed` naming each rank that is wrong; returns a
    short confirmation.
    """
    if not isinstance(results, (list, tuple)):
        raise ExerciseFailed(f"expected the list launch() returns (one entry per rank), got "
                             f"{type(results).__name__}")
    wanted = list(expected) if per_rank else [expected] * len(results)
    if len(wanted) != len(results):
        raise ExerciseFailed(f"{len(results)} ranks returned results, but {len(wanted)} were "
                             f"expected: did you launch with the right world_size?")
    wrong = [f"rank {r} ended with {got!r} but {what} is {want!r}"
             for r, (got, want) in enumerate(zip(results, wanted, strict=True))
             if not _same(got, want)]
    if wrong:
        raise ExerciseFailed("; ".join(wrong))
    return f"correct: all {len(results)} ranks hold {what}"


def check_gradient(name: str, got, expected, *, tol: float = 1e-8, case: str = "") -> str:
    """Compare a student's gradient with the right one; say how it is wrong.

    Names a missing return, a wrong shape (with the shape it should have), or the largest
    difference and where it is. ``case`` describes the input (e.g. "batch 1, stride 2").
    """
    where = f" for {case}" if case else ""
    if got is None:
        raise ExerciseFailed(f"{name} is None{where}: did the function forget to return it?")
    got = torch.as_tensor(got)
    if got.shape != expected.shape:
        raise ExerciseFailed(f"{name} has shape {tuple(got.shape)}{where} but must have the "
                             f"shape of what it differentiates, {tuple(expected.shape)}")
    diff = torch.nan_to_num((got.double() - expected.double()).abs(), nan=float("inf"))
    worst = diff.max().item() if diff.numel() else 0.0
    if worst > tol:
        flat = int(diff.argmax())
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
        raise ExerciseFailed(
            f"{name} is wrong{where}: largest difference {worst:.3g} at index {index} "
            f"(yours {got.reshape(-1)[flat].item():.6g}, right "
            f"{expected.reshape(-1)[flat].item():.6g})")
    return f"{name}: correct{where} (largest difference {worst:.1e})"
