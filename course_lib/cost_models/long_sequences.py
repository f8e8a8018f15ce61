"""Costs of long sequences and experts in the alpha-beta model: ring attention's passes
(Liu et al. 2023), DeepSpeed-Ulysses' all-to-alls (Jacobs et al. 2023), and expert parallelism's
dispatch and combine (GShard). Part of ``course_lib.cost_models``.

``n_bytes`` is one rank's share of one tensor: tokens / p x heads x head_dim x bytes per number
for attention's q, k, v or output; a rank's whole send buffer for an expert all-to-all."""

import math

from course_lib.cost_models.laws import check_processes, check_sizes
from course_lib.cost_models.messages import alpha_beta_time

CONTEXT_PARALLEL = ("ring", "ulysses")


def all_to_all_time(n_bytes, p: int, alpha: float, beta: float):
    """An all-to-all in which each rank holds ``n_bytes``, a slice of n / p for every rank, sent
    one after the other: (p - 1) (alpha + beta n / p)."""
    n_bytes = check_sizes("n_bytes", n_bytes)
    return (check_processes(p) - 1) * alpha_beta_time(n_bytes / p, alpha, beta)


def ring_attention_time(n_bytes, p: int, alpha: float, beta: float, block_seconds: float = 0.0):
    """One attention layer's forward by ring attention: a rank's k and v (2 n bytes, one message)
    travel p - 1 steps while one block computes (``block_seconds``): the first block, then p - 1
    steps of max(block, alpha + 2 beta n). With no compute, the messages alone."""
    step = alpha_beta_time(2 * check_sizes("n_bytes", n_bytes), alpha, beta)
    check_sizes("block_seconds", block_seconds)
    longer = step.clamp(min=block_seconds) if step.ndim else max(block_seconds, step)  # arrays too
    return block_seconds + (check_processes(p) - 1) * longer


def ulysses_time(n_bytes, p: int, alpha: float, beta: float):
    """One attention layer's forward by Ulysses' messages: q, k and v to heads and the output
    back, four all-to-alls of n bytes each: 4 (p - 1) (alpha + beta n / p)."""
    return 4 * all_to_all_time(n_bytes, p, alpha, beta)


def context_parallel_bytes(n_bytes, p: int, kind: str) -> float:
    """Bytes a rank sends in one attention layer's forward: the ring, 2 (p - 1) n; Ulysses,
    4 (p - 1) n / p. The ring sends p / 2 times Ulysses' bytes."""
    if kind not in CONTEXT_PARALLEL:
        raise ValueError(f"kind must be one of {CONTEXT_PARALLEL}, got {kind!r}")
    p, n_bytes = check_processes(p), check_sizes("n_bytes", n_bytes)
    return 2 * (p - 1) * n_bytes if kind == "ring" else 4 * (p - 1) * n_bytes / p


def ring_ulysses_crossover(p: int, alpha: float, beta: float) -> float:
    """The share n (bytes) above which Ulysses' messages take less time than the ring's: the ring
    sends p - 1 messages of 2 n, Ulysses 4 (p - 1) of n / p, equal at n = 3 alpha / (beta
    (2 - 4 / p)). On two ranks the ring is never slower: infinity."""
    p, alpha, beta = check_processes(p), check_sizes("alpha", alpha), check_sizes("beta", beta)
    return math.inf if p <= 2 or beta == 0 else 3 * alpha / (beta * (2 - 4 / p))


def expert_parallel_time(n_bytes, p: int, alpha: float, beta: float):
    """One mixture-of-experts layer's forward: dispatch and combine, two all-to-alls of a rank's
    capacity-padded buffer (E x capacity x d_model numbers, ``n_bytes``)."""
    return 2 * all_to_all_time(n_bytes, p, alpha, beta)
