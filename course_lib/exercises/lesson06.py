"""Checks for lesson 6's exercises: the staleness of fast and slow workers' gradients when several
workers are slow, predicted and checked against simulated runs; and push-sum gossip on a directed
graph over point-to-point messages.

Slides "Parallel computing for machine learning", part 2 (asynchronous GD and staleness: the
notebook's section 3; decentralized networks: section 9); push-sum is Kempe et al. 2003, the
gossip inside Assran et al.'s Stochastic Gradient Push (2019). Each check is a probe (runs in the
student's kernel, returns plain data) and a judge (decides from that data alone, recomputing every
reference; the grader runs it outside the kernel): see :mod:`course_lib.exercises.common`. Both
judges draw their cases themselves and take only the answers from the data (:mod:`.cases`).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist

from course_lib.async_sgd import simulate_parameter_server
from course_lib.erm import ERMProblem
from course_lib.exercises.cases import merged
from course_lib.exercises.common import (
    ExerciseFailed,
    HiddenTestFailed,
    as_number,
    checked,
    hidden_seed,
    is_number,
    launch_checked,
)
from course_lib.parameter_server import sgd

# -- exercise 1: the staleness of fast and slow workers' gradients -------------------------------

STALENESS_TOL = 0.05  # relative; the exact rates argument lands within 2.3% of every setting drawn
GRADIENTS, JITTER = 1000, 0.1  # per simulated run: ~0.1 s; jitter breaks exact ties in time
VISIBLE_SETTINGS = [(6, 2, 3.0), (4, 1, 8.0)]  # (m, s, k); the second is section 3's straggler
# their simulated runs (a test holds them to simulated_staleness): the student edition, which
# lacks that, judges the visible settings with them
VISIBLE_RUNS = {(6, 2, 3.0): (3.655011655011655, 12.950704225352112),
                (4, 1, 8.0): (2.121875, 23.825)}


def _settings(seed) -> dict:
    """(m workers, the last s of them k times slower): two visible settings, and in a graded run
    three drawn at random (m 4..10, s 1..3 with two fast workers at least, k 2..5)."""
    cases = {"visible": VISIBLE_SETTINGS}
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        hidden = []
        for _ in range(3):
            m = int(torch.randint(4, 11, (), generator=g))
            s = int(torch.randint(1, min(3, m - 2) + 1, (), generator=g))
            hidden.append((m, s, float(torch.randint(2, 6, (), generator=g))))
        cases["hidden"] = hidden
    return cases


def _probe_staleness(mean_staleness) -> dict:
    data = {}
    for name, settings in _settings(hidden_seed()).items():
        rows = []
        for m, s, k in settings:
            got = mean_staleness(m, s, k)
            if not (isinstance(got, (tuple, list)) and len(got) == 2):
                raise ExerciseFailed(f"mean_staleness({m}, {s}, {k:g}) returned {got!r}: return "
                                     f"two numbers, (fast, slow)")
            fast, slow = (as_number(v, f"mean_staleness({m}, {s}, {k:g})[{i}]")
                          for i, v in enumerate(got))
            rows.append({"m": m, "s": s, "k": k, "fast": fast, "slow": slow})
        data[name] = rows
    return data


@functools.lru_cache(maxsize=16)  # the judge reads each visible run twice
def simulated_staleness(m: int, s: int, k: float) -> tuple[float, float]:
    """The run the predictions are checked against: section 6's simulator, asynchronous, m
    workers of which the last s are k times slower, no message latency. Returns the mean
    staleness of the fast workers' gradients and of the slow workers' gradients. The student
    edition of the library leaves this out: it answers the exercise (its signature is
    ``mean_staleness``'s)."""
    ### BEGIN SOLUTION
    if not (isinstance(m, int) and 2 <= m <= 16 and isinstance(s, int) and 1 <= s < m
            and 1 <= k <= 16):
        raise ExerciseFailed(f"no such setting: m = {m!r}, s = {s!r}, k = {k!r}")
    # staleness depends only on when gradients arrive, not on the data: a tiny problem will do
    problem = ERMProblem(torch.zeros(4 * m, 1, dtype=torch.float64),
                         torch.zeros(4 * m, dtype=torch.float64), 0.0, "least_squares")
    pad = {w: (k if w > m - s else 1.0) for w in range(1, m + 1)}
    log = simulate_parameter_server(problem, m, sgd(0.0), batch=1, gradients=GRADIENTS, pad=pad,
                                    jitter=JITTER, seed=0)
    fast = [t for t, w in zip(log["staleness"], log["worker"], strict=True) if w <= m - s]
    slow = [t for t, w in zip(log["staleness"], log["worker"], strict=True) if w > m - s]
    return sum(fast) / len(fast), sum(slow) / len(slow)
    ### END SOLUTION


def _run(m, s, k) -> tuple[float, float]:
    return VISIBLE_RUNS.get((m, s, k)) or simulated_staleness(m, s, k)


def _staleness_wrong(rows) -> str | None:
    """What is wrong with these predictions, or None: the setting and how far off, not the run's
    value itself (a hidden setting's message is never shown)."""
    for row in rows:
        m, s, k = int(row["m"]), int(row["s"]), float(row["k"])
        if not all(is_number(row[kind]) for kind in ("fast", "slow")):
            return f"m = {m}, s = {s}, k = {k:g}: expected two numbers, (fast, slow)"
        measured = dict(zip(("fast", "slow"), _run(m, s, k), strict=True))
        for kind in ("fast", "slow"):
            off = float(row[kind]) / measured[kind] - 1
            if not abs(off) <= STALENESS_TOL:
                other = "slow" if kind == "fast" else "fast"
                return (f"m = {m} workers, the last {s} of them {k:g}x slower: your {kind} "
                        f"workers' staleness, {float(row[kind]):g}, is {abs(off):.0%} "
                        f"{'above' if off > 0 else 'below'} the simulated run's mean "
                        f"({STALENESS_TOL:.0%} allowed). Count the gradients pushed while one "
                        f"{kind} gradient is computed: by the other {kind} workers and by the "
                        f"{other} ones")
    return None


def _judge_staleness(data) -> str:
    own = {name: [{"m": m, "s": s, "k": k} for m, s, k in settings]
           for name, settings in _settings(hidden_seed()).items()}
    data = merged(own, data, ("fast", "slow"))  # the settings drawn here, not read
    visible = data["visible"]
    if wrong := _staleness_wrong(visible):
        raise ExerciseFailed(wrong)
    if "hidden" in data and _staleness_wrong(data["hidden"]):
        raise HiddenTestFailed("a hidden case failed")
    said = "; ".join(f"m = {r['m']}, s = {r['s']}, k = {r['k']:g}: yours {r['fast']:.2f} and "
                     f"{r['slow']:.2f}, the run's " + " and ".join(
                         f"{v:.2f}" for v in _run(r["m"], r["s"], r["k"]))
                     for r in visible)
    return (f"correct: fast and slow workers' mean staleness within {STALENESS_TOL:.0%} of the "
            f"runs ({said})")


check_mean_staleness = checked("lesson06.mean_staleness", _probe_staleness, _judge_staleness)
check_mean_staleness.__doc__ = """Check ``mean_staleness(m, s, k)`` -> (fast, slow): the mean
staleness of a fast and of a slow worker's gradients when the last s of m asynchronous workers are
k times slower, within 5% of simulated runs."""


# -- exercise 2: push-sum on a directed graph ------------------------------------------------------

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


check_push_sum = checked("lesson06.push_sum", _probe_push_sum, judge_push_sum)
check_push_sum.__doc__ = """Check ``push_sum_step(z, out_neighbours, in_neighbours)``: launched
on 4 ranks of a directed graph for 4 steps, each rank's z after every step equals row i of
A^t z0 (A: push-sum's column-stochastic matrix)."""
