"""Model parallelism by layers, and pipelines: GPipe and 1F1B, written by hand.

Course article: model parallelism (split the model, not the data); GPipe (Huang et al. 2019)
and 1F1B / PipeDream-Flush (Narayanan et al. 2021). A model is cut into p consecutive stages,
one per rank of ``group``; a batch is cut into m micro-batches. Stage s receives activations
from s - 1 and sends its outputs to s + 1; in the backward pass gradients flow the other way.
Idle time (the "bubble") is (p - 1) / (m + p - 1) of the total for both schedules
(``cost_models.bubble_fraction``; ``cost_models.pipeline_timeline`` models a run); 1F1B keeps
at most p micro-batches of activations alive instead of m.

A schedule is a list of ("forward", i) and ("backward", i) actions per stage; a :class:`Stage`
carries them out on its rank, each action one receive, one computation and one send.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from course_lib.runtime.devices import device
from course_lib.runtime.timing import Span, Timeline, synchronize, to_spans

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


def peak_live_activations(schedule) -> int:
    """Most micro-batches whose activations a stage holds at once under ``schedule``."""
    live = peak = 0
    for kind, _ in schedule:
        live += 1 if kind == "forward" else -1
        peak = max(peak, live)
    return peak


# -- a model cut into stages ----------------------------------------------------------------------


def split_into_stages(model: torch.nn.Sequential, p: int) -> list[torch.nn.Sequential]:
    """Cut a sequential model into p consecutive pieces of near-equal length;
    ``torch.nn.Sequential(*pieces)`` is the whole model again."""
    layers = list(model)
    if not 1 <= p <= len(layers):
        raise ValueError(f"cannot cut {len(layers)} layers into {p} stages")
    per_stage = -(-len(layers) // p)
    return [torch.nn.Sequential(*layers[s * per_stage:(s + 1) * per_stage]) for s in range(p)]


def reference_gradients(pieces, x, y):
    """Loss and gradients of the whole model on the whole batch, in one process."""
    model = torch.nn.Sequential(*pieces)
    model.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


def _output_width(piece) -> int:
    """Width of the activation a piece sends on: its last linear layer's outputs."""
    return [m for m in piece if isinstance(m, torch.nn.Linear)][-1].out_features


# -- one stage on its rank -------------------------------------------------------------------------


def _hold(seconds, start):
    """Pad a step to a fixed duration: steady stage times that CPU sharing cannot blur."""
    remaining = seconds - (time.time() - start)
    if seconds and remaining > 0:
        time.sleep(remaining)


class Stage:
    """Stage ``group rank`` of a pipeline over the pieces of one model, on this rank's device.

    The batch (x, y) is cut into ``micro_batches`` parts (sizes differing by at most one; each
    micro-batch's loss weighted by its size, so their sum is the batch's mean loss exactly).
    :meth:`forward` and :meth:`backward` carry out one action of a schedule;
    ``forward_seconds`` / ``backward_seconds`` pad every step to a fixed duration before its
    result is sent on (the real arithmetic still runs), so that stage times are steady even on
    shared cores.
    """

    def __init__(self, pieces, x, y, micro_batches: int, *, forward_seconds: float = 0.0,
                 backward_seconds: float = 0.0, group=None):
        self.group, self.dev = group, device(group)
        self.index, self.stages = dist.get_rank(group), dist.get_world_size(group)
        if len(pieces) != self.stages:
            raise ValueError(f"{len(pieces)} pieces for {self.stages} ranks: one piece per rank")
        if not 1 <= micro_batches <= len(x):
            raise ValueError(f"micro_batches must be between 1 and the batch size {len(x)}, got "
                             f"{micro_batches}: a micro-batch needs at least one example")
        self.module = pieces[self.index].to(self.dev)
        self.module.zero_grad()
        self.first, self.last = self.index == 0, self.index == self.stages - 1
        self.in_width = None if self.first else _output_width(pieces[self.index - 1])
        self.xs = x.to(self.dev).tensor_split(micro_batches)
        self.ys = y.to(self.dev).tensor_split(micro_batches)
        self.batch, self.hold = len(x), (forward_seconds, backward_seconds)
        self.saved = {}  # micro-batch -> (input, output): activations kept for the backward pass
        self.posted = {}  # receives already posted, with a send: key -> (buffer, request)
        self.pending, self.timeline, self.order = [], Timeline(self.index), []
        self.loss, self.micro_losses, self.live, self.peak = 0.0, [], 0, 0

    def forward(self, i: int, following=None) -> None:
        """Receive micro-batch i's activation from the previous stage, run this piece, send the
        output to the next stage (the last stage computes the loss instead)."""
        inp = self.xs[i] if self.first else self._receive(
            ("activation", i), self._activation_buffer(i), self.index - 1).requires_grad_(True)
        start = time.time()
        out = self.module(inp)
        if self.last:
            loss = torch.nn.functional.cross_entropy(out, self.ys[i])
            self.micro_losses.append(loss.item())
            out = loss * len(self.ys[i]) / self.batch  # weighted: they add up to the batch mean
            self.loss += out.item()
        self._done("forward", start)
        self.saved[i] = (inp, out)
        if not self.last:
            j = following[1] if following and following[0] == "backward" else None
            self._send(out.detach(), self.index + 1, None if j is None else (
                ("gradient", j), torch.empty_like(self.saved[j][1])))
        self.live += 1
        self.peak = max(self.peak, self.live)

    def backward(self, i: int, following=None) -> None:
        """Receive the gradient of micro-batch i's output from the next stage (the last stage
        starts from its loss), backpropagate through this piece, send the input's gradient to
        the previous stage. Parameter gradients accumulate over the micro-batches."""
        inp, out = self.saved.pop(i)
        grad_out = None if self.last else self._receive(("gradient", i), torch.empty_like(out),
                                                        self.index + 1)
        start = time.time()
        out.backward(grad_out)
        self._done("backward", start)
        if not self.first:
            k = following[1] if following and following[0] == "forward" else None
            self._send(inp.grad, self.index - 1, None if k is None else (
                ("activation", k), self._activation_buffer(k)))
        self.live -= 1

    def _activation_buffer(self, i):
        return torch.empty(len(self.xs[i]), self.in_width, dtype=self.xs[i].dtype,
                           device=self.dev)

    def _receive(self, key, buffer, peer):
        """Wait for a message (its receive may already be posted, with a send); "idle" span."""
        start = time.time()
        if key in self.posted:
            buffer, request = self.posted.pop(key)
            request.wait()
        else:
            dist.recv(buffer, group=self.group, group_src=peer)
        synchronize(self.dev)  # on a GPU the data is there once the copy has run
        self.timeline.add("idle", start)
        return buffer

    def _send(self, tensor, peer, then=None):
        """Send without waiting. With ``then`` = (key, buffer), post the next receive from the
        same peer in the same batch: between two stages a send and a receive cross, and NCCL
        needs them to travel together, or both stages can wait in their sends."""
        ops = [dist.P2POp(dist.isend, tensor, group=self.group, group_peer=peer)]
        if then is not None:
            ops.append(dist.P2POp(dist.irecv, then[1], group=self.group, group_peer=peer))
        requests = dist.batch_isend_irecv(ops)
        self.pending.append(requests[0])
        if then is not None:
            self.posted[then[0]] = (then[1], requests[1])

    def _done(self, kind, start):
        synchronize(self.dev)  # the step is done when its kernels are
        _hold(self.hold[kind == "backward"], start)
        self.timeline.add(kind, start)

    def result(self) -> dict:
        """Wait for the last sends; this stage's gradients, loss, action order and timeline."""
        for request in self.pending:
            request.wait()
        return dict(stage=self.index, grads=[p.grad.clone() for p in self.module.parameters()],
                    loss=self.loss if self.last else None, micro_losses=self.micro_losses,
                    order=self.order, timeline=self.timeline, peak_activations=self.peak)


def run_schedule(stage: Stage, actions) -> dict:
    """Carry out a schedule's actions on this stage, in order (each learns what follows it,
    so that its send can travel with the next receive)."""
    for (kind, i), following in zip(actions, [*actions[1:], None], strict=True):
        stage.order.append((kind, i))
        if kind == "forward":
            stage.forward(i, following)
        else:
            stage.backward(i, following)
    return stage.result()


def run_pipeline(pieces, x, y, micro_batches: int, schedule: str = "1F1B", *,
                 forward_seconds: float = 0.0, backward_seconds: float = 0.0,
                 warmup_rounds: int = 0, group=None) -> dict:
    """Run on every rank of ``group``: rank s is stage s of ``pieces``, following ``schedule``
    ("GPipe" or "1F1B") over ``micro_batches`` parts of the batch (x, y).

    ``warmup_rounds`` runs the whole schedule that many times first, untimed (the first
    backward pass in a process pays for setting autograd up). Returns :meth:`Stage.result`.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: use one of {sorted(SCHEDULES)}")
    for _ in range(warmup_rounds + 1):
        dist.barrier(group=group)  # every round starts together
        stage = Stage(pieces, x, y, micro_batches, forward_seconds=forward_seconds,
                      backward_seconds=backward_seconds, group=group)
        actions = SCHEDULES[schedule](stage.index, stage.stages, micro_batches)
        result = run_schedule(stage, actions)
    return result


def _first_computation(results) -> float:
    return min(start for r in results for kind, start, _ in r["timeline"].records
               if kind != "idle")


def measured_bubble(results) -> float:
    """Idle fraction of a measured run: over all stages, the share of the pipeline's span in
    which a stage was not computing. The span runs from the first computation (stage 0's first
    forward) to the last: a rank that reached the loop early and waited for the others to
    start is not part of the pipeline's bubble."""
    t1 = max(end for r in results for kind, _, end in r["timeline"].records if kind != "idle")
    busy = sum(r["timeline"].busy() for r in results)
    return 1.0 - busy / (len(results) * (t1 - _first_computation(results)))


def pipeline_spans(results) -> list[Span]:
    """Spans for ``plots.plot_gantt``, time 0 at the pipeline's first computation: forward,
    backward, and "idle" while a stage waits for a message (waits before then are cut off)."""
    return to_spans([r["timeline"] for r in results], origin=_first_computation(results))


def run_torch_pipeline(pieces, x, y, micro_batches: int, schedule: str = "1F1B",
                       group=None) -> dict:
    """The same pipeline with ``torch.distributed.pipelining``: a ``PipelineStage`` per rank and
    ``ScheduleGPipe`` or ``Schedule1F1B``. Returns the per-micro-batch losses (last stage) and
    this stage's gradients, to compare with :func:`run_pipeline`."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    if len(x) % micro_batches:
        raise ValueError(f"torch.distributed.pipelining cuts the batch into micro-batches and "
                         f"averages their losses with equal weights: a batch of {len(x)} does "
                         f"not divide into {micro_batches} equal parts; choose a divisor of "
                         f"{len(x)} (run_pipeline weights unequal micro-batches itself)")
    stage, stages, dev = dist.get_rank(group), dist.get_world_size(group), device(group)
    module = pieces[stage].to(dev)
    module.zero_grad()
    pipe_stage = PipelineStage(module, stage, stages, dev, group=group)
    kind = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}[schedule]
    runner = kind(pipe_stage, micro_batches, loss_fn=torch.nn.functional.cross_entropy)
    losses = []
    if stage == 0:
        runner.step(x.to(dev))
    elif stage == stages - 1:
        runner.step(target=y.to(dev), losses=losses)
    else:
        runner.step()
    return dict(stage=stage, micro_losses=[loss.item() for loss in losses],
                grads=[p.grad.detach().clone() for p in module.parameters()])
