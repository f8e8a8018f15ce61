"""Checks for lesson 4's exercises: gradient averaging when the ranks' batches differ in size,
and what the linear scaling rule was worth in this run.

Slides "Parallel computing for machine learning", part 3 (the mirrored strategy: all-reduce the
gradients); Goyal et al. 2017 (the linear scaling rule). Each check is a probe (runs in the
student's kernel, returns plain data) and a judge (decides from the data; the grader runs it
outside the kernel): see :mod:`course_lib.exercises.common`. The averaging's judge draws its cases
itself and takes only the ranks' parameters from the data (:mod:`course_lib.exercises.cases`).
"""

from __future__ import annotations

import numpy as np
import torch

from course_lib.exercises.cases import merged
from course_lib.exercises.common import (
    ExerciseFailed,
    HiddenTestFailed,
    checked,
    hidden_seed,
    launch_checked,
)

# -- exercise 1: average the gradients, weighted by each rank's number of samples --------------


def _model(dims, seed):
    """The small classifier both halves use; its weights come from a generator of its own (the
    judge must not touch the global random state of the process it runs in)."""
    d_in, hidden, classes = dims
    model = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.Tanh(),
                                torch.nn.Linear(hidden, classes)).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=g, dtype=torch.float64) - 0.5)
    return model


def _sgd_step(model, lr):
    """Plain SGD by hand: a worker that creates a torch.optim optimizer imports torch._dynamo
    first, seconds of a core that this short check need not pay on every rank."""
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad


def _case(seed, sizes, dims=(6, 8, 3)):
    """Data and the per-step, per-rank sample indices: ``sizes[t][r]`` samples for rank r at
    step t, disjoint within a step (one global batch dealt out unevenly)."""
    g = torch.Generator().manual_seed(seed)
    n = max(sum(step) for step in sizes)
    x = torch.randn(n, dims[0], generator=g, dtype=torch.float64)
    y = torch.randint(0, dims[2], (n,), generator=g)
    steps = []
    for step in sizes:
        perm = torch.randperm(n, generator=g).tolist()
        cuts = np.cumsum([0, *step]).tolist()
        steps.append([perm[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)])
    return dict(x=x, y=y, dims=list(dims), seed=seed, steps=steps, lr=0.5)


def cases_for(seed):
    """Visible: rank 0 gets 3 samples a step, rank 1 gets 9 (the plain mean weighs rank 0's
    samples three times too much). A graded run adds sizes drawn at random for that run."""
    cases = {"visible": _case(4, [[3, 9], [3, 9], [3, 9]])}
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        sizes = torch.randint(1, 13, (4, 2), generator=g).tolist()
        cases["hidden"] = _case(seed % 10_000, sizes, dims=(5, 7, 4))
    return cases


def _train_on_ranks(average, cases):
    """On every rank: SGD steps on this rank's samples (the mean loss over them), with the
    student's ``average(model, n_local)`` between backward and step. Final parameters."""
    import torch.distributed as dist

    rank, out = dist.get_rank(), {}
    for name, case in cases.items():
        model = _model(case["dims"], case["seed"])
        for step in case["steps"]:
            mine = torch.tensor(step[rank])
            model.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(case["x"][mine]), case["y"][mine])
            loss.backward()
            average(model, len(mine))
            _sgd_step(model, case["lr"])
        out[name] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return out


def probe_weighted_average(average) -> dict:
    cases = cases_for(hidden_seed())
    ranks = launch_checked(_train_on_ranks, 2, (average, cases), timeout=60,
                           hint="does every rank make the same collective calls, in the same "
                                "order?")
    return {name: dict(case, ranks=[r[name] for r in ranks]) for name, case in cases.items()}


def _one_process(case, weighting: str) -> torch.Tensor:
    """Single-process SGD on the same steps. "samples": the mean loss over the union of the
    ranks' samples (the right answer); "equal": the mean of the ranks' mean losses (the plain
    average); "sum": the sum of n_r times each rank's mean loss (no division)."""
    model = _model(case["dims"], case["seed"])
    x, y = case["x"], case["y"]
    for step in case["steps"]:
        model.zero_grad()
        if weighting == "samples":
            idx = torch.tensor([i for part in step for i in part])
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        else:
            parts = [torch.nn.functional.cross_entropy(model(x[torch.tensor(part)]),
                                                       y[torch.tensor(part)]) for part in step]
            loss = (sum(parts) / len(parts) if weighting == "equal" else
                    sum(len(part) * p for part, p in zip(step, parts, strict=True)))
        loss.backward()
        _sgd_step(model, case["lr"])
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _close(a, b) -> bool:
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=0, atol=1e-8))


def _judge_case(case) -> str | None:
    """What is wrong with one case's per-rank parameters, or None."""
    right = _one_process(case, "samples")
    ranks = case["ranks"]
    if not isinstance(ranks, list) or len(ranks) != 2:
        return "expected the parameters of 2 ranks"
    if all(_close(r, right) for r in ranks):
        return None
    sizes = [len(part) for part in case["steps"][0]]
    if not all(_close(r, ranks[0]) for r in ranks):
        return ("the ranks ended with different parameters: after your function every rank must "
                "hold the same gradient")
    if _close(ranks[0], _one_process(case, "equal")):
        return (f"you took the plain mean of the ranks' gradients, but rank 0 averaged "
                f"{sizes[0]} samples and rank 1 {sizes[1]}: weight each rank's gradient by its "
                f"number of samples and divide by the total")
    if _close(ranks[0], _one_process(case, "sum")):
        return (f"the weighted sum is right but not divided by the total number of samples "
                f"({sum(sizes)} at the first step)")
    worst = (torch.as_tensor(ranks[0]).double() - right).abs().max().item()
    return (f"after {len(case['steps'])} steps rank 0's parameters differ from one process on "
            f"the whole global batch by up to {worst:.3g}")


def judge_weighted_average(data) -> str:
    data = merged(cases_for(hidden_seed()), data, ("ranks",))  # the cases drawn here, not read
    wrong = _judge_case(data["visible"])
    if wrong:
        raise ExerciseFailed(wrong)
    if "hidden" in data and _judge_case(data["hidden"]):
        raise HiddenTestFailed("a hidden case failed")
    sizes = [len(part) for part in data["visible"]["steps"][0]]
    return (f"correct: with {sizes[0]} and {sizes[1]} samples per rank, both ranks take the "
            f"steps one process takes on the whole global batch")


check_weighted_average = checked("lesson04.weighted_average", probe_weighted_average,
                                 judge_weighted_average)
check_weighted_average.__doc__ = """Check ``average(model, n_local, group=None)`` (called with no
group: all ranks): called on every rank after ``loss.backward()`` on this rank's ``n_local`` samples
(the mean loss over them), it leaves in every ``.grad`` the gradient of the mean loss over all
ranks' samples. Trains on 2 ranks with unequal batches and compares with one process on the global
batch."""

# -- exercise 2: what each of the scaled large batch's epochs was worth ------------------------


def worth(base, scaled) -> list:
    """For each epoch e of ``scaled`` (losses after epochs 1..n): the epoch E, a real number, at
    which ``base`` (its points joined by straight lines) first comes down to ``scaled[e - 1]``;
    1.0 if ``base`` is there after epoch 1; None if it never gets there. The student edition of
    the library leaves this out: it is the exercise's answer."""
    ### BEGIN SOLUTION
    out = []
    for target in scaled:
        k = next((k for k, loss in enumerate(base) if loss <= target), None)
        if k is None or k == 0:
            out.append(None if k is None else 1.0)
        else:  # between epochs k and k + 1: where the line from base[k - 1] to base[k] is target
            out.append(k + (base[k - 1] - target) / (base[k - 1] - base[k]))
    return out
    ### END SOLUTION


def _what_is_wrong(base, scaled, answers) -> str | None:
    """What is wrong with ``answers`` for these curves, or None; from what E means (the line
    through the base points is at the target at E, and no point before E is at or below it),
    so the student edition holds it too."""
    n = len(base)
    if not isinstance(answers, list) or len(answers) != len(scaled):
        return f"return a list of {len(scaled)} epochs (or None), one for each scaled epoch"
    for e, (target, got) in enumerate(zip(scaled, answers, strict=True), start=1):
        reached = [k + 1 for k, loss in enumerate(base) if loss <= target]
        where = f"scaled epoch {e} (loss {target:.4g})"
        if got is None:
            if reached:
                return f"{where}: the base run does get that low, after epoch {reached[0]}"
            continue
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not 1 <= got <= n:
            return f"{where}: give an epoch from 1 to {n} (or None), not {got!r}"
        if not reached:
            return f"{where}: the base run never gets that low: None"
        before = [k for k in reached if k < got - 1e-9]
        if before:
            return f"{where}: the base run was already there after epoch {before[0]}"
        line = float(np.interp(got, np.arange(1, n + 1), base))
        if got > 1 and not abs(line - target) <= 1e-9 * max(1.0, abs(target)):
            hint = " (interpolate between the two epochs)" if got == int(got) else ""
            return (f"{where}: at epoch {got:.4g} the base curve is at {line:.4g}, not at the "
                    f"target{hint}")
        if got == 1 and base[0] > target:
            return f"{where}: after epoch 1 the base run is still above it"
    return None


def _curve(g, n=10):
    """A drawn loss curve: falling, with bumps, sometimes flat at the end."""
    steps = torch.rand(n, generator=g, dtype=torch.float64) * 0.4 - 0.05
    return (2.5 - torch.cumsum(steps, 0)).clamp(min=0.05).tolist()


def _synthetic(seed) -> dict:
    """Curves of ten epochs: a visible pair with each kind of answer (1.0, between epochs,
    None), and in a graded run three drawn pairs."""
    cases = {"visible": [([2.0, 1.5, 1.0, 0.9, 0.8, 0.75, 0.7, 0.7, 0.65, 0.6],
                          [2.5, 2.0, 1.2, 0.95, 0.72, 0.66, 0.62, 0.6, 0.58, 0.55])]}
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        cases["hidden"] = [(_curve(g), _curve(g)) for _ in range(3)]
    return cases


def _mean_curve(seeded, marker) -> list:
    names = [name for name in seeded if marker in name]
    if len(names) != 1:
        raise ExerciseFailed(f"pass section 5's `seeded` (no single run named {marker!r} in it)")
    return np.mean([list(map(float, run["loss"])) for run in seeded[names[0]]], axis=0).tolist()


def _answers(fn, base, scaled):
    got = fn(list(base), list(scaled))
    if isinstance(got, (list, tuple, np.ndarray)):
        return [None if a is None else float(a) if isinstance(a, (int, float, np.number))
                and not isinstance(a, bool) else repr(a) for a in got]
    return repr(got)


def _probe_epochs_worth(fn, seeded) -> dict:
    """``fn``: the student's ``epochs_worth(base, scaled)``; ``seeded``: section 5's runs."""
    base, scaled = _mean_curve(seeded, "(base)"), _mean_curve(seeded, "(scaled x8)")
    data = {name: [{"answers": _answers(fn, b, s)} for b, s in pairs]
            for name, pairs in _synthetic(hidden_seed()).items()}
    return {**data, "run": {"base": base, "scaled": scaled,
                            "answers": _answers(fn, base, scaled)}}


MAX_EPOCHS = 1000  # the lesson's curves hold a few dozen: far longer ones would take long to judge


def _judge_epochs_worth(data) -> str:
    drawn = _synthetic(hidden_seed())
    run = data.get("run") if isinstance(data, dict) else None
    if not isinstance(run, dict) or not {"base", "scaled", "answers"} <= set(run):
        raise ExerciseFailed("the check's data lacks the run's curves: run the check cell as it is")
    if any(not isinstance(run[k], list) or len(run[k]) > MAX_EPOCHS for k in ("base", "scaled")):
        raise ExerciseFailed(f"your run's curves must be lists of at most {MAX_EPOCHS} epochs, as "
                             f"the lesson's runs make: run its cells as they are")
    cases = merged({k: [{} for _ in v] for k, v in drawn.items()},
                   {k: v for k, v in data.items() if k != "run"}, ("answers",))
    for (b, s), case in zip(drawn["visible"], cases["visible"], strict=True):
        if wrong := _what_is_wrong(b, s, case["answers"]):
            raise ExerciseFailed(f"the small example: {wrong}")
    if wrong := _what_is_wrong(run["base"], run["scaled"], run["answers"]):
        raise ExerciseFailed(f"your run's curves: {wrong}")
    for (b, s), case in zip(drawn.get("hidden", []), cases.get("hidden", []), strict=True):
        if _what_is_wrong(b, s, case["answers"]):
            raise HiddenTestFailed("a hidden case failed")
    last = run["answers"][-1]
    said = "never" if last is None else f"{last:.2f}"
    return (f"correct: every scaled epoch's worth in base epochs (the tenth: {said}), on your "
            f"run's curves and the small example")


check_epochs_worth = checked("lesson04.epochs_worth", _probe_epochs_worth, _judge_epochs_worth)
check_epochs_worth.__doc__ = """Check ``epochs_worth(base, scaled)``: for each scaled epoch, the
(fractional) base epoch at which the base curve, read as straight lines, first reaches the scaled
run's loss; 1.0 if already after epoch 1; None if never: ``check_epochs_worth(epochs_worth,
seeded)``."""
