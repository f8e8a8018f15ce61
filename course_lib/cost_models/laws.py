"""Scaling laws and the cost of waiting: Amdahl's and Gustafson's speedups and their fits, the
chance that one of p workers fails, a bulk-synchronous timeline. Part of
``course_lib.cost_models``."""

import numbers

import numpy as np
import torch


def check_processes(p, name: str = "p"):
    """``p`` itself, if it is (or every entry of it is) a number of processes, at least 1 and
    finite."""
    if isinstance(p, (bool, str, bytes)) or not (
            (isinstance(p, (int, float)) and 1 <= p < float("inf")) or (
            np.size(p) and np.isfinite(values := np.asarray(p, dtype=float)).all()
            and (values >= 1).all())):
        raise ValueError(f"{name} (the number of processes) must be at least 1, got {p!r}")
    return np.asarray(p, dtype=float) if isinstance(p, list | tuple) else p  # as check_sizes


def check_count(name: str, value) -> int:
    """``value`` itself, if it is a whole number of at least 1 (stages, micro-batches, rounds)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
    return value


def check_sizes(name: str, value):
    """``value`` itself, if it is (or every entry of it is) a size, a time or a rate: zero or
    more, not NaN (infinity allowed: a link that never delivers). A list or a tuple comes back as
    a float64 array: arithmetic on a list repeats it (2 * [a, b] is [a, b, a, b])."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        ok = value >= 0  # the planner's many scalars: no tensor made for them
    else:
        ok = not isinstance(value, bool | str | bytes) and bool(np.size(value)) and bool(
            (torch.as_tensor(value, dtype=torch.float64).detach().cpu() >= 0).all())
    if not ok:
        raise ValueError(f"{name} must be zero or more (not NaN), got {value!r}")
    return np.asarray(value, dtype=float) if isinstance(value, list | tuple) else value


def check_share(name: str, value):
    """``value`` itself, if it is (or every entry of it is) a share: from 0 to 1."""
    if isinstance(value, bool | str | bytes) or not np.size(value) or not (
            (values := np.asarray(value, dtype=float)) >= 0).all() or not (values <= 1).all():
        raise ValueError(f"{name} is a share: from 0 to 1, got {value!r}")
    return value


# -- speedup -------------------------------------------------------------------------------------


def amdahl_speedup(p, f: float):
    """Strong scaling (fixed total work): S(p) = 1 / ((1 - f) + f / p)."""
    p, f = np.asarray(check_processes(p), dtype=float), check_share("f (the parallel share)", f)
    return 1.0 / ((1.0 - f) + f / p)


def gustafson_speedup(p, f: float):
    """Weak scaling (work grows with p): S(p) = (1 - f) + f p."""
    f = check_share("f (the parallel share)", f)
    return (1.0 - f) + f * np.asarray(check_processes(p), dtype=float)


def fit_amdahl(p, speedups) -> float:
    """Least-squares f in [0, 1] for Amdahl's law; 1/S = 1 - f (1 - 1/p) is linear in f."""
    p, s = np.asarray(p, dtype=float), np.asarray(speedups, dtype=float)
    if p.shape != s.shape or p.size == 0:
        raise ValueError("p and speedups must be non-empty and of the same length")
    if not (np.isfinite(s).all() and (s > 0).all()):
        raise ValueError(f"speedups must be above 0, got {s.tolist()}")
    x = 1.0 - 1.0 / check_processes(p)
    if not np.any(x > 0):
        raise ValueError("fitting Amdahl's f needs a run on more than one process: on one, "
                         "every f gives the speedup 1")
    return float(np.clip(np.dot(x, 1.0 - 1.0 / s) / np.dot(x, x), 0.0, 1.0))


def fit_gustafson(p, speedups) -> float:
    """Least-squares f in [0, 1] for Gustafson's law; S - 1 = f (p - 1) is linear in f."""
    p, s = np.asarray(p, dtype=float), np.asarray(speedups, dtype=float)
    if p.shape != s.shape or p.size == 0:
        raise ValueError("p and speedups must be non-empty and of the same length")
    if not (np.isfinite(s).all() and (s > 0).all()):
        raise ValueError(f"speedups must be above 0, got {s.tolist()}")
    x = check_processes(p) - 1.0
    if not np.any(x > 0):
        raise ValueError("fitting Gustafson's f needs a run on more than one process: on one, "
                         "every f gives the speedup 1")
    return float(np.clip(np.dot(x, s - 1.0) / np.dot(x, x), 0.0, 1.0))


def probability_any_fails(p, q: float):
    """P(at least one of p independent workers fails), each with probability q: 1 - (1 - q)^p
    (lecture note, section 2.4: the straggler effect)."""
    q = check_share("q (a probability)", q)
    return 1.0 - (1.0 - q) ** torch.as_tensor(check_processes(p), dtype=torch.float64)


def bulk_synchronous_timeline(compute_seconds, communication: float, iterations: int = 3):
    """The model of bulk-synchronous iterations (slides part 1: everyone waits for the slowest
    worker): worker k computes for ``compute_seconds[k]``, idles until the slowest is done, then
    all communicate for ``communication`` seconds. Returns Gantt spans."""
    from course_lib.runtime.timing import Span

    check_processes(len(compute_seconds), "len(compute_seconds)")
    check_count("iterations", iterations), check_sizes("communication", communication)
    check_sizes("compute_seconds", compute_seconds)
    spans, t, slowest = [], 0.0, max(compute_seconds)
    for _ in range(iterations):
        for k, c in enumerate(compute_seconds):
            spans.append(Span(k, t, c, "compute"))
            if slowest > c:
                spans.append(Span(k, t + c, slowest - c, "idle (waiting for the straggler)"))
            spans.append(Span(k, t + slowest, communication, "communicate / wait"))
        t += slowest + communication
    return spans


# -- messages and collectives --------------------------------------------------------------------
