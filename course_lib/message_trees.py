"""Who sends to whom in one iteration of a parameter server: a star or a binomial tree.

Lecture note "Parallel computing for empirical risk minimization", section 2: O(dm) words
through the server on a star, O(d log m) rounds on a tree. Rank 0 is the server; the schedules
say which (sender, receiver) messages bring w down to every rank and the gradients back up.
:mod:`course_lib.parameter_server` runs them (and re-exports these names).
"""

from __future__ import annotations

from course_lib.training import check_whole, is_whole

TOPOLOGIES = ("star", "tree")


def broadcast_schedule(p: int, topology: str) -> list[list[tuple[int, int]]]:
    """Rounds of (sender, receiver) messages that bring w from rank 0 to all p ranks.

    Star: the server sends to each worker in turn (its link carries them one after another:
    p - 1 rounds). Tree (binomial): in round k every rank that has w sends it 2^k ranks further,
    so ceil(log2 p) rounds suffice.
    """
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}: use one of {TOPOLOGIES}")
    check_whole("p (ranks)", p)
    if topology == "star":
        return [[(0, r)] for r in range(1, p)]
    rounds, reach = [], 1
    while reach < p:
        rounds.append([(r, r + reach) for r in range(reach) if r + reach < p])
        reach *= 2
    return rounds


def reduce_schedule(p: int, topology: str) -> list[list[tuple[int, int]]]:
    """Rounds that sum every rank's vector into rank 0: the broadcast run backwards."""
    return [[(dst, src) for src, dst in round_]
            for round_ in reversed(broadcast_schedule(p, topology))]


def words_per_iteration(p: int, d: int, topology: str) -> dict:
    """Words (numbers) one synchronous iteration moves, from the schedules: in total, through
    the server's link, and along the critical path (rounds that happen one after another)."""
    check_whole("d (words of w)", d, least=0)
    rounds = broadcast_schedule(p, topology) + reduce_schedule(p, topology)
    messages = [msg for round_ in rounds for msg in round_]
    return dict(total=len(messages) * d,
                server=sum(d for src, dst in messages if 0 in (src, dst)),
                critical_path=len(rounds) * d)


def tree_links(rank: int, p: int, topology: str) -> tuple[int | None, list[int]]:
    """This rank's parent (None for the server) and children, in broadcast order."""
    if not (is_whole(rank) and 0 <= rank < check_whole("p (ranks)", p)):
        raise ValueError(f"rank must be one of the p = {p} ranks, 0 to {p - 1}, got {rank!r}")
    messages = [msg for round_ in broadcast_schedule(p, topology) for msg in round_]
    parent = next((src for src, dst in messages if dst == rank), None)
    return parent, [dst for src, dst in messages if src == rank]
