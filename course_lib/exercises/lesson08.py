"""Checks for lesson 8's exercises: a Dirichlet partition whose minimum size is built in rather
than redrawn, and the label mix that FedAvg with uniform client weights trains on (for a
partition whose alpha and seed every run of the notebook draws afresh: the number is the run's).

Slides "Parallel computing for machine learning", part 4 (data are not IID and their amounts
severely imbalanced; direction 1, Federated Averaging: the server averages the clients' models
weighted by their data); lesson 8 sections 1 (partitions) and 2 (FedAvg). Each check is a probe
(runs in the student's kernel, returns plain data) and a judge (decides from the data; the grader
runs it outside the kernel): see :mod:`course_lib.exercises.common`. The partition's judge draws
its cases itself and takes only the partitions from the data (:mod:`course_lib.exercises.cases`).
"""

from __future__ import annotations

import numpy as np

from course_lib import partitions as pt
from course_lib.exercises import practice
from course_lib.exercises.cases import digest, merged
from course_lib.exercises.common import (
    ExerciseFailed,
    check_drawn,
    checked,
    grading_seed,
    hidden_seed,
    is_number,
    judge_cases,
)

# -- exercise 1: Dirichlet per class, with a floor of min_size rows per client ------------------


def _labels(label_seed: int, n: int, classes: int) -> np.ndarray:
    """Labels with unequal classes (as real data has), the same for the same arguments: the
    judge rebuilds them from the case instead of trusting the kernel's copy."""
    rng = np.random.default_rng(label_seed)
    return rng.choice(classes, n, p=rng.dirichlet(np.full(classes, 5.0)))


def _partition_cases(seed) -> list[dict]:
    """The visible cases: the digits' size with 50 clients and a floor of 15 rows, where
    ``pt.dirichlet_per_class`` gives up (tiny alpha: each class should land on few clients);
    and a large alpha, where the classes should spread evenly. A graded run adds cases drawn at
    random for that run."""
    cases = [dict(label_seed=0, n=1347, classes=10, clients=50, alpha=0.01, min_size=15, seed=3),
             dict(label_seed=0, n=1347, classes=10, clients=20, alpha=1000.0, min_size=5, seed=4)]
    if seed is not None:
        rng = np.random.default_rng(seed)
        for alpha in (0.005, 0.01, 1000.0):
            n, clients = int(rng.integers(300, 1500)), int(rng.integers(5, 41))
            cases.append(dict(label_seed=int(rng.integers(2**31)), n=n,
                              classes=int(rng.integers(4, 11)), clients=clients, alpha=alpha,
                              min_size=int(rng.integers(0, n // (2 * clients) + 1)),
                              seed=int(rng.integers(2**31)), hidden=True))
    return cases


def _rows(parts) -> list[list[int]]:
    try:
        return [[int(i) for i in np.asarray(p).reshape(-1)] for p in parts]
    except (TypeError, ValueError) as error:
        raise ExerciseFailed("return a list with one array of row indices per client") from error


def _probe_partition(partition) -> dict:
    """Runs ``partition`` on each case twice with its seed and once with another seed."""
    out = []
    for case in _partition_cases(hidden_seed()):
        labels = _labels(case["label_seed"], case["n"], case["classes"])
        args = (case["clients"], case["alpha"], case["min_size"])
        try:
            runs = [_rows(partition(labels.copy(), *args, s))
                    for s in (case["seed"], case["seed"], case["seed"] + 1)]
        except (ExerciseFailed, NotImplementedError):
            raise
        except Exception as error:  # noqa: BLE001 - say which case made it fail
            redrew = type(error).__name__ == "PartitionError"  # pt.dirichlet_per_class gave up
            raise ExerciseFailed(
                f"with {case['clients']} clients, alpha = {case['alpha']}, min_size = "
                f"{case['min_size']} your function raised {type(error).__name__}: {error}"
                + (". Build the floor first: no redrawing" if redrew else "")) from error
        out.append(dict(case=case, runs=runs))
    return {"cases": out}


def _top_share(counts: np.ndarray) -> float:
    """Per class, the share of its rows that its largest holder has; averaged over classes."""
    total = counts.sum(axis=0)
    keep = total > 0
    return float((counts.max(axis=0)[keep] / total[keep]).mean())


def _mean_emd(counts: np.ndarray) -> float:
    mixes = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    return float(np.abs(mixes - counts.sum(axis=0) / counts.sum()).sum(axis=1).mean())


def _judge_partition_case(case, runs) -> str | None:
    """What is wrong with one case's three partitions, or None."""
    labels = _labels(case["label_seed"], case["n"], case["classes"])
    n, clients, alpha, floor = case["n"], case["clients"], case["alpha"], case["min_size"]
    where = f" (clients = {clients}, alpha = {alpha}, min_size = {floor}, {n} rows)"
    if not (isinstance(runs, list) and len(runs) == 3 and all(
            isinstance(run, list) and all(isinstance(p, list) for p in run) for run in runs)):
        return f"expected three partitions{where}"
    parts = runs[0]
    if len(parts) != clients:
        return f"{len(parts)} arrays for {clients} clients{where}: return one per client"
    rows = [i for p in parts for i in p]
    if any(not 0 <= i < n for i in rows):
        return f"a row index is outside 0..{n - 1}{where}"
    if len(set(rows)) != len(rows):
        return f"{len(rows) - len(set(rows))} rows belong to two clients{where}: the floor's " \
               f"rows must leave the pool that the Dirichlet split deals out"
    if len(rows) != n:
        return f"{n - len(rows)} rows belong to no client{where}: deal out every row"
    if min(len(p) for p in parts) < floor:
        return f"a client has {min(len(p) for p in parts)} rows{where}: give every client " \
               f"min_size rows first"
    if [sorted(p) for p in runs[1]] != [sorted(p) for p in parts]:
        return f"the same seed gave another partition{where}: draw everything from " \
               f"np.random.default_rng(seed)"
    if [sorted(p) for p in runs[2]] == [sorted(p) for p in parts]:
        return f"another seed gave the same partition{where}: use the seed"
    counts = np.stack([np.bincount(labels[p], minlength=case["classes"]) for p in parts])
    share = floor * clients / n  # of every class, about this share went to the floors
    if alpha < 1:
        # Dir(alpha) with a tiny alpha puts nearly all of a class's remaining rows on one client;
        # the bar is halfway between an even split (1/clients) and that expectation
        largest = np.random.default_rng(0).dirichlet(np.full(clients, alpha), 4000).max(axis=1)
        bar = 1 / clients + 0.5 * (1 - share) * (largest.mean() - 1 / clients)
        if _top_share(counts) < bar:
            return (f"the classes are spread too evenly{where}: a class's largest holder has "
                    f"{_top_share(counts):.0%} of it on average, but with this alpha most of the "
                    f"rows left after the floor should sit on one client (more than {bar:.0%}). "
                    f"Split what is left of each class with proportions ~ Dir(alpha)")
    else:
        even = _mean_emd(np.stack([np.bincount(labels[p], minlength=case["classes"]) for p in
                                   np.array_split(np.random.default_rng(0).permutation(n),
                                                  clients)]))
        if _mean_emd(counts) > 1.5 * even + 0.05:
            return (f"the clients' label mixes are far from the global one{where} (mean EMD "
                    f"{_mean_emd(counts):.2f}, an IID split has {even:.2f}): with a large alpha "
                    f"every client should get about its share of every class")
    return None


def _judge_partition(data) -> str:
    own = {"cases": [{"case": case} for case in _partition_cases(hidden_seed())]}
    data = merged(own, data, ("runs",))  # the cases drawn here, not read
    judge_cases(data["cases"], lambda item: _judge_partition_case(item["case"], item["runs"]))
    first = data["cases"][0]
    return (f"correct: disjoint, complete, seeded, at least min_size rows each "
            f"({min(len(p) for p in first['runs'][0])} with {first['case']['clients']} clients, "
            f"where pt.dirichlet_per_class gives up), skewed for a tiny alpha, even for a large "
            f"one")


check_dirichlet_with_floor = checked("lesson08.dirichlet_with_floor", _probe_partition,
                                     _judge_partition)
check_dirichlet_with_floor.__doc__ = """Check ``partition(labels, clients, alpha, min_size,
seed)``: min_size random rows per client, then what is left of each class split over the
clients with proportions ~ Dir(alpha); seeded."""


# -- exercise 2: the label mix of the uniformly weighted objective -------------------------------
# The partition is drawn for each run (alpha and seed, in the notebook), so the number is
# this run's: the judge rebuilds the partition from them with the library and recomputes it.

MIN_SIZE = 5  # section 1's floor for the per-class Dirichlet partition
TV_TOL = 1e-3  # how far from the distance an answer may be
LESSON_CLIENTS = 50  # the notebook's K


@practice.practised
def draw_partition(rng) -> tuple[float, int]:
    """Exercise 2's partition parameters (alpha in 0.25-1, two decimals: skewed, and never a
    PartitionError; a seed below 10**6): ``common.drawn("lesson08.partition", draw_partition)``
    in the notebook (a practice draw; the grader's run draws its own)."""
    return round(float(rng.uniform(0.25, 1.0)), 2), int(rng.integers(10**6))


def _probe_uniform_mix(tv, labels, clients, alpha, seed) -> dict:
    """``tv``: the student's number; ``labels``: this run's training labels; ``clients``,
    ``alpha``, ``seed``: the partition the exercise cell drew (``pt.dirichlet_per_class(labels,
    clients, alpha=alpha, min_size=5, seed=seed)``)."""
    return {"tv": tv, "labels": [int(v) for v in np.asarray(labels).reshape(-1)],
            "clients": clients, "alpha": alpha, "seed": seed}


def _rebuild(data) -> list[np.ndarray]:
    """This run's partition, rebuilt here from the drawn parameters (not the kernel's copy)."""
    labels, clients, alpha, seed = data["labels"], data["clients"], data["alpha"], data["seed"]
    whole = [not isinstance(v, bool) and isinstance(v, int) for v in (clients, seed)]
    if not all(whole) or not 2 <= clients <= len(labels) or seed < 0 or \
            not is_number(alpha) or not alpha > 0:
        raise ExerciseFailed("pass the labels and the partition's K, alpha and seed, as the "
                             "exercise cell drew them")
    try:
        parts = pt.dirichlet_per_class(np.asarray(labels), clients, alpha=alpha,
                                       min_size=MIN_SIZE, seed=seed)
    except pt.PartitionError as error:
        raise ExerciseFailed(f"no such partition: {error}") from error
    return [np.asarray(q, dtype=np.int64) for q in parts]


def _judge_uniform_mix(data) -> str:
    check_drawn("lesson08.partition", draw_partition, [data["alpha"], data["seed"]])
    if grading_seed() is not None and (data["clients"] != LESSON_CLIENTS or not isinstance(
            data["labels"], list) or digest(data["labels"]) != digest(_lesson_labels())):
        raise ExerciseFailed(f"pass the notebook's labels (the digits' training labels) and its "
                             f"K = {LESSON_CLIENTS}")
    tv, labels = data["tv"], np.asarray(data["labels"], dtype=np.int64)
    if not is_number(tv):
        raise ExerciseFailed(f"give the distance as a number, not {tv!r}")
    parts = _rebuild(data)
    sizes = [len(p) for p in parts]
    where = f" (alpha = {data['alpha']}, seed = {data['seed']})"
    try:
        right = uniform_mix_distance(labels, parts)
    except NotImplementedError:  # the student edition: the practice draw's digests
        case = [data["alpha"], data["seed"], len(parts), digest(data["labels"])[:20]]
        return practice.judge("lesson08.partition", case, {"tv": practice.bin_of(tv, TV_TOL)},
                              {"tv": tv})
    # how far a wrong answer is from it: the student edition of the library leaves it out
    ### BEGIN SOLUTION
    classes = int(labels.max()) + 1
    p = np.bincount(labels, minlength=classes) / len(labels)
    if abs(tv - right) <= TV_TOL:
        return (f"correct: uniform weights train on a label mix at total-variation distance "
                f"{tv:.4f} from the data's{where}; {len(parts)} clients of {min(sizes)} to "
                f"{max(sizes)} rows")
    counts = np.stack([np.bincount(labels[q], minlength=classes) for q in parts])
    per_client = 0.5 * np.abs(counts / counts.sum(axis=1, keepdims=True) - p).sum(axis=1).mean()
    if abs(tv - 2 * right) <= 2e-3:
        hint = "That is sum_c |q(c) - p(c)|: the total-variation distance is half of it."
    elif abs(tv) <= 1e-3:
        hint = ("0 is the distance of the size-weighted objective (weights n_k / n give every "
                "row the same weight, so it trains on p itself); with weight 1/K per client, "
                "rows of small clients count more.")
    elif abs(tv - per_client) <= 2e-3 or abs(tv - 2 * per_client) <= 4e-3:
        hint = ("That is how far the clients' own mixes are from p, on average; the question is "
                "how far the one mix the averaged objective puts on the labels is.")
    else:
        hint = ("Compute it in code from this run's partition `mine`: every run draws a new one. "
                "Client k's loss is the mean over its n_k rows and carries weight 1/K: which "
                "weight does one row get, and so each label?")
    raise ExerciseFailed(f"{tv!r} is off by {abs(tv - right):.3g}{where} (the tolerance is "
                         f"1e-3). {hint}")
    ### END SOLUTION


def uniform_mix_distance(labels, parts) -> float:
    """The total-variation distance between the label mix of the uniformly weighted objective
    over the clients' ``parts`` and the data's. The student edition of the library leaves this
    out: it is the exercise's answer."""
    ### BEGIN SOLUTION
    # the objective (1/K) sum_k (1/n_k) sum_{i in k} loss_i puts weight 1/(K n_k) on each row;
    # its label mix is the weight each label gets (the weighted objective's is p itself)
    weight = np.zeros(len(labels))
    for part in parts:
        weight[part] = 1 / (len(parts) * len(part))
    classes = int(labels.max()) + 1
    mix = np.bincount(labels, weights=weight, minlength=classes)
    p = np.bincount(labels, minlength=classes) / len(labels)
    return float(0.5 * np.abs(mix - p).sum())
    ### END SOLUTION


def _lesson_labels() -> list[int]:
    """The notebook's labels: the digits' training labels."""
    from course_lib.data import load_digits

    return load_digits().y_train.tolist()


def _practice_answers(case) -> dict:
    labels = _lesson_labels()
    parts = _rebuild({"labels": labels, "clients": case[2], "alpha": case[0], "seed": case[1]})
    return {"tv": practice.near(uniform_mix_distance(np.asarray(labels), parts), TV_TOL)}


practice.register("lesson08.partition", _practice_answers, draw_partition,
                  lambda: [LESSON_CLIENTS, digest(_lesson_labels())[:20]])
check_uniform_mix = checked("lesson08.uniform_mix", _probe_uniform_mix, _judge_uniform_mix)
check_uniform_mix.__doc__ = """Check ``tv``, the total-variation distance between the label mix
that FedAvg with uniform client weights (1/K) trains on and the data's label mix, for this run's
partition ``pt.dirichlet_per_class(labels, K, alpha=alpha, min_size=5, seed=seed)``:
``check_uniform_mix(tv, labels, K, alpha, seed)``."""
