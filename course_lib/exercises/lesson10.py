"""Checks for lesson 10's exercises: overlapped all-reduce from hooks when gradients accumulate
over micro-batches, and the communication a profiled step left exposed.

DDP paper (Li et al., VLDB 2020), section 3.2 (overlap; ``no_sync`` for accumulation). The
library's ``overlap.PerParameterAllReduce`` starts an all-reduce on every backward; the exercise
must start it only on the last micro-batch's, so it is not a transcription. Each check is a
probe (the student's kernel) and a judge (outside it): see :mod:`course_lib.exercises.common`.
The first judge draws its cases itself and takes only what the ranks ended with from the data
(:mod:`course_lib.exercises.cases`).
"""

from __future__ import annotations

import math

import torch

from course_lib.exercises.cases import merged
from course_lib.exercises.common import (
    ExerciseFailed,
    check_drawn,
    checked,
    hidden_seed,
    judge_cases,
    launch_checked,
)
from course_lib.runtime.profiling import interval_union  # one interval union for lesson and check

# -- exercise 1: overlapped all-reduce with gradient accumulation -------------------------------


def _model(dims, seed):
    d_in, hidden, out = dims
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.Tanh(),
                                torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
                                torch.nn.Linear(hidden, out)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=g, dtype=torch.float64) - 0.5)
    return model


def _case(seed, dims, micro, steps, hidden=False):
    g = torch.Generator().manual_seed(seed)
    n = 2 * micro * steps * 3  # 2 ranks, micro-batches of 3 rows
    return dict(x=torch.randn(n, dims[0], generator=g, dtype=torch.float64),
                y=torch.randn(n, dims[2], generator=g, dtype=torch.float64),
                dims=list(dims), seed=seed, micro=micro, steps=steps, lr=0.3, hidden=hidden)


def cases_for(seed):
    cases = [_case(5, (4, 6, 2), micro=3, steps=2)]
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        micro, dims = int(torch.randint(1, 5, (1,), generator=g)), (5, 7, 3)
        cases.append(_case(seed % 10_000, dims, micro=micro, steps=3, hidden=True))
    return cases


def _rows(case, step, micro, rank):
    """Rows of micro-batch ``micro`` of ``step`` for ``rank``: 3 rows each."""
    start = ((step * case["micro"] + micro) * 2 + rank) * 3
    return slice(start, start + 3)


def _train_on_ranks(make_overlapped, cases):
    """On every rank: steps of ``micro`` micro-batches, each backward of loss / micro; the
    student's ``wait()`` after the last; an SGD step. Records every all-reduce call: was it
    asynchronous, and was autograd running (inside backward) when it was made?"""
    import torch.distributed as dist

    calls = []
    original = dist.all_reduce

    def recording(tensor, *args, **kwargs):
        calls.append(dict(inside_backward=torch._C._current_graph_task_id() != -1,
                          asynchronous=bool(kwargs.get("async_op", False)),
                          numel=tensor.numel()))
        return original(tensor, *args, **kwargs)

    dist.all_reduce = recording
    out = []
    try:
        for case in cases:
            model = _model(case["dims"], case["seed"])
            calls.clear()
            wait = make_overlapped(model, case["micro"])
            per_step = []
            for step in range(case["steps"]):
                model.zero_grad()
                for micro in range(case["micro"]):
                    rows = _rows(case, step, micro, dist.get_rank())
                    loss = torch.nn.functional.mse_loss(model(case["x"][rows]), case["y"][rows])
                    (loss / case["micro"]).backward()
                wait()
                per_step.append(list(calls))
                calls.clear()
                with torch.no_grad():
                    for p in model.parameters():
                        p -= case["lr"] * p.grad
            out.append(dict(params=torch.cat([p.detach().reshape(-1)
                                              for p in model.parameters()]),
                            calls=per_step))
    finally:
        dist.all_reduce = original
    return out


def _probe_overlapped(make_overlapped) -> dict:
    cases = cases_for(hidden_seed())
    ranks = launch_checked(_train_on_ranks, 2, (make_overlapped, cases), timeout=60,
                           hint="does every rank start one all-reduce per parameter, and does "
                                "wait() wait for all of them?")
    return dict(cases=[dict(case=case, ranks=[r[i] for r in ranks])
                       for i, case in enumerate(cases)])


def _one_process(case):
    model = _model(case["dims"], case["seed"])
    for step in range(case["steps"]):
        model.zero_grad()
        rows = [_rows(case, step, m, r) for m in range(case["micro"]) for r in range(2)]
        idx = torch.cat([torch.arange(s.start, s.stop) for s in rows])
        torch.nn.functional.mse_loss(model(case["x"][idx]), case["y"][idx]).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= case["lr"] * p.grad
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _judge_case(item):
    case, ranks = item["case"], item["ranks"]
    n_params = 6
    if not (isinstance(ranks, list) and len(ranks) == 2 and all(
            isinstance(r, dict) and {"params", "calls"} <= set(r) for r in ranks)):
        return "expected the parameters and all-reduces of 2 ranks"
    for rank, result in enumerate(ranks):
        for step, calls in enumerate(result["calls"]):
            if len(calls) != n_params:
                return (f"rank {rank}, step {step + 1}: {len(calls)} all-reduces for 6 "
                        f"parameters and {case['micro']} micro-batches: start exactly one per "
                        f"parameter per step, on the last micro-batch's backward")
            if not all(c["asynchronous"] and c["inside_backward"] for c in calls):
                return (f"rank {rank}, step {step + 1}: every all-reduce must be started "
                        f"asynchronously (async_op=True) from a hook, while backward runs; "
                        f"{sum(not c['inside_backward'] for c in calls)} were started after it "
                        f"and {sum(not c['asynchronous'] for c in calls)} were blocking")
    right = _one_process(case)
    for rank, result in enumerate(ranks):
        got = torch.as_tensor(result["params"]).double()
        if got.shape != right.shape or not torch.allclose(got, right, rtol=0, atol=1e-9):
            worst = (got - right).abs().max().item() if got.shape == right.shape else math.inf
            return (f"rank {rank}: after {case['steps']} steps of {case['micro']} micro-batches "
                    f"the parameters differ from one process on the global batch by up to "
                    f"{worst:.3g} (is each all-reduce started after the last micro-batch's "
                    f"gradient was added, and divided by the number of ranks?)")
    return None


def _judge_overlapped(data) -> str:
    own = {"cases": [{"case": case} for case in cases_for(hidden_seed())]}
    judge_cases(merged(own, data, ("ranks",))["cases"], _judge_case)  # cases drawn here
    return ("correct: one asynchronous all-reduce per parameter, started from backward on the "
            "last micro-batch, and both ranks take the steps of one process on the global batch")


check_overlapped = checked("lesson10.overlapped", _probe_overlapped, _judge_overlapped)
check_overlapped.__doc__ = """Check ``make_overlapped(model, micro_batches)``: on every rank,
it registers hooks on ``model`` and returns ``wait()``. Each step runs ``micro_batches`` backward
passes (gradients add up in ``.grad``), then ``wait()``, then the optimizer step. Exactly one
asynchronous all-reduce per parameter must start inside the last backward, and after ``wait()``
every ``.grad`` holds the mean over the ranks."""

# -- exercise 2: the communication a profiled step left exposed -------------------------------

TARGETS = ("per parameter", "buckets 1 MB", "DDP 1 MB")


def draw_target(rng) -> dict:
    """Exercise 2's synchronisation and rank: ``common.drawn("lesson10.target", draw_target)``
    in the notebook (fresh every run; the grader's run seeds it)."""
    return dict(sync=TARGETS[int(rng.integers(len(TARGETS)))], rank=int(rng.integers(2)))


def exposed_seconds(spans, rank: int) -> float:
    """Seconds during which rank ``rank``'s all-reduce lane is busy and its backward is not.
    The student edition of the library leaves this out: it is the exercise's answer."""
    ### BEGIN SOLUTION
    comm = interval_union((s[1], s[1] + s[2]) for s in spans if s[0] == 2 * rank + 1
                  and s[3] == "all-reduce")
    backward = interval_union((s[1], s[1] + s[2]) for s in spans if s[0] == 2 * rank
                      and s[3] == "backward")
    hidden = sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in comm for s2, e2 in backward)
    return sum(e - s for s, e in comm) - hidden
    ### END SOLUTION


def _probe_exposed(answer, spans, target) -> dict:
    """``answer``: the student's seconds; ``spans``: section 2's ``profiled`` (the profiled
    step's bars of each synchronisation); ``target``: the drawn synchronisation and rank."""
    if not isinstance(spans, dict) or target.get("sync") not in spans:
        raise ExerciseFailed("pass section 2's `profiled` (bars of each synchronisation)")
    return dict(answer=answer, target=target,
                spans=[list(s) for s in spans[target["sync"]]])


def _judge_exposed(data) -> str:
    target, answer = data["target"], data["answer"]
    check_drawn("lesson10.target", draw_target, target)  # graded runs only
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not math.isfinite(
            answer):
        raise ExerciseFailed(f"give a number of seconds, not {answer!r}")
    spans = [(int(s[0]), float(s[1]), float(s[2]), str(s[3])) for s in data["spans"]]
    right = exposed_seconds(spans, target["rank"])
    if abs(answer - right) <= 1e-6 + 1e-3 * right:
        return (f"correct: {right * 1e3:.2f} ms of rank {target['rank']}'s communication with "
                f"'{target['sync']}' was not hidden under its backward pass")
    if abs(answer * 1e-3 - right) <= 1e-6 + 1e-3 * right:
        raise ExerciseFailed("that looks like milliseconds: give seconds")
    comm = sum(e - s for s, e in interval_union((s[1], s[1] + s[2]) for s in spans
                                        if s[0] == 2 * target["rank"] + 1))
    if abs(answer - comm) <= 1e-6 + 1e-3 * comm:
        raise ExerciseFailed("that is all of the rank's communication time: subtract what lies "
                             "under its backward bars")
    raise ExerciseFailed(f"not what rank {target['rank']}'s bars of '{target['sync']}' give "
                         f"(overlapping all-reduce bars count once)")


check_exposed = checked("lesson10.exposed", _probe_exposed, _judge_exposed)
check_exposed.__doc__ = """Check ``exposed``, the seconds in the drawn synchronisation's profiled
step during which the drawn rank's all-reduce lane was busy and its backward was not:
``check_exposed(exposed, profiled, target)``."""
