"""Costs of distributed SGD's variants: a parameter server's words and epoch time, asynchronous
staleness, federated bytes per round, the error bound of a quantized sum. Part of
``course_lib.cost_models``."""

import math

import numpy as np

from course_lib.cost_models.laws import check_processes, check_sizes


def parameter_server_words(p: int, d: int, topology: str) -> int:
    """Words through the server in one synchronous iteration, both ways (lecture note, section
    2): O(dp) on a star, 2 d (p - 1); O(d log p) on a binomial tree, 2 d ceil(log2 p)."""
    check_processes(p)
    d = check_sizes("d", d)
    if topology == "star":
        return 2 * d * (p - 1)
    if topology == "tree":
        return 2 * d * math.ceil(math.log2(p)) if p > 1 else 0
    raise ValueError(f"unknown topology {topology!r}: use 'star' or 'tree'")


def parameter_server_epoch_seconds(n: int, batch: int, compute_seconds, round_trip: float,
                                   mode: str) -> float:
    """Seconds per epoch of n rows with p workers (slides part 2), worker k taking
    ``compute_seconds[k]`` per mini-batch of ``batch`` rows and a pull-push ``round_trip``:
    synchronous, every step waits for the slowest, n / (p b) (max_k c_k + r); asynchronous,
    the workers' rates add up, (n / b) / sum_k 1 / (c_k + r)."""
    c = np.asarray(compute_seconds, dtype=float)
    check_processes(len(c), "the workers, len(compute_seconds),")
    if not (batch >= 1 and n >= 0):
        raise ValueError(f"need a batch of 1 row or more and n >= 0 rows, got batch={batch}, n={n}")
    check_sizes("compute_seconds", c), check_sizes("round_trip", round_trip)
    if mode == "async" and not (c + round_trip > 0).all():
        raise ValueError("asynchronous workers need a time above 0 per mini-batch: a compute "
                         "time and round trip that add up to 0 would make an epoch take no time")
    if mode == "sync":
        return n / (len(c) * batch) * (c.max() + round_trip)
    if mode == "async":
        return n / batch / float(np.sum(1.0 / (c + round_trip)))
    raise ValueError(f"unknown mode {mode!r}: use 'sync' or 'async'")


def async_staleness(p: int, slowdown: float = 1.0) -> float:
    """Typical staleness of an asynchronous gradient with p equally fast workers, p - 1 (each of
    the others pushes once while it computes); for a worker ``slowdown`` times slower than the
    rest, about slowdown (p - 1)."""
    return check_sizes("slowdown", slowdown) * (check_processes(p) - 1)


def federated_bytes_per_round(clients: int, d: int, messages: int = 1,
                              bytes_per_number: int = 4) -> int:
    """A federated round: the model to each of ``clients`` and back, ``messages`` vectors of d
    numbers each way (SCAFFOLD: 2, the model and a control variate)."""
    d, messages, bytes_per_number = (check_sizes(name, value) for name, value in (
        ("d", d), ("messages", messages), ("bytes_per_number", bytes_per_number)))
    return 2 * check_processes(clients, "clients") * d * messages * bytes_per_number


def quantized_sum_error_bound(p: int, scale: float, stochastic: bool = True) -> float:
    """Largest error of one entry of a sum of p int8-quantised vectors with step ``scale``: each
    rank's code is off by less than one step (stochastic rounding) or half a step (nearest)."""
    return check_processes(p) * check_sizes("scale", scale) * (1.0 if stochastic else 0.5)
