"""Checks for lesson 6b's exercises: push-sum gossip on a directed graph over point-to-point
messages, and the number of gossip steps a mixing matrix needs to agree, from its spectrum.

Slides "Parallel computing for machine learning", part 2 (decentralized networks: the notebook's
section 2); push-sum is Kempe et al. 2003, the gossip inside Assran et al.'s Stochastic Gradient
Push (2019); the rate of gossip is Boyd et al. 2006 ("Randomized gossip algorithms"). Each check
is a probe (runs in the student's kernel, returns plain data) and a judge (decides from that data
alone, recomputing every reference; the grader runs it outside the kernel): see
:mod:`course_lib.exercises.common`. Both judges draw their cases themselves and take only the
answers from the data (:mod:`.cases`).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from course_lib import decentralized as dec
from course_lib.exercises import practice
from course_lib.exercises.cases import merged
from course_lib.exercises.common import (
    ExerciseFailed,
    HiddenTestFailed,
    checked,
    hidden_seed,
    launch_checked,
)

# -- exercise 1: push-sum on a directed graph ------------------------------------------------------

WORLD_SIZE, STEPS = 4, 4
PUSH_TOL = 1e-9  # float64; a right step differs from A z only in the order of its additions
VISIBLE_GRAPH = [[1, 2], [2], [3], [0]]  # node i's out-neighbours: 0->1, 0->2, 1->2, 2->3, 3->0


def push_sum_cases(seed) -> dict:
    """Directed graphs (out-neighbour lists) and starting z = (x_i, weight 1) for each node; a
    graded run adds random strongly connected graphs (a random cycle plus random extra arcs)
    with longer vectors."""
    z0 = torch.tensor([[0.0, 8.0, 1.0], [4.0, -4.0, 1.0], [8.0, 2.0, 1.0], [-2.0, 6.0, 1.0]],
                      dtype=torch.float64)
    cases = {"visible": {"outs": VISIBLE_GRAPH, "z0": z0}}
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        hidden = []
        for _ in range(2):
            order = torch.randperm(WORLD_SIZE, generator=g).tolist()
            arcs = {(order[i], order[(i + 1) % WORLD_SIZE]) for i in range(WORLD_SIZE)}
            arcs |= {(i, j) for i in range(WORLD_SIZE) for j in range(WORLD_SIZE)
                     if i != j and torch.rand((), generator=g).item() < 0.3}
            x = torch.randn(WORLD_SIZE, 3, generator=g, dtype=torch.float64)
            outs = [sorted(j for a, j in arcs if a == i) for i in range(WORLD_SIZE)]
            ones = torch.ones(WORLD_SIZE, 1, dtype=x.dtype)  # every weight starts at 1
            hidden.append({"outs": outs, "z0": torch.cat([x, ones], 1)})
        cases["hidden"] = hidden
    return cases


def _push_sum_ranks(step, cases):
    """Runs on every rank: ``STEPS`` calls of the student's step per case, on this node's own z
    (never the others': a node learns them only from messages). Returns z after every step."""
    i = dist.get_rank()
    out = []
    for outs, z0 in cases:
        ins = [j for j in range(len(outs)) if i in outs[j]]
        z, history = z0[i].clone(), []
        for _ in range(STEPS):
            new = step(z.clone(), list(outs[i]), ins)
            if not (isinstance(new, torch.Tensor) and new.shape == z.shape):
                raise TypeError(f"push_sum_step returned {type(new).__name__} "
                                f"{tuple(getattr(new, 'shape', ()))}: return the new z, a tensor "
                                f"of z's shape {tuple(z.shape)}")
            z = new.detach().to("cpu", torch.float64)
            history.append(z.clone())
        out.append(torch.stack(history))
    return out


def _probe_push_sum(push_sum_step, timeout: float = 30) -> dict:
    cases = push_sum_cases(hidden_seed())
    flat = [cases["visible"], *cases.get("hidden", [])]
    per_rank = launch_checked(
        _push_sum_ranks, WORLD_SIZE, (push_sum_step, [(c["outs"], c["z0"]) for c in flat]),
        timeout=timeout, hint="does each node send to its out-neighbours and receive from its "
                              "in-neighbours, posting all before waiting?")
    runs = [c | {"ranks": [r[n] for r in per_rank]} for n, c in enumerate(flat)]
    return {"visible": runs[0], "hidden": runs[1:]} if "hidden" in cases else {"visible": runs[0]}


def push_matrix(outs) -> torch.Tensor:
    """Push-sum's mixing matrix, column stochastic: node i's column gives 1 / (d_i + 1) to itself
    and to each of its d_i out-neighbours (z <- A z, rows of z = nodes)."""
    n = len(outs)
    A = torch.zeros(n, n, dtype=torch.float64)
    for i, neighbours in enumerate(outs):
        for j in {i, *(int(j) for j in neighbours)}:
            A[j, i] = 1.0 / (len(set(neighbours)) + 1)
    return A


def _short(v: torch.Tensor) -> str:
    return "[" + ", ".join(f"{x:.6g}" for x in v.tolist()) + "]"


def _push_wrong(case) -> str | None:
    outs, z0, ranks = case["outs"], case["z0"].double(), case["ranks"]
    A = push_matrix(outs)
    if not isinstance(ranks, list) or len(ranks) != len(outs) or any(
            not isinstance(r, torch.Tensor) or r.shape != (STEPS, z0.shape[1]) for r in ranks):
        return f"expected {STEPS} steps of z from each of {len(outs)} ranks"
    got = torch.stack([r.double() for r in ranks], dim=1)  # steps x nodes x len(z)
    want = z0
    for t in range(STEPS):
        want = A @ want
        total, right = got[t].sum(0), want.sum(0)
        if not torch.allclose(total, right, atol=PUSH_TOL, rtol=0):
            return (f"after step {t + 1} the nodes' z add up to {_short(total)}, not "
                    f"{_short(right)}: push-sum neither creates nor loses mass. Keep one share "
                    f"z / (out-degree + 1) and send one to each out-neighbour")
        diff = (got[t] - want).abs().nan_to_num(nan=math.inf).amax(1)
        if diff.max() > PUSH_TOL:
            r = int(diff.argmax())
            return (f"after step {t + 1} rank {r} holds {_short(got[t, r])} but should hold "
                    f"{_short(want[r])} (out-neighbours {list(outs[r])})")
    return None


def judge_push_sum(data) -> str:
    data = merged(push_sum_cases(hidden_seed()), data, ("ranks",))  # graphs and z0 drawn here
    if wrong := _push_wrong(data["visible"]):
        raise ExerciseFailed(wrong)
    if any(_push_wrong(case) for case in data.get("hidden", [])):
        raise HiddenTestFailed("a hidden case failed")
    z0 = data["visible"]["z0"].double()
    average = z0[:, :-1].mean(0)

    def off(t):  # how far the nodes' estimates s_i / w_i are from the average after t steps
        z = torch.linalg.matrix_power(push_matrix(VISIBLE_GRAPH), t) @ z0
        return (z[:, :-1] / z[:, -1:] - average).abs().max().item()

    return (f"correct: every rank's z matches A^t z0 for t = 1..{STEPS}; the estimates s/w are "
            f"{off(STEPS):.2g} from the average {average.tolist()} after {STEPS} steps, "
            f"{off(40):.1e} after 40")


check_push_sum = checked("lesson06b.push_sum", _probe_push_sum, judge_push_sum)
check_push_sum.__doc__ = """Check ``push_sum_step(z, out_neighbours, in_neighbours, group=None)``
(called with no group: all ranks): launched on 4 ranks of a directed graph for 4 steps, each rank's
z after every step equals row i of A^t z0 (A: push-sum's column-stochastic matrix)."""


# -- exercise 2: gossip steps from the spectrum --------------------------------------------------

EPS = 1e-6
SWAP = [[0.1, 0.9], [0.9, 0.1]]  # two nodes that mostly swap: its second eigenvalue is -0.8


def _matrices(seed) -> dict:
    """The section's four graphs (Metropolis weights, eps = 1e-6) and two nodes that mostly swap
    (eps = 1e-3); in a graded run four drawn cases: random graphs of 4 to 9 nodes, each edge
    with a probability from 0.2 to 0.8 (some disconnected), Metropolis weights made lazier, and
    one two-node swap; eps from 1e-9 to 1e-2."""
    visible = [{"W": dec.mixing_matrix(graph), "eps": EPS} for graph in dec.GRAPHS.values()]
    cases = {"visible": visible + [{"W": torch.tensor(SWAP, dtype=torch.float64), "eps": 1e-3}]}
    if seed is not None:
        g = torch.Generator().manual_seed(seed + 66)
        uniform = lambda lo, hi: lo + (hi - lo) * torch.rand((), generator=g).item()  # noqa: E731
        hidden = []
        for k in range(4):
            eps = 10 ** uniform(-9, -2)
            if k == 3:
                a = uniform(0.0, 0.4)
                hidden.append({"W": torch.tensor([[a, 1 - a], [1 - a, a]],
                                                 dtype=torch.float64), "eps": eps})
                continue
            n, p = int(torch.randint(4, 10, (), generator=g)), uniform(0.2, 0.8)
            graph = {i: [] for i in range(n)}
            for i in range(n):
                for j in range(i + 1, n):
                    if torch.rand((), generator=g).item() < p:
                        graph[i].append(j)
                        graph[j].append(i)
            lazy = uniform(0.0, 0.5)  # W' = lazy I + (1 - lazy) W: lazier, still symmetric
            W = lazy * torch.eye(n, dtype=torch.float64) + (1 - lazy) * dec.mixing_matrix(graph)
            hidden.append({"W": W, "eps": eps})
        cases["hidden"] = hidden
    return cases


def _probe_gossip(gossip_steps) -> dict:
    data = {}
    for name, cases in _matrices(hidden_seed()).items():
        rows = []
        for case in cases:
            got = gossip_steps(case["W"].clone(), case["eps"])
            if got is not None and not (isinstance(got, int) or (
                    hasattr(got, "is_integer") and float(got).is_integer())):
                raise ExerciseFailed(f"gossip_steps returned {got!r} for a {len(case['W'])}-node "
                                     f"matrix: return a whole number of steps, or None")
            rows.append(case | {"steps": None if got is None else int(got)})
        data[name] = rows
    return data


def steps_to_agree(W: torch.Tensor, eps: float) -> list:
    """The answers accepted for (W, eps): the smallest t >= 1 with |lambda|^t <= eps, lambda
    the largest eigenvalue of W - 11^T / n in magnitude (W's on the directions that do not
    agree), and its neighbour where the two are equal to rounding; [None] if |lambda| = 1."""
    ### BEGIN SOLUTION
    n = len(W)
    lam = torch.linalg.matrix_norm(W.double() - 1.0 / n, ord=2).item()
    if lam >= 1 - 1e-9:
        return [None]
    if lam <= 1e-12:
        return [1]
    t = max(1, math.ceil(math.log(eps) / math.log(lam)))
    return [s for s in (t - 1, t, t + 1) if s >= 1 and lam ** s <= eps * (1 + 1e-9)
            and (s == 1 or lam ** (s - 1) >= eps * (1 - 1e-9))]
    ### END SOLUTION


def _plain_case(row) -> list:
    return [row["W"].tolist(), row["eps"]]


def _gossip_wrong(rows) -> str | None:
    for row in rows:
        right = steps_to_agree(row["W"], row["eps"])
        if row["steps"] not in right:
            n = len(row["W"])
            return (f"a {n}-node matrix, eps = {row['eps']:g}: {row['steps']} is not right. Each "
                    f"step multiplies the disagreement by W; which eigenvalue of W sets how "
                    f"fast it shrinks for the worst start, and can it be negative?")
    return None


def _judge_gossip(data) -> str:
    data = merged(_matrices(hidden_seed()), data, ("steps",))  # the matrices drawn here
    try:
        wrong = _gossip_wrong(data["visible"])
    except NotImplementedError:  # the student edition: the visible cases' digests
        for row in data["visible"]:
            practice.judge("lesson06b.gossip_steps", _plain_case(row), {"steps": row["steps"]})
        return "correct for the visible matrices (the grader runs your code on matrices of its own)"
    if wrong:
        raise ExerciseFailed(wrong)
    if "hidden" in data and _gossip_wrong(data["hidden"]):
        raise HiddenTestFailed("a hidden case failed")
    said = ", ".join(f"{name} {row['steps']}" for name, row in
                     zip([*dec.GRAPHS, "two nodes that swap"], data["visible"], strict=True))
    return f"correct: steps to agree to eps for every start ({said})"


practice.register("lesson06b.gossip_steps",
                  lambda case: {"steps": steps_to_agree(torch.tensor(case[0]), case[1])},
                  cases=[_plain_case(row) for row in _matrices(None)["visible"]])

check_gossip_steps = checked("lesson06b.gossip_steps", _probe_gossip, _judge_gossip)
check_gossip_steps.__doc__ = """Check ``gossip_steps(W, eps)``: the fewest steps of x <- W x
after which every start is within eps of agreeing (its distance to the average, relative to the
start's), or None where no number of steps is enough."""
