"""Checks for lesson 9's exercises: secure aggregation that survives clients dropping out, and
how many attackers a round of this run's federation held against what the trimmed mean and the
median tolerate (a federation whose numbers every run of the notebook draws afresh).

Slides "Parallel computing for machine learning", part 4: direction 2 (privacy; secure
aggregation with pairwise masks, Bonawitz et al. 2017) and direction 3 (robustness: Byzantine-
tolerant aggregation, Yin et al. 2018). Each check is a probe (runs in the student's kernel,
returns plain data) and a judge (decides from the data; the grader runs it outside the kernel):
see :mod:`course_lib.exercises.common`. The unmasking's judge draws its cases itself and takes only
the sums from the data (:mod:`course_lib.exercises.cases`).
"""

from __future__ import annotations

import numpy as np
import torch

from course_lib import federated as fl
from course_lib import fl_security as sec
from course_lib.exercises import practice
from course_lib.exercises.cases import merged
from course_lib.exercises.common import (
    ExerciseFailed,
    check_drawn,
    checked,
    grading_seed,
    hidden_seed,
    is_number,
    is_whole,
    judge_cases,
)

# -- exercise 1: unmasking the sum when clients dropped out after masking -----------------------


def _unmask_cases(seed) -> list[dict]:
    """The visible cases: two dropped clients in the middle, the first client dropped, nobody
    dropped (the masks cancel by themselves), all but one dropped; a graded run adds cases drawn
    at random for that run."""
    cases = [dict(clients=8, d=30, dropped=[2, 5], seed=7, update_seed=0),
             dict(clients=5, d=10, dropped=[0], seed=1, update_seed=1),
             dict(clients=6, d=20, dropped=[], seed=2, update_seed=2),
             dict(clients=4, d=5, dropped=[0, 1, 3], seed=3, update_seed=3)]
    if seed is not None:
        rng = np.random.default_rng(seed)
        for _ in range(6):
            clients = int(rng.integers(2, 13))
            dropped = rng.choice(clients, int(rng.integers(0, clients)), replace=False)
            cases.append(dict(clients=clients, d=int(rng.integers(1, 41)),
                              dropped=sorted(dropped.tolist()), seed=int(rng.integers(10**6)),
                              update_seed=int(rng.integers(10**6)), hidden=True))
    return cases


def _inputs(case):
    """What the server receives: one masked update per sender, drawn as it arrives (the masks
    hide every update's own value, so a row is a draw of the same size as a mask), and the
    senders. Nothing here holds the true updates: they are the rows less the senders' masks, which
    is what the student works out (a function that reads this case's seeds can only draw the
    same rows again)."""
    g = torch.Generator().manual_seed(case["update_seed"])
    senders = [k for k in range(case["clients"]) if k not in case["dropped"]]
    scale = sec.pairwise_masks(case["clients"], case["d"], case["seed"]).abs().mean()
    received = torch.randn(len(senders), case["d"], generator=g, dtype=torch.float64)
    return senders, received * float(scale if scale > 0 else 1.0)


def _true_sum(case, senders, received) -> torch.Tensor:
    """The judge's reference: the senders' true updates summed (each row less its mask)."""
    masks = sec.pairwise_masks(case["clients"], case["d"], case["seed"])
    return (received - masks[senders]).sum(dim=0)


def _probe_unmask(unmask_sum) -> dict:
    out = []
    for case in _unmask_cases(hidden_seed()):
        senders, received = _inputs(case)
        got = unmask_sum(received.clone(), list(senders), case["clients"], case["seed"])
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (case["d"],):
            raise ExerciseFailed(f"return a tensor of shape ({case['d']},): one sum of the "
                                 f"senders' updates, d = received.shape[1] numbers")
        out.append(dict(case=case, got=got.double()))
    return {"cases": out}


def _judge_unmask_case(case, got) -> str | None:
    senders, received = _inputs(case)
    right = _true_sum(case, senders, received)  # what the masks hid: the senders' own updates
    if not isinstance(got, torch.Tensor) or got.shape != right.shape:
        return f"return a tensor of shape ({case['d']},)"
    got = got.double()
    if torch.allclose(got, right, rtol=0, atol=1e-6):
        return None
    where = (f" ({case['clients']} clients, dropped {case['dropped']}, "
             f"seed {case['seed']})")
    left = received.sum(dim=0) - right  # the masks that did not cancel
    if torch.allclose(got, right + left, rtol=0, atol=1e-6):
        return (f"that is the plain sum of what arrived{where}: the masks the senders share with "
                f"the dropped clients have no partner left to cancel them; remove them")
    if torch.allclose(got, right + 2 * left, rtol=0, atol=1e-6):
        return (f"the leftover masks doubled instead of vanishing{where}: client i added m_ij "
                f"for j > i and subtracted m_ji for j < i; undo that with the opposite signs")
    return f"off by up to {(got - right).abs().max().item():.3g}{where}"


def _judge_unmask(data) -> str:
    own = {"cases": [{"case": case} for case in _unmask_cases(hidden_seed())]}
    data = merged(own, data, ("got",))  # the cases drawn here, not read
    judge_cases(data["cases"], lambda item: _judge_unmask_case(item["case"], item["got"]))
    return (f"correct: the senders' sum recovered to 1e-6 in all {len(data['cases'])} cases, "
            f"with and without dropped clients")


check_unmask_sum = checked("lesson09.unmask_sum", _probe_unmask, _judge_unmask)
check_unmask_sum.__doc__ = """Check ``unmask_sum(received, senders, clients, seed)``: the sum of
the senders' true updates from their masked updates (masks of ``sec.pairwise_masks(clients, d,
seed)``), when the clients not in ``senders`` dropped out after masking."""


# -- exercise 2: the attackers a round tolerates, and the rounds of this run that had more --------
# The federation's numbers (clients per round m, trim, attackers' share and seed) are drawn in
# the notebook (a practice draw; the grader's run draws its own): the judge recomputes the answer.

CLIENTS = 20  # section 5's federation: pt.iid(..., 20)
LESSON_ROUNDS, LESSON_SEEDS = 12, [0, 1, 2]  # section 5's ROUNDS and SEEDS


@practice.practised
def draw_federation(rng) -> tuple[int, float, float, int]:
    """Exercise 2's federation: m (5-15 clients per round, of 20), trim (0.1-0.4), attackers'
    share (0.2-0.4) and attack seed (below 10**6): ``common.drawn("lesson09.federation",
    draw_federation)`` in the notebook (a practice draw; the grader's run draws its own)."""
    m = int(rng.integers(5, 16))
    trim = float(rng.choice([0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4]))
    share = float(rng.choice([0.2, 0.25, 0.3, 0.35, 0.4]))
    return m, trim, share, int(rng.integers(10**6))


def _probe_breakdown(breakdown, m, trim, share, attack_seed, rounds, seeds) -> dict:
    """``breakdown``: {"trimmed mean": [b, over], "median": [b, over]}; ``m``, ``trim``,
    ``share``, ``attack_seed``: what the exercise cell drew; ``rounds`` and ``seeds``: section
    5's ROUNDS and SEEDS."""
    return {"breakdown": breakdown, "m": m, "trim": trim, "share": share,
            "attack_seed": attack_seed, "rounds": rounds, "seeds": list(seeds)}


def _attackers_per_round(m: int, share: float, attack_seed: int, rounds: int,
                         seeds) -> list[int]:
    """How many attackers each round drew, seed after seed: section 5's sampler with m of the
    CLIENTS per round, and a ``share`` of them attackers (seed s + attack_seed). The student
    edition of the library leaves this out: it is the exercise's count."""
    ### BEGIN SOLUTION
    out = []
    for s in seeds:
        attackers = set(sec.fraction_attackers(range(CLIENTS), share, seed=s + attack_seed))
        out += [len(attackers & set(fl.sample_clients(CLIENTS, m / CLIENTS, s, r)))
                for r in range(rounds)]
    return out
    ### END SOLUTION


def _judge_breakdown(data) -> str:
    answer, rounds, seeds = data["breakdown"], data["rounds"], data["seeds"]
    m, trim, share, attack_seed = data["m"], data["trim"], data["share"], data["attack_seed"]
    check_drawn("lesson09.federation", draw_federation, [m, trim, share, attack_seed])
    if not is_whole(rounds) or not 1 <= rounds <= 1000 or not 1 <= len(seeds) <= 100 or \
            not all(is_whole(s) for s in seeds):
        raise ExerciseFailed("pass section 5's ROUNDS and SEEDS")
    if grading_seed() is not None and (rounds, list(seeds)) != (LESSON_ROUNDS, LESSON_SEEDS):
        raise ExerciseFailed("pass section 5's ROUNDS and SEEDS (one round and one seed make "
                             "the count a guess)")
    if not (is_whole(m) and 2 <= m <= CLIENTS and is_number(trim) and 0 <= trim < 0.5 and
            2 * int(trim * m) < m and is_number(share) and 0 < share < 1 and
            is_whole(attack_seed) and attack_seed >= 0):
        raise ExerciseFailed("pass the m, trim, share and attack seed that the exercise cell "
                             "drew (my_m, my_trim, my_share, my_attack_seed)")
    m, attack_seed = int(m), int(attack_seed)
    rule = ("give breakdown = {\"trimmed mean\": [attackers, rounds], \"median\": [attackers, "
            "rounds]} with whole numbers")
    if not isinstance(answer, dict) or set(answer) != {"trimmed mean", "median"}:
        raise ExerciseFailed(rule)
    if not all(isinstance(v, (list, tuple)) and len(v) == 2 and all(map(is_whole, v))
               for v in answer.values()):
        raise ExerciseFailed(rule)
    try:
        tolerated = _tolerated(m, trim)
        drawn = _attackers_per_round(m, share, attack_seed, int(rounds), [int(s) for s in seeds])
    except NotImplementedError:  # the student edition: the practice draw's digests
        case = [m, trim, share, attack_seed, int(rounds), [int(s) for s in seeds]]
        return practice.judge("lesson09.federation", case, {
            f"{name}, {what}": int(value) for name, pair in answer.items()
            for what, value in zip(("attackers", "rounds"), pair, strict=True)})
    # what a wrong answer missed: the student edition of the library leaves it out
    ### BEGIN SOLUTION
    where = (f" ({len(seeds)} seeds x {int(rounds)} rounds of m = {m} clients, {share:.0%} "
             f"attackers, attack seed {attack_seed})")
    for name, (b, over) in answer.items():
        if int(b) != tolerated[name]:
            picture = (f"drops int({trim} m) values at each end of a coordinate"
                       if name == "trimmed mean" else
                       "of an even number of values is the mean of the two middle ones")
            raise ExerciseFailed(
                f"{name}: {int(b)} attackers per round is not what it tolerates with this run's "
                f"m = {m} clients (trim {trim}). It {picture}: put all the attackers' values "
                f"above every honest one and find the most that cannot move it outside the "
                f"honest values. Compute it from my_m and my_trim: every run draws new ones")
        right = sum(a > tolerated[name] for a in drawn)
        if int(over) != right:
            if int(over) == sum(a >= tolerated[name] for a in drawn):
                hint = f"you also counted rounds with exactly {tolerated[name]}, which it survives"
            elif int(over) in (sum(a > tolerated[name] for a in drawn[:int(rounds)]),
                               sum(a >= tolerated[name] for a in drawn[:int(rounds)])):
                hint = "count the rounds of every seed"
            else:
                hint = ("compute it in code from this run's draw; for each seed s: the "
                        "attackers are sec.fraction_attackers(clients, my_share, seed=s + "
                        "my_attack_seed), and round r's clients "
                        "fl.sample_clients(len(clients), my_m / len(clients), s, r)")
            raise ExerciseFailed(f"{name}: {int(over)} is not the number of rounds with more "
                                 f"than {int(b)} attackers{where}: {hint}")
    return (f"correct: with m = {m} (trim {trim}) the trimmed mean tolerates "
            f"{tolerated['trimmed mean']} and the median {tolerated['median']} attackers; "
            f"{answer['trimmed mean'][1]} and {answer['median'][1]} of the {len(drawn)} rounds "
            f"with {share:.0%} attackers had more")
    ### END SOLUTION


def _tolerated(m: int, trim: float) -> dict:
    """The most attackers per round each rule tolerates with m clients. The student edition of
    the library leaves this out: it is the exercise's answer."""
    ### BEGIN SOLUTION
    # the breakdown points by brute force: the most attackers, all beyond every honest value in
    # one coordinate, that leave the rule's result inside the honest values' range
    honest, bad = 0.0, 1e9
    tolerated = {}
    for name, rule_fn in (("trimmed mean", lambda u: sec.trimmed_mean(u, trim=trim)),
                          ("median", sec.coordinate_median)):
        tolerated[name] = max(b for b in range(m) if
                              rule_fn(torch.tensor([[bad]] * b + [[honest]] * (m - b))) < 1)
    return tolerated
    ### END SOLUTION


def _practice_answers(case) -> dict:
    m, trim, share, attack_seed, rounds, seeds = case
    tolerated, drawn = _tolerated(m, trim), _attackers_per_round(m, share, attack_seed, rounds,
                                                                 seeds)
    return {f"{name}, {what}": [value] for name, b in tolerated.items()
            for what, value in (("attackers", b), ("rounds", sum(a > b for a in drawn)))}


practice.register("lesson09.federation", _practice_answers, draw_federation,
                  [LESSON_ROUNDS, LESSON_SEEDS])
check_breakdown = checked("lesson09.breakdown", _probe_breakdown, _judge_breakdown)
check_breakdown.__doc__ = """Check, for the federation the exercise cell drew (m of the 20
clients per round, a trimmed mean with ``trim``, a ``share`` of attackers drawn with seed
s + ``attack_seed``), the most attackers per round the trimmed mean and the median tolerate, and
in how many rounds of ``rounds`` x ``seeds`` more took part: ``check_breakdown(breakdown, my_m,
my_trim, my_share, my_attack_seed, ROUNDS, SEEDS)``."""
