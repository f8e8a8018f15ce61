"""Checks for lesson 11's exercises: ZeRO-1's step for SGD with momentum, and the time each
pipeline action costs beyond its padded work, fitted from this run's interleaved steps.

ZeRO (Rajbhandari et al. 2020, stage 1: shard the optimizer state); interleaved 1F1B (Narayanan
et al. 2021). The library's ``zero.ShardedAdam`` shards Adam through ``torch.optim.Adam``; the
exercise shards SGD with momentum and writes the update itself, so it is not a transcription.
Each check is a probe (the student's kernel) and a judge (outside it): see
:mod:`course_lib.exercises.common`. The ZeRO judge draws its cases itself and takes only what the
ranks ended with from the data (:mod:`course_lib.exercises.cases`).
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

# -- exercise 1: ZeRO-1 for SGD with momentum ---------------------------------------------------


def _model(dims, seed):
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(dims[0], dims[1]), torch.nn.Tanh(),
                                torch.nn.Linear(dims[1], dims[2])).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=g, dtype=torch.float64) - 0.5)
    return model


SLACK = 4  # numbers a step may keep besides its shard (a counter, a flag)


def _case(seed, dims, steps, lr=0.1, momentum=0.9, hidden=False):
    g = torch.Generator().manual_seed(seed)
    n = steps * 2 * 4
    return dict(x=torch.randn(n, dims[0], generator=g, dtype=torch.float64),
                y=torch.randn(n, dims[2], generator=g, dtype=torch.float64), dims=list(dims),
                seed=seed, steps=steps, lr=lr, momentum=momentum, hidden=hidden)


def _cases(seed):
    cases = [_case(6, (5, 7, 3), steps=4)]  # 66 parameters: two shards of 33
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        hidden = int(torch.randint(4, 9, (1,), generator=g))
        cases.append(_case(seed % 10_000, (4, hidden, 3), steps=5, momentum=0.8, hidden=True))
    return cases


def _live_tensors() -> list:
    import gc
    import warnings

    gc.collect()
    with warnings.catch_warnings():  # asking some of torch's objects their class warns
        warnings.simplefilter("ignore")
        return [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]


def _numbers_kept(before, model) -> int:
    """Numbers held now in tensors that were not alive in ``before`` (kept alive, so their
    memory is not reused) and are not the model's parameters or gradients: what the student's
    step keeps between steps, measured rather than reported (each storage counted once). The
    fewest of three counts, after a barrier: a buffer that the process group's thread still
    holds for a moment after a collective is not state."""
    import time

    import torch.distributed as dist

    dist.barrier()
    own = {t.untyped_storage().data_ptr() for t in before}
    own |= {t.untyped_storage().data_ptr() for p in model.parameters()
            for t in (p, p.grad) if t is not None}
    counts = []
    for _ in range(3):
        seen, total = set(own), 0
        for t in _live_tensors():
            ptr = t.untyped_storage().data_ptr()
            if t.numel() and ptr not in seen:
                seen.add(ptr)
                total += t.untyped_storage().nbytes() // t.element_size()
        counts.append(total)
        time.sleep(0.02)
    return min(counts)


def _train_on_ranks(make_zero1, cases):
    import torch.distributed as dist

    rank, out = dist.get_rank(), []
    for case in cases:
        model = _model(case["dims"], case["seed"])
        before = _live_tensors()
        step, state = make_zero1(list(model.parameters()), case["lr"], case["momentum"])
        for t in range(case["steps"]):
            rows = slice((t * 2 + rank) * 4, (t * 2 + rank + 1) * 4)
            for p in model.parameters():
                p.grad = None
            torch.nn.functional.mse_loss(model(case["x"][rows]), case["y"][rows]).backward()
            step()
        kept = _numbers_kept(before, model)
        del before, step, state
        out.append(dict(params=torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
                        state_numel=kept))
    return out


def _probe_zero1(make_zero1) -> dict:
    cases = _cases(hidden_seed())
    ranks = launch_checked(_train_on_ranks, 2, (make_zero1, cases), timeout=60,
                           hint="does every rank all-reduce the gradients and all-gather the "
                                "shards, in the same order?")
    return dict(cases=[dict(case=case, ranks=[r[i] for r in ranks])
                       for i, case in enumerate(cases)])


def _one_process(case):
    model = _model(case["dims"], case["seed"])
    opt = torch.optim.SGD(model.parameters(), lr=case["lr"], momentum=case["momentum"])
    for t in range(case["steps"]):
        opt.zero_grad()
        rows = slice(t * 8, (t + 1) * 8)  # both ranks' rows of this step: the global batch
        torch.nn.functional.mse_loss(model(case["x"][rows]), case["y"][rows]).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _judge_case(item):
    case, ranks = item["case"], item["ranks"]
    right = _one_process(case)
    numel = right.numel()
    if not (isinstance(ranks, list) and len(ranks) == 2 and all(
            isinstance(r, dict) and {"params", "state_numel"} <= set(r) for r in ranks)):
        return "expected the parameters and optimizer state of 2 ranks"
    for rank, result in enumerate(ranks):
        got = torch.as_tensor(result["params"]).double()
        if got.shape != right.shape or not torch.allclose(got, right, rtol=0, atol=1e-10):
            worst = (got - right).abs().max().item() if got.shape == right.shape else math.inf
            return (f"rank {rank}: after {case['steps']} steps the parameters differ from SGD "
                    f"with momentum {case['momentum']} on one process by up to {worst:.3g}")
        kept, most = result["state_numel"], -(-numel // 2) + SLACK
        if not isinstance(kept, int) or kept > most:
            return (f"rank {rank} keeps {kept} numbers in tensors between steps (counted in its "
                    f"memory) for {numel} parameters: ZeRO-1 keeps momentum for its shard only "
                    f"(at most {-(-numel // 2)} here)")
    return None


def _judge_zero1(data) -> str:
    own = {"cases": [{"case": case} for case in _cases(hidden_seed())]}
    judge_cases(merged(own, data, ("ranks",))["cases"], _judge_case)  # cases drawn here
    return ("correct: each rank keeps momentum for its shard only, and both take the steps of "
            "SGD with momentum on one process")


check_zero1 = checked("lesson11.zero1", _probe_zero1, _judge_zero1)
check_zero1.__doc__ = """Check ``make_zero1(params, lr, momentum, group=None)`` (called with no
group: all ranks): on every rank, it returns ``(step, state)``; ``step()`` is called after backward
(each ``.grad`` holds this rank's gradient) and must leave every rank with the parameters of SGD
with momentum on the mean gradient; ``state`` is the list of tensors it keeps as optimizer state
(its momentum shard)."""

# -- exercise 2: the overhead per pipeline action -----------------------------------------------


def draw_padding(rng) -> dict:
    """Exercise 2's padded times (seconds): forward 25-35 ms, backward twice that (long enough
    that each action's overhead is a small part of it).
    ``common.drawn("lesson11.padding", draw_padding)`` in the notebook."""
    forward = round(float(rng.uniform(0.025, 0.035)), 4)
    return dict(forward=forward, backward=2 * forward)


def overhead_fit(walls: dict, p: int, v: int, forward: float, backward: float) -> float:
    """The least-squares per-action overhead o in wall(m) = (m v + p - 1)(F + B + 2 o).
    The student edition of the library leaves this out: it is the exercise's answer."""
    ### BEGIN SOLUTION
    c = {m: m * v + p - 1 for m in walls}
    return sum(c[m] * (walls[m] - c[m] * (forward + backward)) for m in walls) / (
        2 * sum(c[m] ** 2 for m in walls))
    ### END SOLUTION


def _probe_overhead(answer, walls, padding) -> dict:
    """``answer``: the student's seconds; ``walls``: {m: the step's wall time} of section 4's
    interleaved runs; ``padding``: the drawn forward and backward times."""
    if not isinstance(walls, dict) or len(walls) < 2:
        raise ExerciseFailed("pass section 4's `walls` ({micro-batches: seconds})")
    return dict(answer=answer, padding=padding,
                walls={str(k): float(v) for k, v in walls.items()})


def _judge_overhead(data) -> str:
    padding, answer = data["padding"], data["answer"]
    check_drawn("lesson11.padding", draw_padding, padding)  # graded runs only
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not math.isfinite(
            answer):
        raise ExerciseFailed(f"give a number of seconds, not {answer!r}")
    walls = {int(k): v for k, v in data["walls"].items()}
    try:
        right = overhead_fit(walls, 2, 2, padding["forward"], padding["backward"])
    except NotImplementedError:  # the student edition: judged by what least squares means
        return _judged_by_its_squares(answer, walls, padding["forward"] + padding["backward"])
    if abs(answer - right) <= 1e-9 + 1e-6 * abs(right):
        return (f"correct: each action costs {right * 1e3:.2f} ms beyond its padding, fitted "
                f"over m = {sorted(walls)}")
    if abs(answer * 1e-3 - right) <= 1e-9 + 1e-6 * abs(right):
        raise ExerciseFailed("that looks like milliseconds: give seconds")
    if abs(2 * answer - right) <= 1e-9 + 1e-6 * abs(right) or abs(
            answer - 2 * right) <= 1e-9 + 1e-6 * abs(right):
        raise ExerciseFailed("off by a factor of 2: each micro-batch's piece costs one forward "
                             "and one backward action, so 2 o per F + B")
    raise ExerciseFailed("not the least-squares o of wall(m) = (m v + p - 1)(F + B + 2 o) over "
                         "the runs in `walls`")


def _judged_by_its_squares(o, walls, work) -> str:
    """No o a little off ``o`` fits ``walls`` better (p = v = 2): the sum of squares is smallest
    there. Needs no formula for o, so the student edition holds it."""
    def squares(x):
        return sum((wall - (2 * m + 1) * (work + 2 * x)) ** 2 for m, wall in walls.items())

    step = 1e-7 + 1e-3 * abs(o)
    if min(squares(o - step), squares(o + step)) < squares(o):
        raise ExerciseFailed(f"not the least-squares o: {o!r} s +- {step:.1e} s fits this run's "
                             f"walls better (milliseconds? a factor of 2?)")
    return ("recorded: right for this run's walls (no nearby o fits them better); the grader "
            "fits its own run")


check_overhead = checked("lesson11.overhead", _probe_overhead, _judge_overhead)
check_overhead.__doc__ = """Check ``overhead``, the seconds each pipeline action costs beyond its
padded work, fitted by least squares to this run's interleaved walls:
``check_overhead(overhead, walls, padding)``."""
