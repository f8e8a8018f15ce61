"""Mixed-precision training with ``torch.amp``: fp32, bf16 and fp16 (with loss scaling).

The course article: FP16 and FP8 to cut compute and communication. Micikevicius et al. 2018:
keep fp32 **master weights**, run the matrix products in half precision, scale the loss so that
small gradients survive fp16. ``torch.autocast`` does the middle part: inside it, matrix
products run in the chosen half-precision type while the parameters stay fp32 and
precision-sensitive operations (the loss, softmax) stay fp32.
"""

from __future__ import annotations

import contextlib

import torch

from course_lib.loss_scaling import LossScaler
from course_lib.models import digits_mlp
from course_lib.runtime.timing import measure_interleaved
from course_lib.training import check_whole

PRECISIONS = ("fp32", "bf16", "fp16 + loss scaling", "fp16, no scaling")


def autocast(precision: str, device: str = "cpu"):
    """The context a precision runs its forward pass in: none for fp32, autocast otherwise."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: use one of {PRECISIONS}")
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def train(split, precision: str, *, epochs: int = 3, lr: float = 0.1, batch: int = 64,
          loss_factor: float = 1.0, init_scale: float = 2.0 ** 16, seed: int = 0,
          device: str = "cpu", model_fn=digits_mlp) -> dict:
    """Mini-batch SGD on ``split`` (train/test tensors) in one precision.

    The loss is multiplied by ``loss_factor`` and the learning rate divided by it: in exact
    arithmetic that changes nothing, in fp16 a small factor makes gradients underflow (a case
    built to fail without loss scaling). "fp16 + loss scaling" uses :class:`LossScaler`.
    Returns the training ``losses`` per step (unscaled), the ``scale`` per step, the
    ``skipped`` steps and the test ``accuracy`` before training and after every epoch.
    """
    check_whole("epochs", epochs, least=0)
    if check_whole("batch", batch) > len(split.y_train):
        raise ValueError(f"batch {batch} is larger than the {len(split.y_train)} training rows: "
                         f"short batches are dropped, so no step would be taken")
    if not 0 < loss_factor < float("inf"):
        raise ValueError(f"loss_factor must be positive and finite, got {loss_factor!r}")
    model = model_fn(seed=seed).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr / loss_factor)
    scaler = LossScaler(init_scale) if precision == "fp16 + loss scaling" else None
    x, y = split.x_train.to(device), split.y_train.to(device)
    x_test, y_test = split.x_test.to(device), split.y_test.to(device)
    g = torch.Generator().manual_seed(seed)

    def test_accuracy():
        with torch.no_grad(), autocast(precision, device):
            return (model(x_test).argmax(dim=1) == y_test).double().mean().item()

    log = dict(losses=[], scale=[], skipped=0, accuracy=[test_accuracy()])
    for _ in range(epochs):
        for rows in torch.randperm(len(x), generator=g).split(batch):
            rows = rows.to(device)
            if len(rows) < batch:
                continue  # drop the short last batch: a step on 3 samples can undo an epoch
            opt.zero_grad()
            with autocast(precision, device):
                loss = torch.nn.functional.cross_entropy(model(x[rows]), y[rows]) * loss_factor
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                log["skipped"] += not scaler.step(opt)
                log["scale"].append(scaler.scale_value)
                scaler.update()
            log["losses"].append(loss.item() / loss_factor)
        log["accuracy"].append(test_accuracy())
    return log


def gradient_values(model, x, y) -> dict:
    """The gradients of one batch, as fp32 vectors: of the ``weights`` (what the optimiser
    receives; a frozen parameter has none) and of the ``activations`` (what flows backwards
    through each ReLU's output, at any depth of the model; empty where no gradient reaches a
    ReLU)."""
    activations = []

    def keep_gradient(module, inputs, output):  # a forward hook must return None
        if output.requires_grad:  # below frozen layers only: no gradient flows there
            output.register_hook(activations.append)

    hooks = [m.register_forward_hook(keep_gradient) for m in model.modules()
             if isinstance(m, torch.nn.ReLU)]
    try:
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
    finally:
        for hook in hooks:
            hook.remove()
    return dict(weights=torch.cat([p.grad.flatten() for p in model.parameters()
                                   if p.grad is not None]),
                activations=torch.cat([a.flatten() for a in activations] or [torch.zeros(0)]))


def training_step(precision: str, *, device: str = "cpu", width: int = 1024, depth: int = 4,
                  batch: int = 256):
    """One forward-backward-update step of a matrix-product-heavy MLP in a precision, as a
    function to time (fresh model and random batch; the step is the same every call; its model
    is ``step.model``)."""
    model = digits_mlp(width=width, depth=depth, inputs=width).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device=device)
    y = torch.randint(10, (batch,), device=device)
    scaler = LossScaler() if precision.startswith("fp16 +") else None

    def step():
        opt.zero_grad()
        with autocast(precision, device):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    step.model = model  # what the step trains, for a look at it
    return step


def time_training_steps(precisions, *, device: str = "cpu", width: int = 1024, depth: int = 4,
                        batch: int = 256, repeats: int = 20, warmup: int = 3) -> dict:
    """Time a training step in each precision (precision -> ``Timing``), the precisions taking
    turns so that the machine's slow moments fall on all of them alike."""
    steps = {p: training_step(p, device=device, width=width, depth=depth, batch=batch)
             for p in precisions}
    return measure_interleaved(steps, repeats=repeats, warmup=warmup, device=device)
