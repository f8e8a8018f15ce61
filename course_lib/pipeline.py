"""Model parallelism by layers, and pipelines: GPipe and 1F1B, written by hand.

Course article: model parallelism (split the model, not the data); GPipe (Huang et al. 2019)
and 1F1B / PipeDream-Flush (Narayanan et al. 2021). A model is cut into p consecutive stages,
one per rank; a batch is cut into m micro-batches. Stage s receives activations from s - 1 and
sends its outputs to s + 1; in the backward pass gradients flow the other way. Idle time (the
"bubble") is (p - 1) / (m + p - 1) of the total for both schedules; 1F1B keeps at most p
micro-batches of activations alive instead of m.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

# -- the schedules: who does what, in which order ----------------------------------------------


def gpipe_schedule(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """GPipe: all forward passes, then all backward passes."""
    del stage, stages  # every stage does the same
    forwards = [("forward", i) for i in range(micro_batches)]
    backwards = [("backward", i) for i in range(micro_batches)]
    return forwards + backwards


def one_f_one_b_schedule(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """1F1B: a few forwards to fill the pipe, then alternate one forward and one backward, then
    drain. Stage s starts p - s - 1 forwards ahead, so the last stage alternates at once."""
    warmup = min(stages - stage - 1, micro_batches)
    actions = [("forward", i) for i in range(warmup)]  # warm-up forward passes
    forward, backward = warmup, 0
    while forward < micro_batches:  # 1F1B steady state
        actions.append(("forward", forward))
        forward += 1
        actions.append(("backward", backward))
        backward += 1
    while backward < micro_batches:  # cool-down backward passes
        actions.append(("backward", backward))
        backward += 1
    return actions


SCHEDULES = {"GPipe": gpipe_schedule, "1F1B": one_f_one_b_schedule}


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The idle fraction of a pipeline flush: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def peak_live_activations(schedule) -> int:
    """Most micro-batches whose activations a stage holds at once under ``schedule``."""
    live = peak = 0
    for kind, _ in schedule:
        live += 1 if kind == "forward" else -1
        peak = max(peak, live)
    return peak


def simulate_schedule(stages: int, micro_batches: int, schedule: str = "1F1B",
                      forward: float = 1.0, backward: float = 2.0) -> list[tuple]:
    """A model (not a measurement) of a pipeline run: every forward takes ``forward`` time units,
    every backward ``backward``, messages are free. A stage runs its schedule in order; an
    action starts when the stage is free and its input is there (forward i on stage s needs
    forward i on s - 1; backward i needs backward i on s + 1, or on the last stage its own
    forward i). Returns Gantt spans (stage, start, duration, kind)."""
    orders = [SCHEDULES[schedule](s, stages, micro_batches) for s in range(stages)]
    done = {}  # (kind, stage, micro-batch) -> finish time
    free = [0.0] * stages
    position = [0] * stages
    spans = []
    while any(position[s] < len(orders[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            if position[s] == len(orders[s]):
                continue
            kind, i = orders[s][position[s]]
            if kind == "forward":
                needs = ("forward", s - 1, i) if s > 0 else None
            else:
                needs = ("backward", s + 1, i) if s < stages - 1 else ("forward", s, i)
            if needs is not None and needs not in done:
                continue  # its input is not there yet
            start = max(free[s], done.get(needs, 0.0))
            duration = forward if kind == "forward" else backward
            done[(kind, s, i)] = free[s] = start + duration
            spans.append((s, start, duration, kind))
            position[s] += 1
            progressed = True
        if not progressed:  # pragma: no cover - a schedule that waits for itself
            raise RuntimeError(f"{schedule} deadlocks with p={stages}, m={micro_batches}")
    return spans


def simulated_bubble(spans, stages: int) -> float:
    """Idle fraction of simulated spans: 1 - busy / (stages x makespan)."""
    makespan = max(start + duration for _, start, duration, _ in spans)
    return 1.0 - sum(duration for _, _, duration, _ in spans) / (stages * makespan)


# -- a model cut into stages ----------------------------------------------------------------------


def mlp_stages(stages: int, width: int = 32, layers_per_stage: int = 2, d_in: int = 64,
               classes: int = 10, seed: int = 0, dtype=torch.float64) -> list[torch.nn.Module]:
    """An MLP cut into ``stages`` consecutive pieces; ``torch.nn.Sequential(*pieces)`` is the
    whole model. The same seed gives the same weights on every rank."""
    torch.manual_seed(seed)
    sizes = [d_in] + [width] * (stages * layers_per_stage - 1) + [classes]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1], dtype=dtype))
        if i < len(sizes) - 2:
            layers.append(torch.nn.Tanh())
    per_stage = len(layers) // stages + (len(layers) % stages > 0)
    return [torch.nn.Sequential(*layers[s * per_stage:(s + 1) * per_stage])
            for s in range(stages)]


def reference_gradients(pieces, x, y):
    """Loss and gradients of the whole model on the whole batch, in one process."""
    model = torch.nn.Sequential(*pieces)
    model.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


# -- running a schedule on real ranks -------------------------------------------------------------


def _hold(seconds, start):
    """Pad a step to a fixed duration: steady stage times that CPU sharing cannot blur."""
    if seconds:
        remaining = seconds - (time.time() - start)
        if remaining > 0:
            time.sleep(remaining)


def run_pipeline(pieces, x, y, micro_batches: int, schedule: str = "1F1B", *,
                 forward_seconds: float = 0.0, backward_seconds: float = 0.0,
                 warmup_rounds: int = 0) -> dict:
    """Run on every rank (through ``launch``): rank s is stage s of ``pieces``.

    The batch (x, y) is cut into ``micro_batches`` equal parts; each stage carries out its
    schedule with point-to-point messages (activations forward, gradients backward) and
    accumulates gradients over the micro-batches. ``forward_seconds`` / ``backward_seconds`` pad
    every forward / backward step to a fixed duration before its result is sent on (the real
    arithmetic still runs), so that stage times are steady even on shared cores.
    ``warmup_rounds`` runs the whole schedule that many times first, untimed (the first
    backward pass in a process pays for setting autograd up).

    Returns: the stage's parameter gradients, the loss (last stage), the order of actions, a
    timeline of (kind, micro-batch, start, end) with "idle" spans for waiting on a message, and
    the peak number of micro-batches whose activations were held.
    """
    stage, stages = dist.get_rank(), dist.get_world_size()
    if len(pieces) != stages:
        raise ValueError(f"{len(pieces)} pieces for {stages} ranks: one piece per rank")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: use one of {sorted(SCHEDULES)}")
    for _ in range(warmup_rounds + 1):
        dist.barrier()  # every round starts together
        result = _one_round(pieces[stage], pieces, x, y, micro_batches,
                            SCHEDULES[schedule](stage, stages, micro_batches),
                            forward_seconds, backward_seconds)
    return result


def _one_round(module, pieces, x, y, micro_batches, actions, forward_seconds,
               backward_seconds):
    stage, stages = dist.get_rank(), dist.get_world_size()
    module.zero_grad()
    xs, ys = x.tensor_split(micro_batches), y.tensor_split(micro_batches)
    first, last = stage == 0, stage == stages - 1
    width = _activation_width(pieces, stage)
    saved = {}  # micro-batch -> (input, output): the activations kept for the backward pass
    pending, timeline, order = [], [], []
    loss_total, live, peak, micro_losses = 0.0, 0, 0, []
    for kind, i in actions:
        order.append((kind, i))
        if kind == "forward":
            if first:
                inp = xs[i]
            else:
                inp = torch.empty(len(xs[i]), width, dtype=x.dtype)
                t0 = time.time()
                dist.recv(inp, stage - 1)  # wait for the previous stage's activation
                timeline.append(("idle", i, t0, time.time()))
                inp.requires_grad_(True)
            t0 = time.time()
            out = module(inp)
            if last:
                loss = torch.nn.functional.cross_entropy(out, ys[i])
                micro_losses.append(loss.item())
                out = loss / micro_batches  # the mean over micro-batches is the batch's loss
                loss_total += out.item()
            _hold(forward_seconds, t0)
            if not last:
                pending.append(dist.isend(out.detach(), stage + 1))
            timeline.append(("forward", i, t0, time.time()))
            saved[i] = (inp, out)
            live += 1
            peak = max(peak, live)
        else:
            inp, out = saved.pop(i)
            grad_out = None
            if not last:
                grad_out = torch.empty_like(out)
                t0 = time.time()
                dist.recv(grad_out, stage + 1)  # wait for the next stage's gradient
                timeline.append(("idle", i, t0, time.time()))
            t0 = time.time()
            out.backward(grad_out)  # accumulates this micro-batch's parameter gradients
            _hold(backward_seconds, t0)
            if not first:
                pending.append(dist.isend(inp.grad, stage - 1))
            timeline.append(("backward", i, t0, time.time()))
            live -= 1
    for request in pending:
        request.wait()
    return dict(stage=stage, grads=[p.grad.clone() for p in module.parameters()],
                loss=loss_total if last else None, micro_losses=micro_losses, order=order,
                timeline=timeline, peak_activations=peak)


def _activation_width(pieces, stage):
    """Width of the activation a stage receives: the previous piece's last linear layer."""
    if stage == 0:
        return None
    linears = [m for m in pieces[stage - 1] if isinstance(m, torch.nn.Linear)]
    return linears[-1].out_features


def measured_bubble(results) -> float:
    """Idle fraction of a measured run: over all stages, the share of the pipeline's span in
    which a stage was not computing. The span runs from the first computation (stage 0's first
    forward) to the last: a rank that reached the loop early and waited for the others to
    start is not part of the pipeline's bubble."""
    spans = [(start, end) for r in results for kind, _, start, end in r["timeline"]
             if kind != "idle"]
    t0, t1 = min(s for s, _ in spans), max(e for _, e in spans)
    busy = [sum(end - start for kind, _, start, end in r["timeline"] if kind != "idle")
            for r in results]
    return 1.0 - sum(busy) / (len(results) * (t1 - t0))


def pipeline_spans(results) -> list[tuple]:
    """(stage, start, duration, kind) spans for ``plots.plot_gantt``, relative to the pipeline's
    first computation: forward, backward, and "idle" while a stage waits for a message (waits
    before the pipeline started are cut off)."""
    t0 = min(start for r in results for kind, _, start, _ in r["timeline"] if kind != "idle")
    spans = []
    for r in results:
        for kind, _, start, end in r["timeline"]:
            start = max(start, t0)
            if end > start:
                spans.append((r["stage"], start - t0, end - start, kind))
    return spans


def run_torch_pipeline(pieces, x, y, micro_batches: int, schedule: str = "1F1B") -> dict:
    """The same pipeline with ``torch.distributed.pipelining``: a ``PipelineStage`` per rank and
    ``ScheduleGPipe`` or ``Schedule1F1B``. Returns the per-micro-batch losses (last stage) and
    this stage's gradients, to compare with :func:`run_pipeline`."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    stage, stages = dist.get_rank(), dist.get_world_size()
    module = pieces[stage]
    module.zero_grad()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
        else torch.device("cpu")
    pipe_stage = PipelineStage(module.to(device), stage, stages, device)
    kind = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}[schedule]
    runner = kind(pipe_stage, micro_batches, loss_fn=torch.nn.functional.cross_entropy)
    losses = []
    if stage == 0:
        runner.step(x.to(device))
    elif stage == stages - 1:
        runner.step(target=y.to(device), losses=losses)
    else:
        runner.step()
    return dict(stage=stage, micro_losses=[loss.item() for loss in losses],
                grads=[p.grad.detach().cpu().clone() for p in module.parameters()])
