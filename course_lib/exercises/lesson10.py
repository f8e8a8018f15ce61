"""Checks for lesson 10's exercises: overlapped all-reduce from hooks when gradients accumulate
over micro-batches, and which messages of a profiled step were exposed (time outside backward).

DDP paper (Li et al., VLDB 2020), section 3.2 (overlap; ``no_sync`` for accumulation). Each check
is a probe (the student's kernel) and a judge (outside it): see :mod:`course_lib.exercises.common`;
the judges draw their cases themselves (:mod:`course_lib.exercises.cases`).
"""

from __future__ import annotations

import math

import torch

from course_lib.exercises.cases import digest, merged
from course_lib.exercises.common import (
    ExerciseFailed,
    HiddenTestFailed,
    checked,
    hidden_seed,
    judge_cases,
    launch_checked,
)
from course_lib.runtime.profiling import interval_union  # one interval union for lesson and check
from course_lib.runtime.timing import Span

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
check_overlapped.__doc__ = """Check ``make_overlapped(model, micro_batches, group=None)`` (called
with no group: all ranks): on every rank, it registers hooks on ``model`` and returns ``wait()``.
Each step runs ``micro_batches`` backward passes (gradients add up in ``.grad``), then ``wait()``,
then the optimizer step. Exactly one asynchronous all-reduce per parameter must start inside the
last backward, and after ``wait()`` every ``.grad`` holds the mean over the ranks."""

# -- exercise 2: which messages of a profiled step were exposed ---------------------------------

TARGETS = ("per parameter", "buckets 1 MB", "DDP 1 MB")


def exposed_per_message(spans, rank: int) -> list[float]:
    """For each all-reduce bar of rank ``rank`` (lane 2r + 1), in order of start: the seconds of
    it that lie outside the rank's ``backward`` bars (lane 2r). The student edition of the
    library leaves this out: it is the exercise's answer."""
    ### BEGIN SOLUTION
    backward = interval_union((s[1], s[1] + s[2]) for s in spans
                              if s[0] == 2 * rank and s[3] == "backward")
    out = []
    for s in sorted((s for s in spans if s[0] == 2 * rank + 1 and s[3] == "all-reduce"),
                    key=lambda s: (s[1], s[2])):
        start, end = s[1], s[1] + s[2]
        under = sum(max(0.0, min(end, e) - max(start, b)) for b, e in backward)
        out.append(end - start - under)
    return out
    ### END SOLUTION


# the visible steps, in eighths of a second (every answer exact in binary; rank 0 of the second
# has its backward in two pieces); the student edition judges them by their answers' digest
VISIBLE = [
    [(0, 0.0, 1.0, "forward"), (0, 1.0, 2.0, "backward"), (1, 1.5, 0.75, "all-reduce"),
     (1, 2.5, 1.5, "all-reduce"), (2, 0.0, 1.0, "forward"), (2, 1.0, 3.0, "backward"),
     (3, 3.0, 2.0, "all-reduce")],
    [(0, 0.0, 0.5, "forward"), (0, 0.5, 1.0, "backward"), (0, 1.75, 1.0, "backward"),
     (1, 1.25, 0.75, "all-reduce"), (1, 0.625, 0.25, "all-reduce"),
     (1, 2.5, 0.875, "all-reduce"), (0, 3.375, 0.25, "optimizer")],
]
VISIBLE_DIGEST = "7fcd518802eb8abd283cc6a4dc2c81e2bf6260a476fa2185cd9d5abed94fc304"


def _random_step(g) -> list:
    """A drawn step of two ranks in eighths of a second: backward in one or two pieces, three
    to six messages, starting at different times, that may overlap each other and backward."""
    spans = []
    for rank in range(2):
        t = int(torch.randint(1, 5, (1,), generator=g))
        for _ in range(int(torch.randint(1, 3, (1,), generator=g))):
            length = int(torch.randint(2, 12, (1,), generator=g))
            spans.append((2 * rank, t / 8, length / 8, "backward"))
            t += length + int(torch.randint(0, 4, (1,), generator=g))
        for begin in torch.randperm(t + 4, generator=g)[:int(torch.randint(3, 7, (1,),
                                                                           generator=g))]:
            spans.append((2 * rank + 1, (int(begin) + 2) / 8,  # no two start together
                          int(torch.randint(1, 8, (1,), generator=g)) / 8, "all-reduce"))
    return spans


def _steps(seed) -> dict:
    g = None if seed is None else torch.Generator().manual_seed(seed)
    return {"visible": VISIBLE, **({} if g is None else
                                   {"hidden": [_random_step(g) for _ in range(4)]})}


def _answers(fn, steps) -> list:
    return [[_plain_list(fn([Span(*s) for s in step], rank)) for rank in (0, 1)]
            for step in steps]


def _plain_list(answer):  # rounded to 1e-9 s (and -0.0 made 0.0) for the visible digest
    if isinstance(answer, (list, tuple)) and all(
            isinstance(a, (int, float)) and not isinstance(a, bool) for a in answer):
        return [round(float(a), 9) + 0.0 for a in answer]
    return repr(answer)


def _probe_exposed(exposed, profiled) -> dict:
    """``exposed``: the student's function; ``profiled``: section 2's bars of each
    synchronisation."""
    if not isinstance(profiled, dict) or not all(name in profiled for name in TARGETS):
        raise ExerciseFailed("pass section 2's `profiled` (bars of each synchronisation)")
    run = [[list(s) for s in profiled[name]] for name in TARGETS]
    data = {name: [{"answers": a} for a in _answers(exposed, steps)]
            for name, steps in _steps(hidden_seed()).items()}
    return {**data, "run": [{"spans": spans, "answers": a}
                            for spans, a in zip(run, _answers(exposed, run), strict=True)]}


def _wrong(spans, answers) -> str | None:
    """What is wrong with the answers for both ranks of one step, or None."""
    for rank, got in enumerate(answers):
        right = exposed_per_message(spans, rank)
        if not isinstance(got, list):
            return f"rank {rank}: return a list of seconds, one per all-reduce bar, not {got}"
        if len(got) != len(right):
            return (f"rank {rank} has {len(right)} all-reduce bars, your list holds {len(got)} "
                    f"numbers")
        for i, (have, want) in enumerate(zip(got, right, strict=True)):
            if not abs(have - want) <= 1e-9 + 1e-6 * want:
                return (f"rank {rank}'s all-reduce {i} (in order of start): {have!r} s, not "
                        f"{want!r} s outside its backward bars")
    return None


def _judge_exposed(data) -> str:
    own = {name: [{} for _ in steps] for name, steps in _steps(hidden_seed()).items()}
    run = data.get("run") if isinstance(data, dict) else None
    if not isinstance(run, list) or len(run) != len(TARGETS):
        raise ExerciseFailed("the check's data lacks the run's steps: run the check cell as it is")
    cases = merged(own, {k: v for k, v in data.items() if k != "run"}, ("answers",))
    if digest([c["answers"] for c in cases["visible"]]) != VISIBLE_DIGEST:
        raise ExerciseFailed("not right on the visible steps (VISIBLE, drawn above): work one "
                             "out by hand and compare")
    try:
        for name, step in zip(TARGETS, run, strict=True):
            spans = [(int(s[0]), float(s[1]), float(s[2]), str(s[3])) for s in step["spans"]]
            wrong = _wrong(spans, step["answers"])
            if wrong:
                raise ExerciseFailed(f"your run's step with '{name}': {wrong}")
    except NotImplementedError:  # the student edition: its library leaves the answer out
        return ("recorded: right on the visible steps; the grader judges your run's steps and "
                "hidden ones")
    for step, case in zip(_steps(hidden_seed()).get("hidden", []), cases.get("hidden", []),
                          strict=True):
        if _wrong(step, case["answers"]):
            raise HiddenTestFailed("a hidden case failed")
    return ("correct: each all-reduce's time outside backward, for both ranks, in the visible "
            "steps and your run's three profiled steps")


check_exposed = checked("lesson10.exposed", _probe_exposed, _judge_exposed)
check_exposed.__doc__ = """Check ``exposed(spans, rank)`` (each all-reduce bar's seconds outside
backward) on ``VISIBLE``, section 2's ``profiled`` and hidden steps: ``check_exposed(exposed,
profiled)``."""
