"""The parameter server: one protocol for synchronous (lesson 2) and asynchronous (lesson 6) SGD.

Lecture note "Parallel computing for empirical risk minimization", section 2 (broadcast w ->
each worker computes its local gradient -> the server aggregates and updates; O(dm) words on a
star, O(d log m) on a tree) and slides part 2 (the parameter server of Li et al., OSDI 2014:
client-server, message passing; workers **pull** w and **push** gradients; synchronous or
asynchronous; staleness).

Rank 0 of ``group`` is the server, ranks 1..m are the workers. Messages travel along a tree
rooted at the server -- the **star** (every worker talks to the server) or a binomial **tree**
(workers relay, so messages hop in log2 m rounds):

* **pull**: w and its version go down the tree;
* **push**: each worker sends n_k g_k (its rows' count times its gradient) up the tree, each
  relay adding its subtree's; the server divides by the rows: the mean gradient.

What the server does with a push is :class:`ServerState`'s rule: ``"sync"`` waits for every
worker and applies one step; ``"async"`` applies each gradient at once; ``"ssp"`` lets a worker
run at most ``bound`` gradients ahead of the slowest. The step itself is an ``optimizer``
function ``optimizer(w, g, staleness, state)``: :func:`sgd` or :func:`heavy_ball` (the note's
accelerated gradient descent).

The server receives from whichever worker pushes first (receive from any source), which only
gloo offers: messages stay in host memory; each worker computes on its device.

Lesson 2's experiment, synchronous AGD with a server and m = p - 1 workers against AGD on one
process, on both problems (``--world-size 3``: two workers)::

    python -m course_lib.parameter_server --world-size 3 [--iterations 40] [--topology tree]
    torchrun --standalone --nproc-per-node 3 -m course_lib.parameter_server
"""

from __future__ import annotations

import math
import numbers
import time

import torch
import torch.distributed as dist

from course_lib.data import batch_rows, shard_rows
from course_lib.erm import ERMProblem, agd, breast_cancer_problem, diabetes_problem
from course_lib.message_trees import (  # noqa: F401  (ps.broadcast_schedule ...: the lessons')
    TOPOLOGIES,
    broadcast_schedule,
    reduce_schedule,
    tree_links,
    words_per_iteration,
)
from course_lib.runtime.devices import device
from course_lib.runtime.timing import Timeline, to_spans
from course_lib.runtime.torchrun import run_command, run_main

MODES = ("sync", "async", "ssp")
STOP = -1.0  # the version a stop message carries


# -- the server's step -----------------------------------------------------------------------------


def fixed_lr(lr: float, staleness: int) -> float:
    """The same step whatever the staleness."""
    return lr


def sgd(lr: float, lr_rule=fixed_lr):
    """The server's step w <- w - lr_rule(lr, staleness) g."""

    def step(w, g, staleness, state):
        return w - lr_rule(lr, staleness) * g

    return step


def heavy_ball(alpha: float, beta: float):
    """The lecture note's accelerated gradient descent: v <- beta v + g, w <- w - alpha v (v in
    ``state``, which the server owns, so the step function can be reused for another run)."""

    def step(w, g, staleness, state):
        state["v"] = beta * state.get("v", torch.zeros_like(w)) + g
        return w - alpha * state["v"]

    return step


class ServerState:
    """What the server holds (w, its version, each worker's clock) and its rules.

    ``push`` takes one arriving message -- the sum of ``rows`` times the gradient of the
    ``gradients`` workers below ``src`` -- and returns the children that may now pull w.
    ``children`` are the ranks that push to the server directly (every worker, on a star).
    """

    def __init__(self, w, children, mode, bound, optimizer, gradients, seconds, start):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: use one of {MODES}")
        def whole(value):  # an int or numpy's, not a bool
            return isinstance(value, numbers.Integral) and not isinstance(value, bool)
        if mode == "ssp" and not (whole(bound) and bound >= 0):
            raise ValueError(f"mode 'ssp' needs a staleness bound, a whole number >= 0 "
                             f"(bound=...), got {bound!r}")
        time_only = gradients == math.inf and seconds is not None  # a time limit alone
        if not (time_only or whole(gradients) and gradients >= 1):
            raise ValueError(f"gradients must be a whole number of at least 1, or math.inf with "
                             f"seconds=... (a time limit only), got {gradients!r}")
        self.w, self.version, self.mode = w.clone(), 0, mode
        self.optimizer, self.optimizer_state = optimizer, {}
        self.bound = {"sync": 0, "async": math.inf, "ssp": bound}[mode]
        self.clock = dict.fromkeys(children, 0)  # gradients each child has pushed
        self.owed: list[int] = []  # pushed, waiting for w
        self.round = []  # sync: this round's (sum of n_k g_k, rows, gradients)
        self.gradients, self.seconds, self.start = gradients, seconds, start
        self.applied = 0
        self.log = dict(time=[], worker=[], staleness=[], iterates=[self.w.clone()],
                        iterate_times=[0.0], iterate_gradients=[0])

    def done(self, now) -> bool:
        return (self.applied >= self.gradients
                or (self.seconds is not None and now - self.start >= self.seconds))

    def _apply(self, total, rows, gradients, staleness, now):
        self.applied += gradients
        self.w = self.optimizer(self.w, total / rows, staleness, self.optimizer_state)
        self.version += 1
        for key, value in (("iterates", self.w.clone()), ("iterate_times", now - self.start),
                           ("iterate_gradients", self.applied)):
            self.log[key].append(value)

    def push(self, src: int, total, rows: float, gradients: int, computed_on: int,
             now: float) -> list[int]:
        staleness = self.version - computed_on
        self.clock[src] += 1
        self.owed.append(src)
        for key, value in (("time", now - self.start), ("worker", src), ("staleness", staleness)):
            self.log[key].append(value)
        if self.mode == "sync":  # wait for every child, then one step along the mean
            self.round.append((total, rows, gradients))
            if len(self.round) < len(self.clock):
                return []
            self._apply(sum(t for t, _, _ in self.round), sum(r for _, r, _ in self.round),
                        sum(g for _, _, g in self.round), staleness, now)
            self.round = []
        else:  # apply each gradient as it arrives
            self._apply(total, rows, gradients, staleness, now)
        if self.done(now):
            return []
        slowest = min(self.clock.values())
        released = [k for k in self.owed if self.clock[k] - slowest <= self.bound]
        self.owed = [k for k in self.owed if k not in released]
        return released


# -- the protocol on ranks -------------------------------------------------------------------------


def parameter_server(problem: ERMProblem, optimizer, *, mode: str = "sync",
                     bound: int | None = None, topology: str = "star", batch: int | None = None,
                     gradients: int = 200, seconds: float | None = None, pad=None,
                     seed: int = 0, group=None) -> dict:
    """Run on every rank of ``group``: SGD with rank 0 as server and ranks 1..m as workers.

    Worker k owns shard k - 1 of the rows (shuffled with ``seed``; contiguous with
    ``seed=None``) and computes its gradient on a mini-batch of ``batch`` of them (``None``: the
    whole shard, as in the lecture note's gradient descent). ``pad`` (seconds, or {worker:
    seconds}) makes each of a worker's gradients take at least that long, sleeping the rest (a
    model of a bigger model or a slower machine; a worker missing from the dict does not wait).
    The run stops once ``gradients`` gradients are applied (a synchronous round applies one per
    worker, so the count can pass the budget by up to m - 1) or ``seconds`` have passed.

    Returns on the server its log: per arriving message its ``time`` (seconds since the start),
    ``worker`` (who pushed it) and ``staleness``; the ``iterates`` after every update with their
    ``iterate_times`` and ``iterate_gradients``. On a worker: its ``timeline``. Every rank also
    returns ``words_sent`` (numbers of w or gradients it sent).
    """
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    if p < 2:
        raise ValueError("a parameter server needs a server and at least one worker: "
                         "launch with world_size >= 2")
    if mode != "sync" and topology != "star":
        raise ValueError(f"mode {mode!r} needs topology 'star': an asynchronous push goes "
                         f"straight to the server, it does not wait for a subtree")
    parent, children = tree_links(rank, p, topology)
    message = torch.empty(problem.d + 3, dtype=problem.X.dtype)  # vector, rows, gradients, version
    words = {"sent": 0}

    def send(vector, rows, grads, version, dst):
        if version != STOP:
            words["sent"] += problem.d
        extra = torch.tensor([rows, grads, version], dtype=message.dtype)
        dist.send(torch.cat([vector.cpu(), extra]), group=group, group_dst=dst)

    dist.barrier(group=group)  # start together: all ranks' times share one origin
    start = time.time()
    if rank == 0:
        state = ServerState(torch.zeros(problem.d, dtype=problem.X.dtype), children, mode,
                            bound, optimizer, gradients, seconds, start)
        for k in children:  # everyone pulls version 0
            send(state.w, 0, 0, 0, k)
        while not state.done(time.time()):
            src = dist.recv(message, group=group)  # from whichever child pushes first
            src = src if group is None else dist.get_group_rank(group, src)
            total, rows, grads, computed_on = message[:-3].clone(), *message[-3:].tolist()
            for k in state.push(src, total, rows, int(grads), int(computed_on), time.time()):
                send(state.w, 0, 0, state.version, k)
        for k in state.owed:  # waiting for w: tell them to stop
            send(state.w, 0, 0, STOP, k)
        for _ in range(len(children) - len(state.owed)):  # computing: stop after their push
            src = dist.recv(message, group=group)
            send(state.w, 0, 0, STOP, src if group is None else dist.get_group_rank(group, src))
        return state.log | dict(words_sent=words["sent"], start=start)
    dev = device(group)
    shard = shard_rows(problem.n, p - 1, seed)[rank - 1]  # copied once: a worker holds its rows
    local = ERMProblem(problem.X[shard].to(dev), problem.y[shard].to(dev), problem.lam,
                       problem.kind)
    positions = torch.arange(len(shard), device=dev)
    wait = pad.get(rank, 0.0) if isinstance(pad, dict) else (pad or 0.0)
    timeline, step, incoming, last = Timeline(rank), 0, torch.empty_like(message), start
    while True:
        dist.recv(message, group=group, group_src=parent)  # pull
        for child in children:  # relay w down the tree
            send(message[:-3], 0, 0, message[-1].item(), child)
        if message[-1] == STOP:
            break
        timeline.add("communicate / wait", last)
        with timeline.span("compute", dev):
            c0 = time.time()
            rows = None if batch is None else batch_rows(positions, batch, seed, rank, step)
            w, count = message[:-3].to(dev), float(len(shard) if rows is None else len(rows))
            g = local.gradient_sum(w, rows) / count + problem.lam * w
            total, grads = count * g, 1
            time.sleep(max(0.0, wait - (time.time() - c0)))
        last = timeline.records[-1][2]
        for child in children:  # relay the pushes of the subtree up
            dist.recv(incoming, group=group, group_src=child)
            total = total + incoming[:-3].to(dev)
            count, grads = count + incoming[-3].item(), grads + int(incoming[-2])
        send(total, count, grads, message[-1].item(), parent)  # push
        step += 1
    return dict(timeline=timeline, steps=step, words_sent=words["sent"])


def server_log(results) -> dict:
    """The server's log from what ``launch(parameter_server, ...)`` returned, with the workers'
    timelines as ``spans`` (seconds since the common start) and ``words_sent`` per rank."""
    spans = to_spans([r["timeline"] for r in results[1:]], origin=results[0]["start"])
    return results[0] | dict(spans=spans, words_sent=[r["words_sent"] for r in results])


def iteration_times(log) -> list[float]:
    """Seconds between successive updates of the server (a synchronous run: per iteration)."""
    times = log["iterate_times"]
    return [b - a for a, b in zip(times[:-1], times[1:], strict=True)]


# -- lesson 2's experiment, as a command -----------------------------------------------------------


def lesson_problems() -> dict:
    """Lesson 2's two problems: least squares on the diabetes data, logistic on breast cancer."""
    return {"least squares": diabetes_problem(), "logistic": breast_cancer_problem()}


def agd_with_a_server(iterations: int = 40, beta: float = 0.9, topology: str = "star",
                      group=None) -> dict:
    """Run on every rank of ``group``: AGD (step 1/L, momentum ``beta``) with rank 0 as server
    and whole shards of rows in order (``seed=None``), on both problems. Returns per problem
    the server's ``iterates`` (on rank 0) and every rank's ``words_sent``."""
    m = dist.get_world_size(group) - 1
    out = {}
    for name, problem in lesson_problems().items():
        log = parameter_server(problem, heavy_ball(1 / problem.smoothness(), beta),
                               topology=topology, gradients=m * iterations, seed=None,
                               group=group)
        out[name] = {k: log[k] for k in ("iterates", "words_sent") if k in log}
    return out


def main(argv=None):
    args, results = run_command(
        agd_with_a_server, "Lesson 2: synchronous AGD with a parameter server, against AGD on "
        "one process",
        (("--iterations", int, 40), ("--beta", float, 0.9, {"help": "AGD's momentum"}),
         ("--topology", str, "star", {"choices": TOPOLOGIES})), argv, world_size=3)
    if results is not None:  # the launcher, or rank 0 under torchrun
        p, t = len(results), args.iterations
        print(f"p = {p} processes: the server and m = {p - 1} workers, {args.topology}")
        for name, problem in lesson_problems().items():
            parallel = torch.stack(results[0][name]["iterates"])
            gap = (parallel - agd(problem, 1 / problem.smoothness(), args.beta, t)).abs().max()
            words = sum(r[name]["words_sent"] for r in results) // t
            print(f"{name}: objective after {t} iterations {problem.loss(parallel[-1]):.10f}; "
                  f"max |parallel - sequential| over {t} iterates = {gap.item():.1e}; words "
                  f"sent in one iteration {words}, schedule says "
                  f"{words_per_iteration(p, problem.d, args.topology)['total']}")
    return results


if __name__ == "__main__":
    run_main(main)
