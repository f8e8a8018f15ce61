"""Model parallelism by layers, and pipelines: GPipe and 1F1B, written by hand.

Course article: model parallelism (split the model, not the data); GPipe (Huang et al. 2019)
and 1F1B / PipeDream-Flush (Narayanan et al. 2021). A model is cut into p consecutive stages,
one per rank of ``group``; a batch is cut into m micro-batches. Stage s receives activations
(any shape) from s - 1 and sends its outputs to s + 1; gradients flow back. Idle time (the
"bubble") is (p - 1) / (m + p - 1) of the total for both schedules (``bubble_fraction``;
``cost_models.pipeline_timeline`` models a run); 1F1B keeps p micro-batches' activations, not m.
A schedule is a list of ("forward", i) and ("backward", i) actions per stage; a :class:`Stage`
carries them out on its rank, each action one receive, one computation and one send.

Lesson 5's pipelines, GPipe and 1F1B on one MLP cut into p stages, against one process, with
their measured bubble and the formula (each forward padded to 10 ms, each backward to 20)::

    python -m course_lib.pipeline --world-size 2 [--micro-batches 4] [--forward-ms 10]
    torchrun --standalone --nproc-per-node 2 -m course_lib.pipeline
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from course_lib.cost_models import bubble_fraction
from course_lib.models import mlp
from course_lib.pipeline_schedules import (  # noqa: F401  (pp.gpipe_schedule ...: the lessons')
    SCHEDULES,
    gpipe_schedule,
    one_f_one_b_schedule,
    peak_live_activations,
)
from course_lib.pipelining import run_torch_pipeline  # noqa: F401  (pp.run_torch_pipeline)
from course_lib.runtime.devices import device
from course_lib.runtime.timing import Span, Timeline, synchronize, to_spans
from course_lib.runtime.torchrun import run_command, run_main
from course_lib.training import is_whole

# -- a model cut into stages ----------------------------------------------------------------------


def split_into_stages(model: torch.nn.Sequential, p: int) -> list[torch.nn.Sequential]:
    """Cut a sequential model into p consecutive pieces whose lengths differ by at most one (the
    first ones longer); ``torch.nn.Sequential(*pieces)`` is the whole model again."""
    layers = list(model)
    if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= len(layers):
        raise ValueError(f"cannot cut {len(layers)} layers into {p!r} stages: p must be a whole "
                         f"number from 1 to {len(layers)}")
    ends = [s * (len(layers) // p) + min(s, len(layers) % p) for s in range(p + 1)]
    return [torch.nn.Sequential(*layers[a:b]) for a, b in zip(ends[:-1], ends[1:], strict=True)]


def reference_gradients(pieces, x, y):
    """Loss and gradients of the whole model on the whole batch, in one process."""
    model = torch.nn.Sequential(*pieces)
    model.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.item(), [None if p.grad is None else p.grad.clone()  # None: frozen, as in torch
                         for p in model.parameters()]


def activation_shape(pieces, micro_batch) -> tuple[torch.Size, torch.dtype]:
    """Shape and dtype of what ``pieces`` (the stages before one) send for ``micro_batch``: they
    run on meta tensors (shapes without data: no weight is copied, no statistic changes).
    Refused, with the layer's error, where they cannot run so or return no tensor."""
    model = torch.nn.Sequential(*pieces)
    ghosts = {name: torch.empty_like(t, device="meta") for name, t in
              [*model.named_parameters(), *model.named_buffers()]}
    try:
        with torch.no_grad():
            out = torch.func.functional_call(model, ghosts, torch.empty(
                micro_batch.shape, dtype=micro_batch.dtype, device="meta"))
        return out.shape, out.dtype
    except (RuntimeError, NotImplementedError, TypeError, AttributeError) as error:
        raise ValueError(f"cannot find the shape of the one tensor stage {len(pieces)} receives: "
                         f"the stages before it fail on the meta device ({error})") from error


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
    :meth:`forward` and :meth:`backward` carry out one action of a schedule; ``forward_seconds``
    / ``backward_seconds`` pad every step to a fixed duration before its result is sent on (the
    real arithmetic still runs): steady stage times even on shared cores."""

    def __init__(self, pieces, x, y, micro_batches: int, *, forward_seconds: float = 0.0,
                 backward_seconds: float = 0.0, group=None):
        self.group, self.dev = group, device(group)
        self.index, self.stages = dist.get_rank(group), dist.get_world_size(group)
        if len(pieces) != self.stages:
            raise ValueError(f"{len(pieces)} pieces for {self.stages} ranks: one piece per rank")
        if not is_whole(micro_batches) or not 1 <= micro_batches <= len(x):
            raise ValueError(f"micro_batches must be a whole number between 1 and the batch size "
                             f"{len(x)}, got {micro_batches!r}: a micro-batch needs an example")
        self.module = pieces[self.index].to(self.dev)
        self.module.zero_grad()
        self.first, self.last = self.index == 0, self.index == self.stages - 1
        self.xs = x.to(self.dev).tensor_split(micro_batches)
        self.in_shapes = {} if self.first else {  # micro-batch length -> what it receives
            n: activation_shape(pieces[:self.index], xs)  # two lengths at most
            for n, xs in {len(xs): xs for xs in self.xs}.items()}
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
        if out.requires_grad or self.last:  # a first stage that is all frozen has nothing to do
            out.backward(grad_out)
        self._done("backward", start)
        if not self.first:
            k = following[1] if following and following[0] == "forward" else None
            self._send(inp.grad, self.index - 1, None if k is None else (
                ("activation", k), self._activation_buffer(k)))
        self.live -= 1

    def _activation_buffer(self, i):
        shape, dtype = self.in_shapes[len(self.xs[i])]  # two lengths at most
        return torch.empty(shape, dtype=dtype, device=self.dev)

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
        grads = [None if p.grad is None else p.grad.clone() for p in self.module.parameters()]
        return dict(stage=self.index, grads=grads,
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
        stage = Stage(pieces, x, y, micro_batches, forward_seconds=forward_seconds,
                      backward_seconds=backward_seconds, group=group)
        dist.barrier(group=group)  # every round starts together, its stages built
        actions = SCHEDULES[schedule](stage.index, stage.stages, micro_batches)
        result = run_schedule(stage, actions)
    return result


def _first_computation(results) -> float:
    return min(start for r in results for kind, start, _ in r["timeline"].records if kind != "idle")


def measured_bubble(results) -> float:
    """Idle fraction of a measured run: over all stages, the share of the pipeline's span (first
    computation to last: waiting for the others to start is not bubble) spent not computing."""
    t1 = max(end for r in results for kind, _, end in r["timeline"].records if kind != "idle")
    busy = sum(r["timeline"].busy() for r in results)
    return 1.0 - busy / (len(results) * (t1 - _first_computation(results)))


def pipeline_spans(results) -> list[Span]:
    """Spans for ``plots.plot_gantt``, time 0 at the pipeline's first computation: forward,
    backward, and "idle" while a stage waits for a message (waits before then are cut off)."""
    return to_spans([r["timeline"] for r in results], origin=_first_computation(results))


# -- lesson 5's pipelines, as a command ------------------------------------------------------------


def lesson_setup(stages: int):
    """Lesson 5's MLP (64-32-32-32-10, tanh, float64) in ``stages`` pieces; 32 examples."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 64, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (32,), generator=g)
    model = mlp((64, 32, 32, 32, 10), activation=torch.nn.Tanh, dtype=torch.float64)
    return split_into_stages(model, stages), x, y


def both_schedules(micro_batches: int = 4, forward_ms: float = 10, backward_ms: float = 20,
                   group=None) -> dict:
    """On every rank of ``group`` (stage = rank): {schedule: :meth:`Stage.result`} of both on the
    lesson's MLP, each after one untimed round."""
    pieces, x, y = lesson_setup(dist.get_world_size(group))
    return {name: run_pipeline(pieces, x, y, micro_batches, name, warmup_rounds=1, group=group,
                               forward_seconds=forward_ms / 1e3,
                               backward_seconds=backward_ms / 1e3) for name in SCHEDULES}


def main(argv=None):
    args, results = run_command(
        both_schedules, "Lesson 5: GPipe and 1F1B by hand, against one process, and their bubble",
        (("--micro-batches", int, 4),
         ("--forward-ms", float, 10, {"help": "each forward padded to"}),
         ("--backward-ms", float, 20, {"help": "each backward padded to"})), argv)
    if results is not None:  # the launcher, or rank 0 under torchrun
        p, m = len(results), args.micro_batches
        loss, grads = reference_gradients(*lesson_setup(p))
        print(f"p = {p} stages, m = {m} micro-batches; every forward padded to "
              f"{args.forward_ms:g} ms, every backward to {args.backward_ms:g} ms")
        for name in SCHEDULES:
            runs = [r[name] for r in results]
            gap = max((a - b).abs().max().item()
                      for a, b in zip([g for r in runs for g in r["grads"]], grads, strict=True))
            print(f"{name}: loss {runs[-1]['loss']:.12f}, one process {loss:.12f}; largest "
                  f"gradient gap {gap:.1e}; activations held at most, per stage "
                  f"{[r['peak_activations'] for r in runs]}")
            print(f"{name}: measured idle fraction {measured_bubble(runs):.3f}; formula "
                  f"(p-1)/(m+p-1) = {bubble_fraction(p, m):.3f}")
    return results


if __name__ == "__main__":
    run_main(main)
