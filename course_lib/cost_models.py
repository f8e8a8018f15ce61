"""Every closed-form prediction of the course, in one vocabulary, and the fits of their constants.

Each lesson puts a measurement next to a formula from here. One vocabulary throughout:

* ``p``: the processes taking part (the lecture note's workers m, a pipeline's stages, ZeRO's
  N_d, the ranks of a collective), at least 1 (:func:`check_processes` refuses less);
* ``n_bytes``: the size of one message or vector; ``d``: the numbers (words) in a model;
* ``alpha`` (seconds per message) and ``beta`` (seconds per byte): the alpha-beta model of one
  message, t = alpha + beta n;
* ``f``: the parallel fraction of a program; ``micro_batches``: a pipeline's m;
* ``psi``: a model's parameter count (ZeRO's Psi).

Sources: the lecture note on parallel ERM (section 2.4), slides parts 1-3; Amdahl, Gustafson,
GPipe, Megatron-LM, ZeRO, nccl-tests."""

import math

import numpy as np
import torch


def check_processes(p, name: str = "p"):
    """``p`` itself, if it is (or every entry of it is) a number of processes, at least 1."""
    if not (isinstance(p, (int, float)) and not isinstance(p, bool) and p >= 1) and not (
            np.size(p) and (np.asarray(p, dtype=float) >= 1).all()):
        raise ValueError(f"{name} (the number of processes) must be at least 1, got {p!r}")
    return p


# -- speedup -------------------------------------------------------------------------------------


def amdahl_speedup(p, f: float):
    """Strong scaling (fixed total work): S(p) = 1 / ((1 - f) + f / p)."""
    p = np.asarray(check_processes(p), dtype=float)
    return 1.0 / ((1.0 - f) + f / p)


def gustafson_speedup(p, f: float):
    """Weak scaling (work grows with p): S(p) = (1 - f) + f p."""
    return (1.0 - f) + f * np.asarray(check_processes(p), dtype=float)


def fit_amdahl(p, speedups) -> float:
    """Least-squares f in [0, 1] for Amdahl's law; 1/S = 1 - f (1 - 1/p) is linear in f."""
    p, s = np.asarray(p, dtype=float), np.asarray(speedups, dtype=float)
    if p.shape != s.shape or p.size == 0:
        raise ValueError("p and speedups must be non-empty and of the same length")
    x = 1.0 - 1.0 / check_processes(p)
    if not np.any(x > 0):
        return 1.0  # one process only: nothing to fit
    return float(np.clip(np.dot(x, 1.0 - 1.0 / s) / np.dot(x, x), 0.0, 1.0))


def fit_gustafson(p, speedups) -> float:
    """Least-squares f in [0, 1] for Gustafson's law; S - 1 = f (p - 1) is linear in f."""
    p, s = np.asarray(p, dtype=float), np.asarray(speedups, dtype=float)
    if p.shape != s.shape or p.size == 0:
        raise ValueError("p and speedups must be non-empty and of the same length")
    x = check_processes(p) - 1.0
    if not np.any(x > 0):
        return 1.0  # one process only: nothing to fit
    return float(np.clip(np.dot(x, s - 1.0) / np.dot(x, x), 0.0, 1.0))


def probability_any_fails(p, q: float):
    """P(at least one of p independent workers fails), each with probability q: 1 - (1 - q)^p
    (lecture note, section 2.4: the straggler effect)."""
    return 1.0 - (1.0 - q) ** torch.as_tensor(check_processes(p), dtype=torch.float64)


def bulk_synchronous_timeline(compute_seconds, communication: float, iterations: int = 3):
    """The model of bulk-synchronous iterations (slides part 1: everyone waits for the slowest
    worker): worker k computes for ``compute_seconds[k]``, idles until the slowest is done, then
    all communicate for ``communication`` seconds. Returns Gantt spans."""
    from course_lib.runtime.timing import Span

    check_processes(len(compute_seconds), "len(compute_seconds)")
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


def alpha_beta_time(n_bytes, alpha: float, beta: float):
    """One message of n bytes: t = alpha + beta n (the note's "C/B + L")."""
    return alpha + beta * torch.as_tensor(n_bytes, dtype=torch.float64)


def fit_alpha_beta(n_bytes, seconds, relative: bool = True) -> tuple[float, float]:
    """Fit t = alpha + beta n. ``relative``: each error divided by its time (small messages fix
    alpha, large ones beta); False: least squares in seconds over every message sent, so that
    their fitted times add up to the measured total (a step's messages, a few of them slow)."""
    n, t = (torch.as_tensor(v, dtype=torch.float64) for v in (n_bytes, seconds))
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
    total = sum(end - start for start, end in spans)
    return sum(max(0.0, min(end, backward) - start) for start, end in spans) / total


ALL_REDUCE_ALGORITHMS = ("reduce + broadcast", "all-to-all", "naive ring", "efficient ring")


def all_reduce_bytes(algorithm: str, n_bytes: float, p: int) -> float:
    """Bytes the busiest rank sends in one all-reduce of ``n_bytes`` on p ranks (slides part 3):
    reduce + broadcast and all-to-all (p - 1) n; the naive ring 2n (n for p = 2); the efficient
    ring 2 (p - 1) / p n, almost independent of p."""
    if algorithm not in ALL_REDUCE_ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}: use one of {ALL_REDUCE_ALGORITHMS}")
    if check_processes(p) == 1:
        return 0
    return {"reduce + broadcast": (p - 1) * n_bytes, "all-to-all": (p - 1) * n_bytes,
            "naive ring": 2 * n_bytes if p > 2 else n_bytes,
            "efficient ring": 2 * (p - 1) / p * n_bytes}[algorithm]


def ring_all_reduce_time(n_bytes, p: int, alpha: float, beta: float):
    """The efficient ring: 2 (p - 1) messages in sequence, 2 (p - 1) / p n bytes in all:
    2 (p - 1) alpha + 2 (p - 1) / p n beta. A number in, a number out; an array, a tensor."""
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
    return n_bytes / seconds * factor[op]


def parameter_server_words(p: int, d: int, topology: str) -> int:
    """Words through the server in one synchronous iteration, both ways (lecture note, section
    2): O(dp) on a star, 2 d (p - 1); O(d log p) on a binomial tree, 2 d ceil(log2 p)."""
    check_processes(p)
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
    if mode == "sync":
        return n / (len(c) * batch) * (c.max() + round_trip)
    if mode == "async":
        return n / batch / float(np.sum(1.0 / (c + round_trip)))
    raise ValueError(f"unknown mode {mode!r}: use 'sync' or 'async'")


def async_staleness(p: int, slowdown: float = 1.0) -> float:
    """Typical staleness of an asynchronous gradient with p equally fast workers, p - 1 (each of
    the others pushes once while it computes); for a worker ``slowdown`` times slower than the
    rest, about slowdown (p - 1)."""
    return slowdown * (check_processes(p) - 1)


def federated_bytes_per_round(clients: int, d: int, messages: int = 1,
                              bytes_per_number: int = 4) -> int:
    """A federated round: the model to each of ``clients`` and back, ``messages`` vectors of d
    numbers each way (SCAFFOLD: 2, the model and a control variate)."""
    return 2 * check_processes(clients, "clients") * d * messages * bytes_per_number


def quantized_sum_error_bound(p: int, scale: float, stochastic: bool = True) -> float:
    """Largest error of one entry of a sum of p int8-quantised vectors with step ``scale``: each
    rank's code is off by less than one step (stochastic rounding) or half a step (nearest)."""
    return check_processes(p) * scale * (1.0 if stochastic else 0.5)


# -- model parallelism ---------------------------------------------------------------------------


def bubble_fraction(p: int, micro_batches: int, chunks: int = 1) -> float:
    """Idle fraction of a pipeline flush with p stages (GPipe, 1F1B): (p - 1) / (m + p - 1).
    Interleaved 1F1B with ``chunks`` v model chunks per stage cuts the bubble time v-fold:
    ((p - 1) / v) / (m + (p - 1) / v)."""
    if p < 1 or micro_batches < 1 or chunks < 1:
        raise ValueError(f"need p, micro_batches, chunks >= 1, got {p}, {micro_batches}, {chunks}")
    bubble = (p - 1) / chunks
    return bubble / (micro_batches + bubble)


def pipeline_timeline(p: int, micro_batches: int, schedule: str = "1F1B",
                      forward=1.0, backward=2.0) -> list:
    """A model (not a measurement) of a pipeline run with p stages: every forward takes
    ``forward`` time units, every backward ``backward`` (each a number, or a list of p numbers:
    one per stage, for stages of unequal work), messages are free. A stage runs its schedule
    (``pipeline_schedules.SCHEDULES``) in order; an action starts when the stage is free and its
    input is there (forward i on stage s needs forward i on s - 1; backward i needs backward i
    on s + 1, or on the last stage its own forward i). Returns Gantt spans."""
    from course_lib.pipeline_schedules import SCHEDULES
    from course_lib.runtime.timing import Span

    check_processes(p), check_processes(micro_batches, "micro_batches")

    times = {}
    for kind, value in (("forward", forward), ("backward", backward)):
        times[kind] = list(value) if isinstance(value, (list, tuple)) else [value] * p
        if len(times[kind]) != p:
            raise ValueError(f"{kind} needs one time per stage: {p}, got {len(times[kind])}")
    orders = [SCHEDULES[schedule](s, p, micro_batches) for s in range(p)]
    done, free, position, spans = {}, [0.0] * p, [0] * p, []  # done: (kind, stage, i) -> end
    while any(position[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if position[s] == len(orders[s]):
                continue
            kind, i = orders[s][position[s]]
            if kind == "forward":
                needs = ("forward", s - 1, i) if s > 0 else None
            else:
                needs = ("backward", s + 1, i) if s < p - 1 else ("forward", s, i)
            if needs is not None and needs not in done:
                continue  # its input is not there yet
            start = max(free[s], done.get(needs, 0.0))
            duration = times[kind][s]
            done[(kind, s, i)] = free[s] = start + duration
            spans.append(Span(s, start, duration, kind))
            position[s] += 1
            progressed = True
        if not progressed:  # pragma: no cover - a schedule that waits for itself
            raise RuntimeError(f"{schedule} deadlocks with p={p}, m={micro_batches}")
    return spans


def idle_fraction(spans, lanes: int) -> float:
    """Idle fraction of a timeline of busy spans: 1 - busy / (lanes x makespan)."""
    makespan = max(start + duration for _, start, duration, _ in spans)
    return 1.0 - sum(duration for _, _, duration, _ in spans) / (lanes * makespan)


def megatron_all_reduces(blocks: int = 1) -> dict:
    """Megatron-LM's all-reduces per training step of ``blocks`` tensor-parallel MLP or attention
    blocks: one in the forward pass (g) and one in the backward pass (f) for each."""
    return {"forward": blocks, "backward": blocks}


def megatron_bytes(tokens: int, d_model: int, p: int, blocks: int = 1,
                   bytes_per_number: int = 4) -> float:
    """Bytes each rank sends per step: every all-reduce carries a tokens x d_model activation
    (or its gradient) on the efficient ring."""
    n = tokens * d_model * bytes_per_number
    calls = sum(megatron_all_reduces(blocks).values())
    return calls * all_reduce_bytes("efficient ring", n, p)


ZERO_STAGES = (0, 1, 2, 3)


def zero_bytes_per_rank(psi: float, p: int, stage: int) -> float:
    """Mixed-precision Adam's bytes per rank (ZeRO): baseline 16 Psi; stage 1 shards the optimizer
    state (4 Psi + 12 Psi / p), 2 the gradients (2 Psi + 14 Psi / p), 3 all (16 Psi / p)."""
    if stage not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage must be one of {ZERO_STAGES}, got {stage!r}")
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / check_processes(p), 2: 2 * psi + 14 * psi / p,
            3: 16 * psi / p}[stage]
