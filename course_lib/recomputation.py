"""Activation recomputation (gradient checkpointing): trade a second forward pass for memory.

Lecture: backpropagation (lecture note, section 3: the backward pass needs every layer's input,
so the forward pass keeps them) and its cost at scale (Chen et al. 2016, "Training deep nets
with sublinear memory cost"; Korthikanti et al. 2022 for a transformer's activation bytes).
With ``torch.utils.checkpoint`` a block keeps only its input; backward runs the block's forward
again to get the rest.
"""

from __future__ import annotations

import numbers
import time

import torch

from course_lib.memory import SavedBytes
from course_lib.training import check_whole, loss_fn


def _check_sizes(**sizes) -> None:
    """Whole numbers (ints or numpy's): ``tokens`` and ``layers`` >= 0, the other sizes >= 1."""
    for name, n in sizes.items():
        least = 0 if name in ("tokens", "layers") else 1
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < least:
            raise ValueError(f"{name} must be a whole number >= {least}, got {n!r}")


def block_activation_floats(d_model: int, heads: int) -> int:
    """Numbers one pre-norm block of :class:`course_lib.models.TinyGPT` keeps per token for
    backward: its input and LayerNorm's output (d each), q, k, v (3d), attention's output (d;
    the projection reads it in place), the residual sum and the second norm's output (2d), the
    MLP's hidden layer before and after GeLU (4d each): 16 d, plus per-token statistics (two
    LayerNorms' mean and 1/std, attention's log-sum-exp per head)."""
    _check_sizes(d_model=d_model, heads=heads)
    return 16 * d_model + 4 + heads


def activation_bytes(tokens: int, d_model: int, layers: int, heads: int, vocab: int,
                     checkpointing: bool = False, element_size: int = 4) -> int:
    """Bytes a TinyGPT forward pass keeps for backward for ``tokens`` tokens (batch x context):
    every block's activations, or with checkpointing each block's input only; plus the head
    (final norm's input and output, its statistics, and the log-softmax of the logits)."""
    _check_sizes(tokens=tokens, d_model=d_model, layers=layers, heads=heads, vocab=vocab,
                 element_size=element_size)
    if not isinstance(checkpointing, bool):
        raise ValueError(f"checkpointing is True or False, got {checkpointing!r}")
    per_block = d_model if checkpointing else block_activation_floats(d_model, heads)
    head = 2 * d_model + 2 + vocab
    return tokens * (layers * per_block + head) * element_size


def peak_activation_bytes(tokens: int, d_model: int, layers: int, heads: int, vocab: int,
                          checkpointing: bool = False, element_size: int = 4) -> int:
    """The most activation bytes alive at once in a step: all of them at the end of forward;
    with checkpointing, the kept inputs plus one block's activations while backward recomputes
    it (Chen et al. 2016: with sqrt(L) segments, O(sqrt(L)) memory for one extra forward)."""
    kept = activation_bytes(tokens, d_model, layers, heads, vocab, checkpointing, element_size)
    if not checkpointing or not layers:  # no block: nothing to recompute
        return kept
    return kept + tokens * block_activation_floats(d_model, heads) * element_size


def saved_bytes(model, x, y) -> int:
    """Measured: the bytes of the tensors autograd saves in a forward pass (each storage
    counted once; the parameters, which are saved too but exist anyway, left out): what
    :class:`course_lib.memory.SavedBytes` holds when the forward pass ends."""
    saved = SavedBytes()
    with saved.hooks():
        loss = loss_fn(model, x, y)
    held = saved.now
    loss.backward()
    return held


def peak_step_memory(model, x, y) -> dict:
    """Measured: memory at the peak of one forward and backward pass, in bytes, by PyTorch's own
    tracker (``torch.distributed._tools.mem_tracker.MemTracker``: it follows every tensor the
    step allocates and frees, on the CPU as on a GPU), split as it labels it: ``params``,
    ``grads``, ``activations``, ``temporaries`` and ``total``. The tracker's own documentation
    warns that it may put a tensor under activations or temporaries wrongly (recomputed
    activations land in both); the peak itself is exact, so compare their sum. The model runs
    one step first, so that one-time allocations do not count."""
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError as err:  # a private module: pinned torch has it, others may not
        raise RuntimeError(f"this torch ({torch.__version__}) has no MemTracker; install the "
                           f"version in requirements.txt") from err
    loss_fn(model, x, y).backward()
    model.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        loss_fn(model, x, y).backward()
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    names = {"PARAM": "params", "GRAD": "grads", "ACT": "activations", "TEMP": "temporaries"}
    out = {name: 0 for name in names.values()}
    for kind, n_bytes in peak.items():
        key = names.get(getattr(kind, "name", str(kind)))
        if key:
            out[key] += n_bytes
    out["total"] = sum(out.values())
    model.zero_grad(set_to_none=True)
    return out


def step_seconds(model, x, y, repeats: int = 5, warmup: int = 1) -> list[float]:
    """Seconds of forward + backward, ``repeats`` times after ``warmup``."""
    check_whole("repeats", repeats), check_whole("warmup", warmup, least=0)
    times = []
    for i in range(warmup + repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss_fn(model, x, y).backward()
        if x.is_cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times
