"""The pipeline of :mod:`course_lib.pipeline`, run by PyTorch's ``torch.distributed.pipelining``.

Lesson 5, section 5: ``PipelineStage`` wraps each stage's module and a schedule object
(``ScheduleGPipe``, ``Schedule1F1B``) runs the same algorithms as the hand-written ones; per
micro-batch its losses equal theirs. ``pipeline.run_torch_pipeline`` is this function.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.runtime.devices import device


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
