"""Checks for lesson 6's exercises: the staleness of fast and slow workers' gradients when several
workers are slow, and the rate at which the server applies gradients in each mode, both predicted
and checked against simulated runs.

Slides "Parallel computing for machine learning", part 2 (asynchronous GD and staleness: the
notebook's section 3; stale-synchronous parallel, Ho et al. 2013: section 5). Each check is a probe
(runs in the student's kernel, returns plain data) and a judge (decides from that data alone,
recomputing every reference; the grader runs it outside the kernel): see
:mod:`course_lib.exercises.common`. Both judges draw their cases themselves and take only the
answers from the data (:mod:`.cases`). Lesson 6b's (push-sum, gossip) are in :mod:`.lesson06b`.
"""

from __future__ import annotations

import functools
import math

import torch

from course_lib.async_sgd import simulate_parameter_server
from course_lib.erm import ERMProblem
from course_lib.exercises import practice
from course_lib.exercises.cases import merged
from course_lib.exercises.common import (
    ExerciseFailed,
    HiddenTestFailed,
    as_number,
    checked,
    hidden_seed,
    is_number,
)
from course_lib.parameter_server import sgd

# -- exercise 1: the staleness of fast and slow workers' gradients -------------------------------

STALENESS_TOL = 0.05  # relative; the exact rates argument lands within 2.3% of every setting drawn
GRADIENTS, JITTER = 1000, 0.1  # per simulated run: ~0.1 s; jitter breaks exact ties in time
VISIBLE_SETTINGS = [(6, 2, 3.0), (4, 1, 8.0)]  # (m, q, k); the second is section 3's straggler
# their simulated runs (a test holds them to simulated_staleness): the student edition, which
# lacks that, judges the visible settings with them
VISIBLE_RUNS = {(6, 2, 3.0): (3.655011655011655, 12.950704225352112),
                (4, 1, 8.0): (2.121875, 23.825)}


def _settings(seed) -> dict:
    """(m workers, the last q of them k times slower): two visible settings, and in a graded run
    three drawn at random (m 4..10, q 1..3 with two fast workers at least, k 2..5)."""
    cases = {"visible": VISIBLE_SETTINGS}
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        hidden = []
        for _ in range(3):
            m = int(torch.randint(4, 11, (), generator=g))
            q = int(torch.randint(1, min(3, m - 2) + 1, (), generator=g))
            hidden.append((m, q, float(torch.randint(2, 6, (), generator=g))))
        cases["hidden"] = hidden
    return cases


def _probe_staleness(mean_staleness) -> dict:
    data = {}
    for name, settings in _settings(hidden_seed()).items():
        rows = []
        for m, q, k in settings:
            got = mean_staleness(m, q, k)
            if not (isinstance(got, (tuple, list)) and len(got) == 2):
                raise ExerciseFailed(f"mean_staleness({m}, {q}, {k:g}) returned {got!r}: return "
                                     f"two numbers, (fast, slow)")
            fast, slow = (as_number(v, f"mean_staleness({m}, {q}, {k:g})[{i}]")
                          for i, v in enumerate(got))
            rows.append({"m": m, "q": q, "k": k, "fast": fast, "slow": slow})
        data[name] = rows
    return data


@functools.lru_cache(maxsize=16)  # the judge reads each visible run twice
def simulated_staleness(m: int, q: int, k: float) -> tuple[float, float]:
    """The run the predictions are checked against: section 6's simulator, asynchronous, m
    workers of which the last q are k times slower, no message latency. Returns the mean
    staleness of the fast workers' gradients and of the slow workers' gradients. The student
    edition of the library leaves this out: it answers the exercise (its signature is
    ``mean_staleness``'s)."""
    ### BEGIN SOLUTION
    if not (isinstance(m, int) and 2 <= m <= 16 and isinstance(q, int) and 1 <= q < m
            and 1 <= k <= 16):
        raise ExerciseFailed(f"no such setting: m = {m!r}, q = {q!r}, k = {k!r}")
    # staleness depends only on when gradients arrive, not on the data: a tiny problem will do
    problem = ERMProblem(torch.zeros(4 * m, 1, dtype=torch.float64),
                         torch.zeros(4 * m, dtype=torch.float64), 0.0, "least_squares")
    pad = {w: (k if w > m - q else 1.0) for w in range(1, m + 1)}
    log = simulate_parameter_server(problem, m, sgd(0.0), batch=1, gradients=GRADIENTS, pad=pad,
                                    jitter=JITTER, seed=0)
    fast = [t for t, w in zip(log["staleness"], log["worker"], strict=True) if w <= m - q]
    slow = [t for t, w in zip(log["staleness"], log["worker"], strict=True) if w > m - q]
    return sum(fast) / len(fast), sum(slow) / len(slow)
    ### END SOLUTION


def _run(m, q, k) -> tuple[float, float]:
    return VISIBLE_RUNS.get((m, q, k)) or simulated_staleness(m, q, k)


def _staleness_wrong(rows) -> str | None:
    """What is wrong with these predictions, or None: the setting and how far off, not the run's
    value itself (a hidden setting's message is never shown)."""
    for row in rows:
        m, q, k = int(row["m"]), int(row["q"]), float(row["k"])
        if not all(is_number(row[kind]) for kind in ("fast", "slow")):
            return f"m = {m}, q = {q}, k = {k:g}: expected two numbers, (fast, slow)"
        measured = dict(zip(("fast", "slow"), _run(m, q, k), strict=True))
        for kind in ("fast", "slow"):
            off = float(row[kind]) / measured[kind] - 1
            if not abs(off) <= STALENESS_TOL:
                other = "slow" if kind == "fast" else "fast"
                return (f"m = {m} workers, the last {q} of them {k:g}x slower: your {kind} "
                        f"workers' staleness, {float(row[kind]):g}, is {abs(off):.0%} "
                        f"{'above' if off > 0 else 'below'} the simulated run's mean "
                        f"({STALENESS_TOL:.0%} allowed). Count the gradients pushed while one "
                        f"{kind} gradient is computed: by the other {kind} workers and by the "
                        f"{other} ones")
    return None


def _judge_staleness(data) -> str:
    own = {name: [{"m": m, "q": q, "k": k} for m, q, k in settings]
           for name, settings in _settings(hidden_seed()).items()}
    data = merged(own, data, ("fast", "slow"))  # the settings drawn here, not read
    visible = data["visible"]
    if wrong := _staleness_wrong(visible):
        raise ExerciseFailed(wrong)
    if "hidden" in data and _staleness_wrong(data["hidden"]):
        raise HiddenTestFailed("a hidden case failed")
    said = "; ".join(f"m = {r['m']}, q = {r['q']}, k = {r['k']:g}: yours {r['fast']:.2f} and "
                     f"{r['slow']:.2f}, the run's " + " and ".join(
                         f"{v:.2f}" for v in _run(r["m"], r["q"], r["k"]))
                     for r in visible)
    return (f"correct: fast and slow workers' mean staleness within {STALENESS_TOL:.0%} of the "
            f"runs ({said})")


check_mean_staleness = checked("lesson06.mean_staleness", _probe_staleness, _judge_staleness)
check_mean_staleness.__doc__ = """Check ``mean_staleness(m, q, k)`` -> (fast, slow): the mean
staleness of a fast and of a slow worker's gradients when the last q of m asynchronous workers are
k times slower, within 5% of simulated runs."""


# -- exercise 2: how many gradients per second each mode applies -----------------------------------

MODES = ("sync", "async", "ssp")
RATE_TOL = 0.05  # relative; a right answer lands within 1.1% of every run drawn (2,000 gradients)
RATE_GRADIENTS = 2000
# (each worker's seconds per gradient, SSP's bound s): section 4's straggler, and three speeds
VISIBLE_CLUSTERS = [([0.005, 0.005, 0.005, 0.04], 2), ([0.01, 0.02, 0.03], 1)]


def _clusters(seed) -> dict:
    """Visible clusters, and in a graded run three drawn ones (3..6 workers, each 1 to 8 ms per
    gradient, bound 0..4)."""
    cases = {"visible": [{"seconds": c, "bound": b} for c, b in VISIBLE_CLUSTERS]}
    if seed is not None:
        g = torch.Generator().manual_seed(seed + 6)
        hidden = []
        for _ in range(3):
            m = int(torch.randint(3, 7, (), generator=g))
            seconds = [round(0.001 * (1 + 7 * torch.rand((), generator=g).item()), 4)
                       for _ in range(m)]
            hidden.append({"seconds": seconds, "bound": int(torch.randint(0, 5, (),
                                                                          generator=g))})
        cases["hidden"] = hidden
    return cases


def _probe_rates(gradients_per_second) -> dict:
    data = {}
    for name, clusters in _clusters(hidden_seed()).items():
        rows = []
        for cluster in clusters:
            row = dict(cluster)
            for mode in MODES:
                got = gradients_per_second(mode, list(cluster["seconds"]), cluster["bound"])
                row[mode] = as_number(got, f"gradients_per_second({mode!r}, "
                                           f"{cluster['seconds']}, {cluster['bound']})")
            rows.append(row)
        data[name] = rows
    return data


def simulated_rate(mode: str, seconds, bound: int) -> float:
    """The run a prediction is checked against: section 6's simulator, ``mode`` with worker w
    taking ``seconds[w - 1]`` per gradient, no jitter, no message latency; the gradients the
    server applied per second over 2,000 of them. The student edition leaves this out."""
    ### BEGIN SOLUTION
    m = len(seconds)
    problem = ERMProblem(torch.zeros(4 * m, 1, dtype=torch.float64),
                         torch.zeros(4 * m, dtype=torch.float64), 0.0, "least_squares")
    log = simulate_parameter_server(problem, m, sgd(0.0), mode=mode, batch=1,
                                    bound=bound if mode == "ssp" else None,
                                    gradients=RATE_GRADIENTS,
                                    pad={w + 1: float(c) for w, c in enumerate(seconds)})
    return len(log["staleness"]) / log["time"][-1]
    ### END SOLUTION


def _rate_bin(rate: float) -> int:
    return practice.bin_of(math.log(rate), math.log(1 + RATE_TOL))


def _rates_wrong(rows) -> str | None:
    """What is wrong with these predictions, or None (the cluster and how far off, not the run's
    rate: a hidden cluster's message is never shown)."""
    for row in rows:
        for mode in MODES:
            measured = simulated_rate(mode, row["seconds"], row["bound"])
            off = row[mode] / measured - 1
            if not abs(off) <= RATE_TOL:
                hint = {"sync": "A round waits for every worker",
                        "async": "Every worker pushes at its own pace",
                        "ssp": "No worker may run more than s gradients ahead of the slowest: "
                               "how fast does the slowest go?"}[mode]
                return (f"seconds per gradient {row['seconds']}, bound {row['bound']}: your "
                        f"{mode} rate, {row[mode]:.4g} per second, is {abs(off):.0%} "
                        f"{'above' if off > 0 else 'below'} the run's ({RATE_TOL:.0%} allowed). "
                        f"{hint}")
    return None


def _judge_rates(data) -> str:
    data = merged(_clusters(hidden_seed()), data, MODES)  # the clusters drawn here, not read
    for row in data["visible"]:
        if not all(is_number(row[mode]) and row[mode] > 0 for mode in MODES):
            raise ExerciseFailed(f"seconds {row['seconds']}: a rate is a positive number")
    try:
        wrong = _rates_wrong(data["visible"])
    except NotImplementedError:  # the student edition: the visible clusters' digests
        for row in data["visible"]:
            case = [row["seconds"], row["bound"]]
            practice.judge("lesson06.gradients_per_second", case,
                           {mode: _rate_bin(row[mode]) for mode in MODES},
                           {mode: row[mode] for mode in MODES})
        return "correct for the visible clusters (the grader runs your code on clusters of its own)"
    if wrong:
        raise ExerciseFailed(wrong)
    if "hidden" in data and _rates_wrong(data["hidden"]):
        raise HiddenTestFailed("a hidden case failed")
    return (f"correct: every mode's rate within {RATE_TOL:.0%} of a simulated run; with a "
            f"straggler SSP goes at the synchronous server's pace, whatever its bound")


practice.register("lesson06.gradients_per_second", lambda case: {
    mode: practice.near(math.log(simulated_rate(mode, *case)), math.log(1 + RATE_TOL))
    for mode in MODES}, cases=[[c, b] for c, b in VISIBLE_CLUSTERS])

check_rates = checked("lesson06.gradients_per_second", _probe_rates, _judge_rates)
check_rates.__doc__ = """Check ``gradients_per_second(mode, seconds, bound)``: the long-run rate
at which the server applies gradients in mode "sync", "async" or "ssp" (bound s) when worker w
takes seconds[w] per gradient, within 5% of simulated runs."""
