"""Checks for lesson 3's exercises: recursive-doubling all-reduce with point-to-point messages,
and the message size at which the ring overtakes it, from this run's alpha-beta fit.

Slides part 3 (all-reduce; the alpha-beta cost of the efficient ring). ``course_lib.collectives``
has four all-reduces but not recursive doubling, so the first exercise is not a transcription.
Each check is a probe (runs in the student's kernel, returns plain data) and a judge (decides
from the data; the grader runs it outside the kernel): see :mod:`course_lib.exercises.common`.
The all-reduce's judge draws every rank's vectors itself and takes only what the ranks returned
and sent from the data (:mod:`course_lib.exercises.cases`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings

import torch
import torch.distributed as dist

from course_lib.exercises import practice
from course_lib.exercises.cases import merged
from course_lib.exercises.common import (
    ExerciseFailed,
    HiddenTestFailed,
    checked,
    drawn,
    grading_seed,
    hidden_seed,
    is_number,
)

# -- Exercise 1: recursive doubling -----------------------------------------------------------


@contextlib.contextmanager
def _counting_sends():
    """Within it, every ``send``/``isend`` of this process (batched ones too) appends
    [peer, numel] to the yielded list: the judge reads the algorithm off its messages. Both
    names are patched where torch looks them up (``P2POp`` accepts only the module's own)."""
    import torch.distributed.distributed_c10d as c10d

    sent = []
    originals = {name: getattr(c10d, name) for name in ("send", "isend")}

    def counted(original):
        @functools.wraps(original)
        def wrapper(tensor, dst=None, *args, **kwargs):
            peer = dst if dst is not None else kwargs.get("group_dst")
            sent.append([peer, tensor.numel()])
            return original(tensor, dst, *args, **kwargs)
        return wrapper

    for name, original in originals.items():
        setattr(c10d, name, counted(original))
        setattr(dist, name, getattr(c10d, name))
    try:
        yield sent
    finally:
        for name, original in originals.items():
            setattr(c10d, name, original)
            setattr(dist, name, original)


def _vector(seed: int, case: int, rank: int, n: int) -> torch.Tensor:
    """What ``rank`` puts in for vector ``case`` (of ``n`` numbers) of a launch: ``seed`` is 0
    for the visible launches, the hidden seed for the hidden ones."""
    g = torch.Generator().manual_seed(seed * 7919 + 101 * case + rank)
    return torch.randn(n, generator=g, dtype=torch.float64)


def _run_all_reduce(all_reduce, lengths, seed):
    """On every rank: the student's all-reduce of a random float64 vector of each length; what
    each rank put in, got back and sent."""
    rank, out = dist.get_rank(), []
    for case, n in enumerate(lengths):
        x = _vector(seed, case, rank, n)
        with _counting_sends() as sent:
            result = all_reduce(x.clone())
        if isinstance(result, torch.Tensor):
            result = result.detach().cpu().double()
        else:
            result = type(result).__name__
        out.append({"x": x, "result": result, "sent": sent})
    return out


def runs_for(seed) -> dict:
    """(ranks, lengths) per launch: visible 4 ranks with uneven lengths, and 2; a graded run
    adds 8 ranks and other lengths."""
    plan = {"visible": [(4, [7, 1, 16]), (2, [5])]}
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        plan["hidden"] = [(8, torch.randint(1, 40, (2,), generator=g).tolist()),
                          (4, torch.randint(1, 40, (2,), generator=g).tolist())]
    return plan


def probe_doubling(all_reduce, timeout: float = 60) -> dict:
    from course_lib import launch

    seed, data = hidden_seed(), {}
    for kind, runs in runs_for(seed).items():
        data[kind] = []
        for p, lengths in runs:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # oversubscribed: on purpose
                    ranks = launch(_run_all_reduce, world_size=p, timeout=timeout,
                                   args=(all_reduce, lengths, seed if kind == "hidden" else 0))
            except Exception as error:  # a rank raised, or the ranks waited for each other
                if kind == "hidden":
                    data[kind].append({"p": p, "failed": True})
                    continue
                raise ExerciseFailed(f"on {p} ranks: {type(error).__name__}: {error}") from None
            data[kind].append({"p": p, "failed": False, "ranks": ranks})
    return data


def _judge_run(run, seed) -> str | None:
    """What is wrong on one launch (``p`` and ``lengths`` drawn by the judge, the ranks' results
    from the data), or None."""
    p, lengths, ranks = run["p"], run["lengths"], run.get("ranks")
    if run["failed"]:
        return "it failed"
    if not (isinstance(ranks, list) and len(ranks) == p and all(
            isinstance(r, list) and len(r) == len(lengths) and all(
                isinstance(c, dict) and {"result", "sent"} <= set(c) for c in r)
            for r in ranks)):
        return f"on {p} ranks: expected what each rank returned and sent, for each vector"
    partners = {r: sorted(r ^ (1 << k) for k in range(p.bit_length() - 1)) for r in range(p)}
    for case, n in enumerate(lengths):
        xs = [_vector(seed, case, rank, n) for rank in range(p)]
        total = torch.stack(xs).sum(dim=0)
        where = f"on {p} ranks, a vector of {n}"
        for rank, r in enumerate(ranks):
            got = r[case]["result"]
            if not isinstance(got, torch.Tensor):
                return f"{where}: rank {rank} returned a {got}: return the summed tensor"
            if got.shape != total.shape:
                return (f"{where}: rank {rank} returned shape {tuple(got.shape)}, not "
                        f"{tuple(total.shape)}")
            if not torch.allclose(got, total, rtol=1e-12, atol=1e-12):
                if torch.allclose(got, xs[rank], rtol=1e-12, atol=1e-12):
                    return f"{where}: rank {rank} returned its own vector, not the sum"
                if p > 2 and torch.allclose(got, xs[rank] + xs[rank ^ 1], rtol=1e-12,
                                            atol=1e-12):
                    return (f"{where}: rank {rank} holds only its pair's sum (ranks {rank} and "
                            f"{rank ^ 1}): go on, step k with rank XOR 2^k, until 2^k = p")
                return (f"{where}: rank {rank} is off the sum by "
                        f"{(got - total).abs().max().item():.3g}")
        for rank, r in enumerate(ranks):
            peers = sorted(peer for peer, _ in r[case]["sent"])
            sizes = [size for _, size in r[case]["sent"]]
            if not sizes:
                return (f"{where}: the sum is right, but rank {rank} sent no message: write it "
                        f"with dist.isend / dist.recv, not with a collective")
            if peers != partners[rank] or any(size != n for size in sizes):
                return (f"{where}: the sum is right, but rank {rank} sent {len(sizes)} "
                        f"message(s) of {sizes} numbers to ranks {peers}; recursive doubling "
                        f"sends log2 p = {len(partners[rank])}, each the whole vector ({n}), to "
                        f"ranks {partners[rank]} (rank XOR 2^k)")
    return None


def judge_doubling(data) -> str:
    seed = hidden_seed()
    own = {kind: [{"p": p, "lengths": lengths} for p, lengths in runs]
           for kind, runs in runs_for(seed).items()}
    data = merged(own, data, ("failed",), optional=("ranks",))  # the inputs drawn here
    for run in data["visible"]:  # fixed vectors; the hidden launches' come from the seed
        wrong = _judge_run(run, 0)
        if wrong:
            raise ExerciseFailed(wrong)
    if any(_judge_run(run, seed) for run in data.get("hidden", [])):
        raise HiddenTestFailed("a hidden case failed")
    return ("correct: every rank holds the sum on 4 and 2 ranks, after log2 p exchanges of the "
            "whole vector with rank XOR 2^k")


check_doubling_all_reduce = checked("lesson03.doubling_all_reduce", probe_doubling,
                                    judge_doubling)
check_doubling_all_reduce.__doc__ = """Check ``all_reduce(tensor, group=None)``, recursive doubling
(called with no group, so on all ranks): run on 4 and 2 ranks, every rank must return the sum,
having sent log2 p messages of the whole vector, to rank XOR 1, XOR 2, ..."""


# -- Exercise 2: where the ring overtakes recursive doubling ------------------------------------


def draw_ranks(rng) -> int:
    """Exercise 2's p (``common.drawn("lesson03.ranks", draw_ranks)`` in the notebook): 8, whose
    answer the student edition's digests hold, except in a graded run: a power of two from 128
    to 2**20, whose answers no digest holds (one digest per p could be searched bin by bin)."""
    return 8 if grading_seed() is None else int(2 ** rng.integers(7, 21))


def _probe_crossover(n_cross, alpha_msg, beta_msg, ranks) -> dict:
    """``n_cross``: the student's size in bytes; ``alpha_msg``, ``beta_msg``: this run's
    per-message constants of the ring's fit; ``ranks``: p."""
    return {"answer": n_cross, "alpha": float(alpha_msg), "beta": float(beta_msg),
            "p": int(ranks)}


def _judge_crossover(data) -> str:
    answer, alpha, beta, p = data["answer"], data["alpha"], data["beta"], data["p"]
    if not is_number(answer):
        raise ExerciseFailed(f"give n_cross as a number of bytes, not {answer!r}")
    if p < 4 or p & (p - 1):
        raise ExerciseFailed(f"recursive doubling needs p a power of two, at least 4; got {p}")
    if grading_seed() is not None and p != (want := drawn("lesson03.ranks", draw_ranks)):
        raise ExerciseFailed(f"RANKS is {p}, but this run drew {want}: compute n_cross for the "
                             f"RANKS that the cell before the exercise draws")
    if not (alpha > 0 and beta > 0 and math.isfinite(alpha) and math.isfinite(beta)):
        raise ExerciseFailed(f"pass this run's alpha_msg and beta_msg (positive), not "
                             f"{alpha!r}, {beta!r}")
    if answer <= 0:
        raise ExerciseFailed(f"n_cross = {answer:.4g} bytes: a message size is positive")
    try:
        ring, doubling = _costs(p, alpha, beta)
    except NotImplementedError:  # the student edition: the practice case's digests
        return practice.judge("lesson03.crossover_size", [p],
                              {"n_cross": _ratio_bin(answer * beta / alpha)}, {"n_cross": answer})
    right = crossing(p, alpha, beta)
    if abs(answer - right) <= 0.01 * right:
        return (f"correct: on {p} ranks the ring and recursive doubling cost the same at "
                f"{right / 1e3:.4g} kB: smaller messages are faster by recursive doubling "
                f"(fewer messages), larger ones by the ring (fewer bytes)")
    for unit, factor in (("kB", 1e3), ("KiB", 2 ** 10), ("MB", 1e6), ("MiB", 2 ** 20)):
        if abs(answer * factor - right) <= 0.01 * right:
            raise ExerciseFailed(f"that looks like the size in {unit}: give it in bytes")
    faster = "the ring" if ring(answer) < doubling(answer) else "recursive doubling"
    raise ExerciseFailed(
        f"at n = {answer:.4g} bytes on {p} ranks the ring takes {ring(answer) * 1e3:.4g} ms and "
        f"recursive doubling {doubling(answer) * 1e3:.4g} ms: not equal ({faster} is faster, "
        f"so the crossing is at {'smaller' if faster == 'the ring' else 'larger'} n). The ring "
        f"costs 2 (p - 1) alpha + 2 (p - 1) / p n beta; count recursive doubling's messages "
        f"and their size")


def _costs(p: int, alpha: float, beta: float):
    """The ring's and recursive doubling's all-reduce times, as functions of the size n in
    bytes. The student edition of the library leaves them out: they are the exercise's answer."""
    from course_lib.cost_models import ring_all_reduce_time

    ### BEGIN SOLUTION
    def ring(n):
        return float(ring_all_reduce_time(n, p, alpha, beta))

    def doubling(n):  # log2 p messages, each the whole vector
        return math.log2(p) * (alpha + beta * n)

    return ring, doubling
    ### END SOLUTION


def crossing(p: int, alpha: float, beta: float) -> float:
    """The size in bytes where the two times meet: both are straight lines in n, so where the
    line through two points of each crosses."""
    ring, doubling = _costs(p, alpha, beta)
    scale = alpha / beta
    gap0, gap1 = ring(0) - doubling(0), ring(scale) - doubling(scale)
    return scale * gap0 / (gap0 - gap1)


def _ratio_bin(ratio: float) -> int:
    """The bin of n_cross / (alpha / beta), which depends on p only: 1% wide in log scale."""
    return practice.bin_of(math.log(ratio), math.log(1.01))


practice.register("lesson03.crossover_size", lambda case: {"n_cross": practice.near(
    math.log(crossing(case[0], 1.0, 1.0)), math.log(1.01))}, cases=[[4], [8], [16], [32], [64]])


check_crossover_size = checked("lesson03.crossover_size", _probe_crossover, _judge_crossover)
check_crossover_size.__doc__ = """Check ``n_cross``, the message size in bytes at which the
efficient ring and recursive doubling take the same time on ``ranks`` ranks, by the alpha-beta
model with this run's per-message constants: ``check_crossover_size(n_cross, alpha_msg,
beta_msg, ranks)`` (within a relative 0.01)."""
