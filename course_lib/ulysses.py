"""DeepSpeed-Ulysses (Jacobs et al. 2023): context parallelism by all-to-all.

Lecture: long sequences. Each rank holds a contiguous share of the tokens of every head. An
all-to-all trades that split for a split of the heads: each rank then holds every token of
H / p heads and attends over the whole sequence with any attention kernel; a second all-to-all
trades back. Its messages are four all-to-alls a layer (q, k, v and the output), each of a
rank's share, against ring attention's p - 1 passes of k and v
(``cost_models.context_parallel_bytes``). Used by :mod:`course_lib.context_parallel`.

Tensors are (heads, tokens, head_dim); rank functions take ``group`` (default: all ranks).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.collectives import all_to_all


def _exchange(x, to_heads: bool, group, counts):
    """(heads, n, d) split by sequence -> (heads / p, p n, d) split by heads (``to_heads``), or
    back: an all-to-all of head groups, then the received token blocks laid end to end."""
    p = dist.get_world_size(group)
    if to_heads:  # slice s: head group s of my tokens, for rank s
        h, n, d = x.shape
        send = x.reshape(p, h // p, n, d)
    else:  # slice s: rank s's tokens of my heads, back to rank s
        h, t, d = x.shape
        send = x.reshape(h, p, t // p, d).transpose(0, 1)
    received = all_to_all(send, group)
    counts["messages"] += 1
    counts["bytes"] += send.numel() * send.element_size() * (p - 1) // p
    if to_heads:  # received[s]: my heads, rank s's tokens
        return received.transpose(0, 1).reshape(h // p, p * n, d)
    return received.reshape(p * h, t // p, d)  # received[s]: head group s, my tokens


def ulysses_attention(q, k, v, *, causal: bool = False, group=None, counts: dict | None = None):
    """DeepSpeed-Ulysses: this rank holds a contiguous share of the tokens of every head; an
    all-to-all gives it every token of heads / p heads, it attends, and an all-to-all gives each
    rank its tokens back. Needs the heads to divide among the ranks. Differentiable."""
    p = dist.get_world_size(group)
    if q.dim() != 3:  # a batch dimension would be read as the heads
        raise ValueError(f"Ulysses takes (heads, tokens, d) tensors, got shape {tuple(q.shape)}: "
                         f"fold a batch into the heads first")
    if q.shape[0] % p:
        raise ValueError(f"Ulysses splits the heads: {q.shape[0]} heads do not divide among "
                         f"{p} ranks")
    if counts is None:
        counts = {}
    for key in ("messages", "bytes"):
        counts.setdefault(key, 0)
    qh, kh, vh = (_exchange(x, True, group, counts) for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
    return _exchange(out, False, group, counts)
