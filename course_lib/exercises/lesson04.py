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
    check_drawn,
    checked,
    hidden_seed,
    is_whole,
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
check_weighted_average.__doc__ = """Check ``average(model, n_local)``: called on every rank after
``loss.backward()`` on this rank's ``n_local`` samples (the mean loss over them), it leaves in
every ``.grad`` the gradient of the mean loss over all ranks' samples. Trains on 2 ranks with
unequal batches and compares with one process on the global batch."""

# -- exercise 2: how many base epochs the scaled large batch's first epochs are worth ----------


def draw_reference_epoch(rng) -> int:
    """Exercise 2's reference epoch e, 4 to 10: ``common.drawn("lesson04.reference_epoch",
    draw_reference_epoch)`` in the notebook (fresh every run; the grader's run seeds it)."""
    return int(rng.integers(4, 10 + 1))


def _curves(seeded, marker):
    names = [name for name in seeded if marker in name]
    if len(names) != 1:
        raise ExerciseFailed(f"pass section 5's `seeded` (no single run named {marker!r} in it)")
    return [list(map(float, run["loss"])) for run in seeded[names[0]]]


def _probe_epochs_worth(answer, seeded, reference_epoch) -> dict:
    """``answer``: the student's epoch; ``seeded``: section 5's runs (each seed's curve);
    ``reference_epoch``: the scaled run's epoch the notebook drew for this run (the curves are
    the same on every run, the epoch is not: a copied answer is then likely wrong)."""
    return {"answer": answer, "reference_epoch": reference_epoch,
            "base": _curves(seeded, "(base)"), "scaled": _curves(seeded, "(scaled x8)")}


def _judge_epochs_worth(data) -> str:
    answer, reference = data["answer"], data["reference_epoch"]
    check_drawn("lesson04.reference_epoch", draw_reference_epoch, reference)  # graded runs only
    base = np.mean(np.asarray(data["base"], dtype=float), axis=0)
    scaled = np.mean(np.asarray(data["scaled"], dtype=float), axis=0)
    if (isinstance(reference, bool) or not isinstance(reference, int)
            or not 1 <= reference <= len(scaled)):
        raise ExerciseFailed(f"pass the reference epoch drawn above (1 to {len(scaled)}), not "
                             f"{reference!r}")
    if answer is not None and not is_whole(answer):
        raise ExerciseFailed(f"give a whole number of epochs (1 to {len(base)}), or None, not "
                             f"{answer!r}")
    if answer is not None and not 1 <= answer <= len(base):
        raise ExerciseFailed(f"epochs run from 1 to {len(base)} (the first point of a curve is "
                             f"after epoch 1), not {answer}")
    # the first epoch (the exercise's answer): the student edition of the library leaves it out
    ### BEGIN SOLUTION
    target = float(scaled[reference - 1])
    reached = [e + 1 for e, loss in enumerate(base) if loss <= target]
    right = reached[0] if reached else None
    ### END SOLUTION
    if answer is None:
        if right is None:
            return (f"correct: in this run the base run never gets as low as the scaled one "
                    f"after epoch {reference}")
        raise ExerciseFailed(f"the base run does get to {target:.4g} (the scaled run after epoch "
                             f"{reference}) within {len(base)} epochs: give the first epoch")
    answer = int(answer)
    if base[answer - 1] > target:
        raise ExerciseFailed(f"at epoch {answer} the base run's mean loss is "
                             f"{base[answer - 1]:.4g}, still above the scaled run's "
                             f"{target:.4g} after epoch {reference}")
    if answer != right:
        raise ExerciseFailed(f"at epoch {answer} the base run is below {target:.4g}, but it got "
                             f"there earlier: give the first such epoch")
    return (f"correct: the scaled batch's first {reference} epochs (mean loss {target:.4g}) are "
            f"worth {right} of the base run's")


check_epochs_worth = checked("lesson04.epochs_worth", _probe_epochs_worth, _judge_epochs_worth)
check_epochs_worth.__doc__ = """Check ``epochs``, the first epoch at which section 5's base run
(mean over its seeds) is at or below the mean loss of the batch-256 run with the linearly scaled
rate after epoch ``reference_epoch`` (drawn in the notebook on every run):
``check_epochs_worth(epochs, seeded, reference_epoch)``."""
