"""Checks for lesson 0's exercises: an all-reduce every rank joins, and a prediction of what each
rank holds after a sequence of collectives.

Slides "Parallel computing for machine learning", part 1 (communication by message passing) and
part 3 (the all-reduce). Each check is a probe (runs in the student's kernel: it launches the
student's code on 2 ranks and returns what each rank ended with, with the inputs) and a judge
(decides from that data alone, recomputing what each rank should hold; the grader runs it outside
the kernel): see :mod:`course_lib.exercises.common`. The first judge draws its cases itself and
takes only the ranks' answers from the data (:mod:`course_lib.exercises.cases`).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from course_lib.exercises.cases import merged
from course_lib.exercises.common import (
    ExerciseFailed,
    HiddenTestFailed,
    check_drawn,
    checked,
    hidden_seed,
    is_number,
    launch_checked,
)

WORLD_SIZE = 2
TOL = 1e-6  # absolute: the visible and hidden values are multiples of 1/4, exact in float32


def _launch(fn, args, timeout):
    """Launch ``fn`` on 2 ranks; a failed or hung rank becomes an ExerciseFailed that says so."""
    return launch_checked(fn, WORLD_SIZE, args, timeout=timeout)


# -- exercise 1: an all-reduce every rank joins --------------------------------------------------


def _each_rank_runs(fn, cases):
    """Runs on every rank: ``fn`` called with this rank's own number of each case (never the
    others': a rank learns them only from messages)."""
    rank = dist.get_rank()
    return [fn(case[rank]) for case in cases]


def _mean_max_cases(seed):
    visible = [[1.0, 2.0], [-0.5, 4.25], [3.0, 3.0]]
    cases = {"visible": visible}
    if seed is not None:  # multiples of 1/4: exact in float32, whatever dtype the student picks
        g = torch.Generator().manual_seed(seed)
        drawn = torch.randint(-400, 401, (4, WORLD_SIZE), generator=g) / 4
        cases["hidden"] = drawn.tolist()
    return cases


def _probe_mean_and_max(mean_and_max, timeout: float = 30) -> dict:
    cases = _mean_max_cases(hidden_seed())
    everything = [c for group in cases.values() for c in group]
    per_rank = _launch(_each_rank_runs, (mean_and_max, everything), timeout)
    data, start = {}, 0
    for name, group in cases.items():
        data[name] = {"values": group,
                      "ranks": [[_plain_pair(r[start + i]) for i in range(len(group))]
                                for r in per_rank]}
        start += len(group)
    return data


def _plain_pair(answer):
    """A rank's answer as plain data: two floats, or what it was (the judge says what's wrong)."""
    if isinstance(answer, (tuple, list)) and len(answer) == 2:
        return [a if isinstance(a, (int, float)) and not isinstance(a, bool) else repr(a)
                for a in answer]
    return repr(answer)


def _mean_max_wrong(values, ranks) -> str | None:
    """What is wrong with the ranks' answers for these cases, or None."""
    if not (isinstance(ranks, list) and len(ranks) == WORLD_SIZE and all(
            isinstance(answers, list) and len(answers) == len(values) for answers in ranks)):
        return f"expected answers from {WORLD_SIZE} ranks, one per case ({len(values)})"
    for case, row in enumerate(values):
        mean, largest = sum(row) / len(row), max(row)
        for rank, answers in enumerate(ranks):
            got = answers[case]
            if not (isinstance(got, list) and all(isinstance(a, (int, float)) for a in got)):
                return (f"rank {rank} returned {got} for the values {row}: return two Python "
                        f"floats (mean, largest), e.g. with t.item()")
            for what, have, want in (("mean", got[0], mean), ("largest value", got[1], largest)):
                if not abs(have - want) <= TOL:  # also catches nan
                    hint = (" (the sum: divide by dist.get_world_size())"
                            if math.isclose(have, sum(row)) and what == "mean" else "")
                    return (f"rank {rank} returned {have!r} as the {what} of the values {row}, "
                            f"which is {want!r}{hint}")
    return None


def _judge_mean_and_max(data) -> str:
    """The cases drawn here (visible, and hidden in a graded run); the ranks' answers from the
    data."""
    own = {name: {"values": group} for name, group in _mean_max_cases(hidden_seed()).items()}
    data = merged(own, data, ("ranks",))
    wrong = _mean_max_wrong(data["visible"]["values"], data["visible"]["ranks"])
    if wrong:
        raise ExerciseFailed(wrong)
    if "hidden" in data and _mean_max_wrong(data["hidden"]["values"], data["hidden"]["ranks"]):
        raise HiddenTestFailed("a hidden case failed")
    n = len(data["visible"]["values"])
    return f"correct: both ranks hold the mean and the largest value, in all {n} cases"


check_mean_and_max = checked("lesson00.mean_and_max", _probe_mean_and_max, _judge_mean_and_max)
check_mean_and_max.__doc__ = """Check ``mean_and_max(x, group=None)``: launched on 2 ranks, rank r
called with its own number x (and no group: all ranks), every rank returns (the mean, the largest)
of all ranks' numbers."""


# -- exercise 2: predict what each rank holds ----------------------------------------------------


def draw_values(rng) -> list[float]:
    """Exercise 2's ``values``, one whole number from -9 to 9 per rank:
    ``common.drawn("lesson00.values", draw_values)`` in the notebook (the grader draws its own)."""
    return [float(v) for v in rng.integers(-9, 10, WORLD_SIZE)]


def _probe_prediction(prediction, sequence, values, timeout: float = 30) -> dict:
    """``prediction``: the student's list, one number per rank, made before the run;
    ``sequence``: the notebook's ``collective_sequence``; ``values``: this run's inputs."""
    values = [float(v) for v in values]
    ran = _launch(sequence, (values,), timeout)
    if isinstance(prediction, torch.Tensor):
        prediction = prediction.tolist()
    return {"values": values, "prediction": prediction, "ran": ran}


def _simulate(values) -> list[float]:
    """What ``collective_sequence`` leaves on each rank, by following each rank's state through
    the four steps (no processes, no messages: the messages' effect, written out). The student
    edition of the library leaves this out: it is the exercise's answer."""
    ### BEGIN SOLUTION
    p = len(values)
    held = [max(values)] * p  # 1. all_reduce MAX: every rank holds the largest
    held = [h * (rank + 1) for rank, h in enumerate(held)]  # 2. local: times rank + 1
    gathered = [list(held) for _ in range(p)]  # 3. all_gather: every rank holds every rank's
    return [sum(g) - values[rank] for rank, g in enumerate(gathered)]  # 4. local
    ### END SOLUTION


def _judge_prediction(data) -> str:
    values, prediction = data["values"], data["prediction"]
    check_drawn("lesson00.values", draw_values, values)  # not values the student chose
    if len(values) != WORLD_SIZE or not all(isinstance(v, (int, float)) for v in values):
        raise ExerciseFailed(f"values must hold {WORLD_SIZE} numbers, one per rank")
    ran = data["ran"]
    if not (isinstance(ran, list) and len(ran) == WORLD_SIZE and all(
            isinstance(r, (int, float)) and math.isfinite(r) for r in ran)):
        raise ExerciseFailed(f"the run of collective_sequence gave {ran!r}, not a number per "
                             f"rank: run its cell again, unchanged")
    try:
        right = _simulate(values)
    except NotImplementedError:  # the student edition: the prediction against the run itself
        right = ran
    if not all(abs(r - w) <= TOL for r, w in zip(ran, right, strict=True)):
        raise ExerciseFailed(f"the run of collective_sequence gave {ran}, not what the "
                             f"sequence shown yields: run its cell again, unchanged")
    if not (isinstance(prediction, list) and len(prediction) == WORLD_SIZE):
        raise ExerciseFailed(f"predict a list of {WORLD_SIZE} numbers, one per rank, not "
                             f"{prediction!r}")
    for rank, (guess, held) in enumerate(zip(prediction, right, strict=True)):
        if not is_number(guess):
            raise ExerciseFailed(f"rank {rank}: predict a number, not {guess!r}")
        if not abs(guess - held) <= TOL:
            raise ExerciseFailed(f"for values = {values}: you predicted {guess!r} for rank "
                                 f"{rank}, the run left {held!r} there. Follow one rank "
                                 f"through the four steps")
    return (f"correct: for values = {values} the run left {right} on the ranks, as you "
            f"predicted")


check_prediction = checked("lesson00.prediction", _probe_prediction, _judge_prediction)
check_prediction.__doc__ = """Check ``prediction`` (one number per rank) against a run of
``collective_sequence(values)`` on 2 ranks: ``check_prediction(prediction,
collective_sequence, values)``."""
