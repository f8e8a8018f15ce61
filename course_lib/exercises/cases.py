"""A judge decides from the cases it draws itself, and takes only the student's outputs from the
data: the data comes from the student's kernel, where code can rewrite it (issue 31).

Lecture: none (the homework machinery). A check's probe draws its cases -- the visible ones
fixed, the hidden ones from :func:`~course_lib.exercises.common.hidden_seed` -- runs the student's
code on each and returns, per case, the inputs and the outputs. Code in the kernel may change that
data, or draw the hidden cases from another seed, so that a wrong answer looks right for the
inputs the data shows. So the judge draws the same cases again, outside the kernel, and
:func:`merged` pairs each with the outputs the data holds for it; data that lacks one of them, or
holds a case the judge did not draw, is refused (:class:`.HiddenTestFailed` where hidden cases
are concerned: the grader reports only that), never passed.
"""

from __future__ import annotations

from course_lib.exercises.common import ExerciseFailed, HiddenTestFailed, check_gradient


def _refuse(hidden: bool, what: str):
    if hidden:
        raise HiddenTestFailed("a hidden case failed")
    raise ExerciseFailed(f"the check's data {what}: run the check cell as it is")


def _listed(group) -> list | None:
    """A group's cases as a list: one case (a dict) or a list of them; None for anything else."""
    return [group] if isinstance(group, dict) else group if isinstance(group, list) else None


def _hidden(name: str, cases) -> bool:
    """Whether a group holds hidden cases: the group "hidden", or a case (or the "case" of an
    item) marked ``hidden``."""
    return name == "hidden" or any(
        isinstance(c, dict) and (c.get("hidden") or (isinstance(c.get("case"), dict)
                                                     and c["case"].get("hidden")))
        for c in cases or [])


def merged(own: dict, data, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    """``own`` -- group name -> one case (a dict) or a list of cases: what the judge drew --
    with each case's outputs ``keys`` (and those of ``optional`` that are there) taken from the
    same place in ``data``, which must hold the same groups and as many cases in each. Nothing
    else of ``data`` is read: a case's inputs are always the judge's own.

    Raises :class:`ExerciseFailed` (:class:`HiddenTestFailed` for a group with hidden cases)
    when ``data`` lacks a group, a case or an output, or holds a group the judge did not draw."""
    if not isinstance(data, dict):
        _refuse(any(_hidden(n, _listed(g)) for n, g in own.items()), "is not the probe's")
    for name in data:
        if name not in own:
            _refuse(name == "hidden", f"holds cases this check does not have ({name!r})")
    out = {}
    # visible groups first: a visible case refused is reported as such
    for name in sorted(own, key=lambda n: _hidden(n, _listed(own[n]))):
        mine = _listed(own[name])
        theirs = [data.get(name)] if isinstance(own[name], dict) else data.get(name)
        hidden = _hidden(name, mine) or (isinstance(theirs, list) and _hidden(name, theirs))
        if not isinstance(theirs, list) or len(theirs) != len(mine):
            _refuse(hidden, f"lacks cases of {name!r}, or holds others")
        cases = []
        for case, item in zip(mine, theirs, strict=True):
            if not isinstance(item, dict) or any(k not in item for k in keys):
                _refuse(hidden, f"lacks an output of a case of {name!r}")
            cases.append({**case, **{k: item[k] for k in (*keys, *optional) if k in item}})
        out[name] = cases[0] if isinstance(own[name], dict) else cases
    return {name: out[name] for name in own}


def digest(answers) -> str:
    """sha256 of ``answers`` as JSON: a module can hold the digest of its visible cases' answers,
    so that the student edition tells right from wrong on them without holding the answers."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(answers).encode()).hexdigest()


def projections(values, k: int = 3) -> list[float]:
    """``k`` sums of ``values`` (any shape) weighted by fixed random numbers: a fingerprint that
    tells a tensor from almost every other, compared with a tolerance (summation order moves its
    last digits), so a module can hold the visible cases' expected results without them."""
    import torch

    flat = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    g = torch.Generator().manual_seed(20260101)
    return [float(flat @ torch.randn(flat.numel(), generator=g, dtype=torch.float64))
            for _ in range(k)]


def gradient_by_autograd(forward, x, upstream):
    """dQ/dx for Q = sum(forward(x) * upstream), by autograd: a gradient judge's reference."""
    leaf = x.detach().clone().requires_grad_(True)
    (forward(leaf) * upstream).sum().backward()
    return leaf.grad


def gradient_mismatch(name, answer, right, case, tol) -> str | None:
    """What :func:`~course_lib.exercises.common.check_gradient` says is wrong with ``answer``
    (shape, largest difference and where), or None if it is within ``tol`` of ``right``."""
    try:
        check_gradient(name, answer, right, tol=tol, case=case)
    except ExerciseFailed as wrong:
        return str(wrong)
    return None
