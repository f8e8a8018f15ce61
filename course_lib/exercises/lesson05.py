"""Checks for lesson 5's exercises: the bubble of a pipeline whose last stage is slower, and
the all-gather operator of a column-parallel layer.

The course article's model parallelism; GPipe (Huang et al. 2019) and 1F1B (Narayanan et al.
2021) for the bubble; Megatron-LM (Shoeybi et al. 2019) for the column split and its gather.
Each check is a probe (runs in the student's kernel, returns plain data) and a judge (decides
from the data; the grader runs it outside the kernel): see :mod:`course_lib.exercises.common`.
The gather's judge draws its layers itself and takes only the ranks' outputs and gradients from
the data (:mod:`course_lib.exercises.cases`).
"""

from __future__ import annotations

import torch

from course_lib.exercises.cases import merged
from course_lib.exercises.common import (
    ExerciseFailed,
    HiddenTestFailed,
    check_drawn,
    checked,
    hidden_seed,
    is_number,
    launch_checked,
)

# -- exercise 1: the bubble when the last stage is slower ----------------------------------------

# The pipeline of the exercise, in the time units of section 9's model: stages 0 to p - 2 take
# 1 unit per forward and 2 per backward, the last stage (output layer and loss) ``slowdown``
# times as long; 1F1B. The notebook draws p, m and the slowdown afresh on every run (a number
# copied from another run is then wrong); the judge rebuilds the timeline from them.
SCHEDULE = "1F1B"
TOLERANCE = 0.005  # absolute, on the idle fraction


def draw_slow_pipeline(rng) -> list:
    """Exercise 1's pipeline ``[stages, micro, slowdown]``: p from 3 to 6, m from 4 to 16 and
    k in {1.5, 2, 2.5, 3}; ``common.drawn("lesson05.slow_pipeline", draw_slow_pipeline)`` in the
    notebook (fresh every run; the grader's run seeds it)."""
    return [int(rng.integers(3, 6 + 1)), int(rng.integers(4, 16 + 1)),
            float(rng.choice([1.5, 2.0, 2.5, 3.0]))]


def slow_last_stage(p, slowdown) -> dict:
    """The per-stage times of the exercise's pipeline: ``forward`` and ``backward`` lists."""
    return dict(forward=[1.0] * (p - 1) + [float(slowdown)],
                backward=[2.0] * (p - 1) + [2.0 * slowdown])


def _probe_slow_stage(idle, stages, micro_batches, slowdown) -> dict:
    """``idle``: the student's idle fraction; ``stages``, ``micro_batches``, ``slowdown``: the
    pipeline the notebook drew for this run."""
    return {"answer": idle, "p": stages, "m": micro_batches, "slowdown": slowdown}


def _judge_slow_stage(data) -> str:
    from course_lib.cost_models import bubble_fraction, idle_fraction, pipeline_timeline

    answer, p, m, slowdown = (data[k] for k in ("answer", "p", "m", "slowdown"))
    check_drawn("lesson05.slow_pipeline", draw_slow_pipeline, [p, m, slowdown])  # graded runs
    # the drawn pipeline, within bounds that keep the model's timeline small
    if not (isinstance(p, int) and isinstance(m, int) and is_number(slowdown)
            and not isinstance(p, bool) and not isinstance(m, bool)
            and 2 <= p <= 16 and 1 <= m <= 64 and 1 <= slowdown <= 10):
        raise ExerciseFailed(f"pass the pipeline drawn above (stages, micro-batches, slowdown), "
                             f"not {p!r}, {m!r}, {slowdown!r}")
    if not is_number(answer):
        raise ExerciseFailed(f"give the idle fraction as a number, not {answer!r}")
    times = slow_last_stage(p, slowdown)
    spans = pipeline_timeline(p, m, SCHEDULE, **times)
    right = idle_fraction(spans, p)
    makespan = max(start + duration for _, start, duration, _ in spans)
    balanced = bubble_fraction(p, m)
    if abs(answer - right) <= TOLERANCE:
        return (f"correct: {answer:.4f} (the model: {right:.4f}, a run of {makespan:g} units; "
                f"{p} equal stages would be idle {balanced:.4f})")
    if 1 < answer <= 100 and abs(answer / 100 - right) <= TOLERANCE:
        raise ExerciseFailed("give a fraction between 0 and 1, not a percentage")
    if not 0 <= answer < 1:
        raise ExerciseFailed(f"an idle fraction lies between 0 and 1, not {answer!r}")
    if abs(answer - balanced) <= TOLERANCE:
        raise ExerciseFailed(f"{answer:.4f} is (p - 1)/(m + p - 1), the bubble of {p} equal "
                             f"stages; here the last stage is slower and sets the pace")
    side = "low" if answer < right else "high"
    step = times["forward"][-1] + times["backward"][-1]
    raise ExerciseFailed(f"{answer:.4f} is too {side} for p = {p}, m = {m}, slowdown "
                         f"{slowdown:g} (tolerance {TOLERANCE}): the slow stage is busy {m} x "
                         f"{step:g} units; what must happen before its first step, and after "
                         f"its last?")


check_slow_stage_bubble = checked("lesson05.slow_stage_bubble", _probe_slow_stage,
                                  _judge_slow_stage)
check_slow_stage_bubble.__doc__ = """Check ``idle``, the idle fraction (idle stage time over p x
the run's length) of a 1F1B pipeline of ``stages`` stages and ``micro_batches`` micro-batches
whose last stage takes ``slowdown`` times as long (:func:`slow_last_stage`), against the model
timeline ``cost_models.pipeline_timeline`` of that pipeline, within :data:`TOLERANCE`:
``check_slow_stage_bubble(idle, stages, micro_batches, slowdown)``."""

# -- exercise 2: the gather of a column-parallel layer ------------------------------------------


def _case(seed, tokens, d_in, d_out):
    g = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    # r: the gradient of the loss with respect to the output; uneven, so that a slice taken
    # from the wrong place or a gradient summed over ranks shows
    return dict(x=draw(tokens, d_in), w=draw(d_out, d_in), b=draw(d_out), r=draw(tokens, d_out))


def cases_for(seed):
    """Visible: 6 tokens, 5 inputs, 8 outputs (4 per rank). A graded run adds a layer of other
    sizes drawn for that run."""
    cases = {"visible": _case(5, 6, 5, 8)}
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        tokens, d_in, half = (int(v) for v in torch.randint(2, 8, (3,), generator=g))
        cases["hidden"] = _case(seed % 10_000, tokens, d_in, 2 * half)
    return cases


def _column_parallel(gather, cases):
    """On every rank: this rank's block of output features, Y_r = f(X) W_r^T + b_r, then the
    student's ``gather.apply(Y_r)``, then the loss sum(Y * R) (the same on every rank) and its
    backward. The output, and the gradients of X and of this rank's shard."""
    import torch.distributed as dist

    from course_lib import tensor_parallel as tp

    rank, world, out = dist.get_rank(), dist.get_world_size(), {}
    for name, c in cases.items():
        k = len(c["b"]) // world
        w = c["w"][rank * k:(rank + 1) * k].clone().requires_grad_(True)
        b = c["b"][rank * k:(rank + 1) * k].clone().requires_grad_(True)
        x = c["x"].clone().requires_grad_(True)
        full = gather.apply(tp.f_operator(x, tp.new_counter()) @ w.T + b)
        if not isinstance(full, torch.Tensor):
            raise TypeError(f"forward returned a {type(full).__name__}, not a tensor")
        if full.shape == c["r"].shape:
            (full * c["r"]).sum().backward()
        out[name] = dict(out=full.detach(), x_grad=x.grad, w_grad=w.grad, b_grad=b.grad)
    return out


def probe_gather(gather) -> dict:
    cases = cases_for(hidden_seed())
    ranks = launch_checked(_column_parallel, 2, (gather, cases), timeout=60,
                           hint="does every rank make the same collective calls?")
    return {name: dict(case, ranks=[r[name] for r in ranks]) for name, case in cases.items()}


def _close(a, b) -> bool:
    if a is None or b is None:
        return False
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=0, atol=1e-9))


def _judge_gather_case(c) -> str | None:
    """What is wrong on one case, or None. The reference: the unsplit layer, by autograd."""
    x, w, b = (c[k].clone().requires_grad_(True) for k in ("x", "w", "b"))
    y = x @ w.T + b
    (y * c["r"]).sum().backward()
    if not (isinstance(c["ranks"], list) and len(c["ranks"]) == 2 and all(
            isinstance(got, dict) and {"out", "x_grad", "w_grad", "b_grad"} <= set(got)
            for got in c["ranks"])):
        return "expected the output and gradients of 2 ranks"
    world = len(c["ranks"])
    k = len(c["b"]) // world
    for rank, got in enumerate(c["ranks"]):
        cols = slice(rank * k, (rank + 1) * k)
        out = torch.as_tensor(got["out"])
        if out.shape != y.shape:
            return (f"on rank {rank} the gathered output has shape {tuple(out.shape)}, the "
                    f"layer's output {tuple(y.shape)}: put the {world} ranks' slices side by side "
                    f"along the last dimension")
        if not _close(out, y):
            flipped = torch.cat(list(y.detach().split(k, dim=-1))[::-1], dim=-1)
            if _close(out, flipped):
                return (f"the slices are in the wrong order: rank r's slice belongs in columns "
                        f"r*{k} to (r+1)*{k}")
            return f"on rank {rank} the gathered output is not the layer's output"
        if got["w_grad"] is None or got["x_grad"] is None:
            return (f"on rank {rank} the shard got no gradient: backward must return the "
                    f"gradient of forward's input")
        if not _close(got["w_grad"], w.grad[cols]):
            if _close(got["w_grad"], world * w.grad[cols]):
                return (f"the shard's gradient is {world} times too large: every rank already "
                        f"holds the whole output's gradient (each computes the same loss), so "
                        f"backward keeps this rank's slice and must not sum over the ranks")
            return (f"on rank {rank} the shard's gradient is wrong: backward must return the "
                    f"columns of the output's gradient that this rank's slice produced")
        if not (_close(got["b_grad"], b.grad[cols]) and _close(got["x_grad"], x.grad)):
            return f"on rank {rank} the bias' or the input's gradient is wrong"
    return None


def judge_gather(data) -> str:
    data = merged(cases_for(hidden_seed()), data, ("ranks",))  # the layers drawn here, not read
    wrong = _judge_gather_case(data["visible"])
    if wrong:
        raise ExerciseFailed(wrong)
    if "hidden" in data and _judge_gather_case(data["hidden"]):
        raise HiddenTestFailed("a hidden case failed")
    return ("correct: the column-parallel layer with your gather gives the unsplit layer's "
            "output and gradients on both ranks")


check_gather = checked("lesson05.gather", probe_gather, judge_gather)
check_gather.__doc__ = """Check ``gather``, an autograd function: ``forward(ctx, y_slice,
group=None)`` all-gathers each rank's slice of the output features and concatenates them (rank
order, last dimension); backward returns this rank's slice of the gradient. Calls
``gather.apply(y_slice)`` (no group: all ranks) in a column-parallel linear layer on 2 ranks and
compares with the unsplit layer."""
