"""Checks for lesson 9's exercises: secure aggregation that survives clients dropping out, and
how many attackers a round of this run's federation held against what the trimmed mean and the
median tolerate.

Slides "Parallel computing for machine learning", part 4: direction 2 (privacy; secure
aggregation with pairwise masks, Bonawitz et al. 2017) and direction 3 (robustness: Byzantine-
tolerant aggregation, Yin et al. 2018). Each check is a probe (runs in the student's kernel,
returns plain data) and a judge (decides from the data; the grader runs it outside the kernel):
see :mod:`course_lib.exercises.common`.
"""

from __future__ import annotations

import numpy as np
import torch

from course_lib import federated as fl
from course_lib import fl_security as sec
from course_lib.exercises.common import (
    ExerciseFailed,
    HiddenTestFailed,
    checked,
    grading_seed,
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
    """The clients' true updates, and what the server receives: the senders' masked updates."""
    g = torch.Generator().manual_seed(case["update_seed"])
    updates = torch.randn(case["clients"], case["d"], generator=g, dtype=torch.float64) * 0.01
    senders = [k for k in range(case["clients"]) if k not in case["dropped"]]
    masked = updates + sec.pairwise_masks(case["clients"], case["d"], case["seed"])
    return updates, senders, masked[senders]


def _probe_unmask(unmask_sum) -> dict:
    out = []
    for case in _unmask_cases(grading_seed()):
        _, senders, received = _inputs(case)
        got = unmask_sum(received.clone(), list(senders), case["clients"], case["seed"])
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (case["d"],):
            raise ExerciseFailed(f"return a tensor of shape ({case['d']},): one sum of the "
                                 f"senders' updates, d = received.shape[1] numbers")
        out.append(dict(case=case, got=got.double()))
    return {"cases": out}


def _judge_unmask_case(case, got) -> str | None:
    updates, senders, received = _inputs(case)
    right = updates[senders].sum(dim=0)  # what the masks hid: the senders' own updates
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
    hidden = False
    for item in data["cases"]:
        wrong = _judge_unmask_case(item["case"], item["got"])
        if wrong and item["case"].get("hidden"):
            hidden = True
        elif wrong:
            raise ExerciseFailed(wrong)
    if hidden:
        raise HiddenTestFailed("a hidden case failed")
    return (f"correct: the senders' sum recovered to 1e-6 in all {len(data['cases'])} cases, "
            f"with and without dropped clients")


check_unmask_sum = checked("lesson09.unmask_sum", _probe_unmask, _judge_unmask)
check_unmask_sum.__doc__ = """Check ``unmask_sum(received, senders, clients, seed)``: the sum of
the senders' true updates from their masked updates (masks of ``sec.pairwise_masks(clients, d,
seed)``), when the clients not in ``senders`` dropped out after masking."""


# -- exercise 2: the attackers a round tolerates, and the rounds of this run that had more --------

CLIENTS, FRACTION, SHARE, TRIM = 20, 0.5, 0.3, 0.2  # section 5's federation; its largest share


def _probe_breakdown(breakdown, rounds, seeds) -> dict:
    """``breakdown``: {"trimmed mean": [b, over], "median": [b, over]}; ``rounds`` and ``seeds``:
    section 5's ROUNDS and SEEDS."""
    return {"breakdown": breakdown, "rounds": rounds, "seeds": list(seeds)}


def _attackers_per_round(rounds: int, seeds) -> list[int]:
    """How many attackers each round of section 5's runs drew, seed after seed."""
    out = []
    for s in seeds:
        attackers = set(sec.fraction_attackers(range(CLIENTS), SHARE, seed=s + 1))
        out += [len(attackers & set(fl.sample_clients(CLIENTS, FRACTION, s, r)))
                for r in range(rounds)]
    return out


def _whole(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and v == int(v)


def _judge_breakdown(data) -> str:
    answer, rounds, seeds = data["breakdown"], data["rounds"], data["seeds"]
    if not _whole(rounds) or rounds < 1 or not seeds or not all(_whole(s) for s in seeds):
        raise ExerciseFailed("pass section 5's ROUNDS and SEEDS")
    rule = ("give breakdown = {\"trimmed mean\": [attackers, rounds], \"median\": [attackers, "
            "rounds]} with whole numbers")
    if not isinstance(answer, dict) or set(answer) != {"trimmed mean", "median"}:
        raise ExerciseFailed(rule)
    if not all(isinstance(v, (list, tuple)) and len(v) == 2 and all(map(_whole, v))
               for v in answer.values()):
        raise ExerciseFailed(rule)
    m = max(1, round(FRACTION * CLIENTS))  # clients per round, as fl.sample_clients draws them
    # the breakdown points by brute force: the most attackers, all beyond every honest value in
    # one coordinate, that leave the rule's result inside the honest values' range
    honest, bad = 0.0, 1e9
    tolerated = {}
    for name, rule_fn in (("trimmed mean", lambda u: sec.trimmed_mean(u, trim=TRIM)),
                          ("median", sec.coordinate_median)):
        tolerated[name] = max(b for b in range(m) if
                              rule_fn(torch.tensor([[bad]] * b + [[honest]] * (m - b))) < 1)
    drawn = _attackers_per_round(int(rounds), [int(s) for s in seeds])
    where = f" ({len(seeds)} seeds x {int(rounds)} rounds of {m} clients, 30% attackers)"
    for name, (b, over) in answer.items():
        if int(b) != tolerated[name]:
            picture = ("drops int(0.2 m) values at each end of a coordinate"
                       if name == "trimmed mean" else
                       "of an even number of values is the mean of the two middle ones")
            raise ExerciseFailed(
                f"{name}: {int(b)} attackers per round is not what it tolerates with m = {m} "
                f"clients. It {picture}: put all the attackers' values above every honest one "
                f"and find the most that cannot move it outside the honest values")
        right = sum(a > tolerated[name] for a in drawn)
        if int(over) != right:
            if int(over) == sum(a >= tolerated[name] for a in drawn):
                hint = f"you also counted rounds with exactly {tolerated[name]}, which it survives"
            elif int(over) in (sum(a > tolerated[name] for a in drawn[:int(rounds)]),
                               sum(a >= tolerated[name] for a in drawn[:int(rounds)])):
                hint = "count the rounds of every seed"
            else:
                hint = ("for each seed s: the attackers are sec.fraction_attackers(clients, 0.3, "
                        "seed=s + 1), and round r's clients fl.sample_clients(len(clients), 0.5, "
                        "s, r)")
            raise ExerciseFailed(f"{name}: {int(over)} is not the number of rounds with more "
                                 f"than {int(b)} attackers{where}: {hint}")
    return (f"correct: the trimmed mean tolerates {tolerated['trimmed mean']} and the median "
            f"{tolerated['median']} attackers of {m}; {answer['trimmed mean'][1]} and "
            f"{answer['median'][1]} of the {len(drawn)} rounds had more")


check_breakdown = checked("lesson09.breakdown", _probe_breakdown, _judge_breakdown)
check_breakdown.__doc__ = """Check, for section 5's sign flip with 30% attackers, the most
attackers per round the trimmed mean (trim 0.2) and the median tolerate, and in how many rounds
of the run more took part: ``check_breakdown(breakdown, ROUNDS, SEEDS)``."""
