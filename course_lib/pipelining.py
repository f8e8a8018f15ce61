"""The pipeline of :mod:`course_lib.pipeline`, run by PyTorch's ``torch.distributed.pipelining``.

Lesson 5, section 5: ``PipelineStage`` wraps each stage's module and a schedule object
(``ScheduleGPipe``, ``Schedule1F1B``) runs the same algorithms as the hand-written ones; per
micro-batch its losses equal theirs. ``pipeline.run_torch_pipeline`` is this function.
:mod:`course_lib.train_gpt` cuts its GPT into stages here (:class:`StageModule`, each block
split over the tensor-parallel group) and runs them with 1F1B (:func:`one_f_one_b`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.runtime.devices import device
from course_lib.tensor_parallel import ParallelBlock, causal_attention
from course_lib.training import check_whole


def run_torch_pipeline(pieces, x, y, micro_batches: int, schedule: str = "1F1B",
                       group=None) -> dict:
    """The same pipeline with ``torch.distributed.pipelining``: a ``PipelineStage`` per rank and
    ``ScheduleGPipe`` or ``Schedule1F1B``. Returns the per-micro-batch losses (last stage) and
    this stage's gradients, to compare with :func:`run_pipeline`."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    kinds = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}
    if schedule not in kinds:
        raise ValueError(f"unknown schedule {schedule!r}: use one of {sorted(kinds)}")
    if len(x) % check_whole("micro_batches", micro_batches):
        raise ValueError(f"torch.distributed.pipelining cuts the batch into micro-batches and "
                         f"averages their losses with equal weights: a batch of {len(x)} does "
                         f"not divide into {micro_batches} equal parts; choose a divisor of "
                         f"{len(x)} (run_pipeline weights unequal micro-batches itself)")
    stage, stages, dev = dist.get_rank(group), dist.get_world_size(group), device(group)
    if len(pieces) != stages:
        raise ValueError(f"{len(pieces)} pieces for {stages} ranks: one piece per rank")
    module = pieces[stage].to(dev)
    module.zero_grad()
    pipe_stage = PipelineStage(module, stage, stages, dev, group=group)
    runner = kinds[schedule](pipe_stage, micro_batches, loss_fn=torch.nn.functional.cross_entropy)
    losses = []
    inputs = (x.to(dev),) if stage == 0 else ()
    labels = dict(target=y.to(dev), losses=losses) if stage == stages - 1 else {}
    runner.step(*inputs, **labels)  # one stage (p = 1) takes both
    return dict(stage=stage, micro_losses=[loss.item() for loss in losses],
                grads=[None if p.grad is None else p.grad.detach().clone()  # None: frozen
                       for p in module.parameters()])


class StageModule(torch.nn.Module):
    """Pipeline stage ``stage`` of ``pp``: the embeddings on the first, its share of the blocks
    (each split over the tensor-parallel group), the final norm and head on the last.
    ``positions``: where this rank's tokens sit in the sequence (None: all of it, in order);
    ``attend``: each block's attention (``ParallelBlock``). ``compute_dtype``: torch.bfloat16
    computes under ``torch.autocast`` (mixed precision: the parameters stay as they are, the
    output comes back in float32); None: in the parameters' dtype."""

    def __init__(self, gpt, stage: int, pp: int, tp_rank: int, tp: int, tp_group=None,
                 recompute: bool = False, positions=None, attend=causal_attention,
                 compute_dtype=None):
        super().__init__()
        self.compute_dtype = compute_dtype
        if not 1 <= pp <= len(gpt.blocks) or len(gpt.blocks) % pp:
            raise ValueError(f"pp = {pp} stages cannot share {len(gpt.blocks)} blocks equally: "
                             f"choose a pp that divides {len(gpt.blocks)}")
        per = len(gpt.blocks) // pp
        self.first, self.last, self.recompute = stage == 0, stage == pp - 1, recompute
        self.positions = positions
        if self.first:
            self.embed, self.position = gpt.embed, gpt.position
        self.blocks = torch.nn.ModuleList(ParallelBlock(b, tp_rank, tp, tp_group, attend)
                                          for b in gpt.blocks[stage * per:(stage + 1) * per])
        if self.last:
            self.norm, self.head = gpt.norm, gpt.head

    def forward(self, x):
        if self.compute_dtype is None:
            return self.layers(x)
        with torch.autocast(x.device.type, dtype=self.compute_dtype):
            return self.layers(x).float()

    def layers(self, x):
        """This stage's embeddings, blocks and head, in order."""
        if self.first:
            where = (torch.arange(x.shape[1]) if self.positions is None else self.positions)
            x = self.embed(x) + self.position(where.to(x.device))
        for block in self.blocks:
            if self.recompute and torch.is_grad_enabled():  # keep each block's input only
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.norm(x)) if self.last else x


def one_f_one_b(stage, s: int, pp: int, dev, group, micro_batches: int, loss_fn, dtype, shape):
    """1F1B over ``pp`` stages for this rank's ``stage`` (stage ``s``): ``shape`` is (sequences
    per micro-batch, tokens of each on this rank, width, vocabulary). Every shape is given:
    otherwise the stage infers them by running the first micro-batch, and the first stage then
    keeps that forward's activations for the whole run."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    mb, ctx, width, vocab = shape
    meta = lambda *size: torch.empty(*size, dtype=dtype, device="meta")  # noqa: E731
    first, last = s == 0, s == pp - 1
    piped = PipelineStage(
        stage, s, pp, dev, group=group,
        input_args=torch.empty(mb, ctx, dtype=torch.long, device="meta") if first else
        meta(mb, ctx, width).requires_grad_(),
        output_args=meta(mb, ctx, vocab if last else width),
        output_grads=None if last else meta(mb, ctx, width),
        input_grads=None if first else meta(mb, ctx, width))
    return Schedule1F1B(piped, micro_batches, loss_fn=loss_fn)
