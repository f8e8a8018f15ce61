"""The alpha-beta model of a message and of the collectives built from messages: its fit, messages
sent as gradients become ready, the all-reduce algorithms' bytes and times, bus bandwidth. Part of
``course_lib.cost_models``."""

import math

import numpy as np
import torch

from course_lib.cost_models.laws import check_processes, check_sizes


def alpha_beta_time(n_bytes, alpha: float, beta: float):
    """One message of n bytes: t = alpha + beta n (the note's "C/B + L")."""
    check_sizes("n_bytes", n_bytes), check_sizes("alpha", alpha), check_sizes("beta", beta)
    return alpha + beta * torch.as_tensor(n_bytes, dtype=torch.float64)


def fit_alpha_beta(n_bytes, seconds, relative: bool = True) -> tuple[float, float]:
    """Fit t = alpha + beta n. ``relative``: each error divided by its time (small messages fix
    alpha, large ones beta); False: least squares in seconds over every message sent, so that
    their fitted times add up to the measured total (a step's messages, a few of them slow)."""
    n, t = (torch.as_tensor(v, dtype=torch.float64) for v in (n_bytes, seconds))
    check_sizes("n_bytes", n)
    if not torch.isfinite(n).all():
        raise ValueError(f"fitting alpha and beta needs finite message sizes, got {n.tolist()}")
    if not (torch.isfinite(t).all() and (t > 0).all()):
        raise ValueError(f"fitting alpha and beta needs times above 0, got {t.tolist()}")
    if (sizes := len(set(n.tolist()))) < 3 or len(n) != len(t):
        raise ValueError(f"fitting alpha and beta needs a time for each size and at least 3 "
                         f"sizes, got {len(t)} times of {sizes} sizes")
    w = 1 / t if relative else torch.ones_like(t)
    fit = torch.linalg.lstsq(torch.stack([w, n * w], dim=1), (t * w).unsqueeze(1)).solution
    alpha, beta = fit.squeeze(1).tolist()
    return max(alpha, 0.0), max(beta, 0.0)


def overlapped_messages(ready, n_bytes, alpha: float, beta: float) -> list[tuple]:
    """Lesson 10's overlap model: messages (gradient buckets) become ready at ``ready`` seconds
    and go one at a time over one link, each taking alpha + beta n. Returns each message's
    (start, end): a message starts when it is ready and the previous one has gone."""
    ready, n_bytes = [float(t) for t in ready], [float(n) for n in n_bytes]
    for name, value in (("n_bytes", n_bytes or 0), ("alpha", alpha), ("beta", beta)):
        check_sizes(name, value)
    if not all(math.isfinite(float(t)) for t in ready) or len(ready) != len(n_bytes):
        raise ValueError(f"one finite ready time per message: {len(ready)} ready times for "
                         f"{len(n_bytes)} messages, got {list(ready)}")
    free, out = 0.0, []
    for t, n in sorted(zip(ready, n_bytes, strict=True)):
        start = max(float(t), free)
        free = start + alpha + beta * float(n)
        out.append((start, free))
    return out


def hidden_fraction_model(ready, n_bytes, alpha: float, beta: float, backward: float) -> float:
    """The share of the messages' time that :func:`overlapped_messages` puts before the end of
    the backward pass (at ``backward`` seconds): communication hidden under computation."""
    spans = overlapped_messages(ready, n_bytes, alpha, beta)
    check_sizes("backward", backward)
    total = sum(end - start for start, end in spans)
    if not total > 0:
        raise ValueError("the hidden share needs at least one message that takes time")
    return sum(max(0.0, min(end, backward) - start) for start, end in spans) / total


ALL_REDUCE_ALGORITHMS = ("reduce + broadcast", "all-to-all", "naive ring", "efficient ring")


def all_reduce_bytes(algorithm: str, n_bytes: float, p: int) -> float:
    """Bytes the busiest rank sends in one all-reduce of ``n_bytes`` on p ranks (slides part 3):
    reduce + broadcast and all-to-all (p - 1) n; the naive ring 2n (n for p = 2); the efficient
    ring 2 (p - 1) / p n, almost independent of p."""
    if algorithm not in ALL_REDUCE_ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}: use one of {ALL_REDUCE_ALGORITHMS}")
    n_bytes = check_sizes("n_bytes", n_bytes)
    if check_processes(p) == 1:
        return 0
    return {"reduce + broadcast": (p - 1) * n_bytes, "all-to-all": (p - 1) * n_bytes,
            "naive ring": 2 * n_bytes if p > 2 else n_bytes,
            "efficient ring": 2 * (p - 1) / p * n_bytes}[algorithm]


def ring_all_reduce_time(n_bytes, p: int, alpha: float, beta: float):
    """The efficient ring: 2 (p - 1) messages in sequence, 2 (p - 1) / p n bytes in all:
    2 (p - 1) alpha + 2 (p - 1) / p n beta. A number in, a number out; an array, a tensor."""
    check_sizes("n_bytes", n_bytes), check_sizes("alpha", alpha), check_sizes("beta", beta)
    if isinstance(n_bytes, (int, float)) and check_processes(p):
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes * beta
    n = torch.as_tensor(n_bytes, dtype=torch.float64)
    return 2 * (check_processes(p) - 1) * alpha + 2 * (p - 1) / p * n * beta


def bus_bandwidth(n_bytes: float, seconds: float, p: int, op: str = "all_reduce") -> float:
    """Bus bandwidth in bytes/s as nccl-tests report it: algbw = bytes / time, times 2(p-1)/p
    for all-reduce and (p-1)/p for all-gather and reduce-scatter, to compare across p."""
    factor = {"all_reduce": 2 * (check_processes(p) - 1) / p, "all_gather": (p - 1) / p,
              "reduce_scatter": (p - 1) / p}
    if op not in factor:
        raise ValueError(f"unknown op {op!r}: use one of {sorted(factor)}")
    n_bytes = check_sizes("n_bytes", n_bytes)
    if not np.all(np.asarray(seconds, dtype=float) > 0):
        raise ValueError(f"seconds must be above 0, got {seconds!r}")
    return n_bytes / check_sizes("seconds", seconds) * factor[op]
