"""Context parallelism: attention over a sequence that is split across ranks.

Lecture: long sequences. Attention is softmax(Q K^T / sqrt(d)) V over every pair of tokens, so
its score matrix grows as T^2. Three ideas let a sequence outgrow one device:

* **Blockwise attention with the online softmax** (Milakov & Gimelshein 2018; FlashAttention,
  Dao et al. 2022): take the keys one block at a time and keep, per query, only a running
  maximum ``m``, a running sum ``l`` of exponentials and a running output. When a block raises
  the maximum, what was summed so far is rescaled by exp(m_old - m_new). The T x T matrix is
  never held; the result is the same softmax. (:class:`OnlineSoftmax`)
* **Ring attention** (Liu et al. 2023): the sequence is split over p ranks. Each rank keeps its
  queries and passes its key/value block around the ring, so after p - 1 steps every query has
  met every key; a rank computes on one block while the next one travels. With a causal mask a
  block of keys that lies wholly after a rank's queries is skipped, so a **contiguous** split
  leaves the first rank one block to compute and the last p of them; the **zigzag** split (rank
  r holds chunks r and 2p - 1 - r of 2p) gives every rank the same work.
  (:func:`ring_attention`)
* **DeepSpeed-Ulysses** (Jacobs et al. 2023): an all-to-all trades the sequence split for a
  split of the heads, each rank attends over the whole sequence for H/p heads, and a second
  all-to-all trades back. (:func:`course_lib.ulysses.ulysses_attention`)

Tensors are (heads, tokens, head_dim). Rank functions take ``group`` (default: all ranks) and
compute on the device their tensors are on; the messages are real point-to-point sends
(``isend``/``irecv``) and all-to-alls.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from course_lib.runtime.devices import device
from course_lib.runtime.emulation import catch_up, check_cpu_rank
from course_lib.training import is_whole
from course_lib.ulysses import ulysses_attention

LAYOUTS = ("contiguous", "zigzag")
CHUNKS = {"contiguous": 1, "zigzag": 2}  # runs of consecutive positions a rank holds


def _scores(q, k, q_pos, k_pos, causal: bool):
    """Q K^T / sqrt(d), with -inf where a causal mask hides a key from a query."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    return s


def hidden(q_pos, k_pos) -> bool:
    """A block of keys wholly after every query: under a causal mask there is nothing to do."""
    return bool(k_pos.min() > q_pos.max())


def block_scores(q, k, q_pos, k_pos, causal: bool, chunks: int = 1):
    """This rank's queries against one block of keys, chunk by chunk (each side holds ``chunks``
    runs of consecutive positions: 2 under the zigzag split): a pair of chunks that the causal
    mask hides wholly is not computed, its scores stay -inf. Returns (the scores, or None when
    every pair is hidden; how many scores per head were computed)."""
    nq, nk = q.shape[-2] // chunks, k.shape[-2] // chunks
    scores, computed = None, 0
    for i in range(chunks):
        for j in range(chunks):
            rows, cols = slice(i * nq, (i + 1) * nq), slice(j * nk, (j + 1) * nk)
            if causal and hidden(q_pos[rows], k_pos[cols]):
                continue
            if scores is None:
                scores = q.new_full((*q.shape[:-1], k.shape[-2]), float("-inf"))
            scores[..., rows, cols] = _scores(q[..., rows, :], k[..., cols, :], q_pos[rows],
                                              k_pos[cols], causal)
            computed += nq * nk
    return scores, computed


class OnlineSoftmax:
    """softmax(S) V over the key blocks given to :meth:`add` one at a time, holding per query
    only the running maximum ``m``, the running sum ``l`` and the running output ``acc``."""

    def __init__(self, q):
        rows = q.shape[:-1]
        self.m = self._start = torch.full(rows, float("-inf"), dtype=q.dtype, device=q.device)
        self.l = torch.zeros(rows, dtype=q.dtype, device=q.device)  # noqa: E741
        self.acc = torch.zeros_like(q)

    def add(self, scores, v) -> None:
        m_new = torch.maximum(self.m, scores.amax(dim=-1))
        shift = torch.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet
        rescale = torch.exp(self.m - shift)  # what was summed so far, at the new maximum
        p = torch.exp(scores - shift[..., None])
        self.l = self.l * rescale + p.sum(dim=-1)
        self.acc = self.acc * rescale[..., None] + p @ v
        self.m = m_new

    def result(self):
        """(output, log-sum-exp of each query's scores): the lse is what backward needs."""
        if self.m is self._start:  # add() replaces m: no block of scores came yet
            raise ValueError("result() before any add(): no query has met a key yet (its output "
                             "would be 0 / 0)")
        return self.acc / self.l[..., None], self.m + torch.log(self.l)


def blockwise_attention(q, k, v, block: int, causal: bool = False):
    """Attention of all of ``q`` over ``k``, ``v`` taken ``block`` keys at a time (one process):
    the largest score tensor held is tokens x block, not tokens x tokens."""
    if not (is_whole(block) and block >= 1):
        raise ValueError(f"block must be a positive number of keys, a whole number, got {block!r}")
    if k.shape[-2] != v.shape[-2] or v.shape[-1] != q.shape[-1]:
        raise ValueError(f"k and v need one row per key each, v's as wide as q's; got shapes q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not k.shape[-2]:  # no keys: zeros, as torch's scaled_dot_product_attention gives
        return q @ k.transpose(-2, -1) @ v
    pos = torch.arange(q.shape[-2], device=q.device)
    k_all = torch.arange(k.shape[-2], device=q.device)
    state = OnlineSoftmax(q)
    for start in range(0, k.shape[-2], block):
        k_pos = k_all[start:start + block]
        state.add(_scores(q, k[..., k_pos, :], pos, k_pos, causal), v[..., k_pos, :])
    return state.result()[0]


def sequence_positions(tokens: int, world_size: int, rank: int, layout: str = "contiguous"):
    """The positions (in the whole sequence) of the tokens ``rank`` holds."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not all(map(is_whole, (tokens, world_size, rank))):
        raise ValueError(f"tokens, world_size and rank must be whole numbers, got {tokens!r}, "
                         f"{world_size!r}, {rank!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of {world_size} ranks")
    pieces = world_size * (2 if layout == "zigzag" else 1)
    if tokens < pieces or tokens % pieces:
        raise ValueError(f"a {layout} split of {tokens} tokens over {world_size} ranks needs a "
                         f"positive multiple of {pieces} tokens")
    n = tokens // pieces
    chunks = [rank] if layout == "contiguous" else [rank, 2 * world_size - 1 - rank]
    return torch.cat([torch.arange(c * n, (c + 1) * n) for c in chunks])


def split_sequence(x, world_size: int, rank: int, layout: str = "contiguous"):
    """``rank``'s share of the tokens of ``x`` (tokens on dim -2)."""
    if x.dim() < 2:
        raise ValueError(f"x must hold its tokens on dim -2, (..., tokens, d), got shape "
                         f"{tuple(x.shape)}")
    pos = sequence_positions(x.shape[-2], world_size, rank, layout).to(x.device)
    return x.index_select(-2, pos)


def gather_sequence(parts, layout: str = "contiguous"):
    """The whole sequence from every rank's share (``parts[r]`` from rank r), in order."""
    parts = list(parts)
    if not parts or parts[0].dim() < 2 or any(p.shape != parts[0].shape for p in parts):
        raise ValueError(f"parts must be every rank's share, (..., tokens, d), all of one shape "
                         f"(equal shares), got shapes {[tuple(p.shape) for p in parts]}")
    tokens = sum(p.shape[-2] for p in parts)
    out = torch.empty(*parts[0].shape[:-2], tokens, parts[0].shape[-1], dtype=parts[0].dtype,
                      device=parts[0].device)
    for r, part in enumerate(parts):
        out[..., sequence_positions(tokens, len(parts), r, layout).to(out.device), :] = part
    return out


def _ring(group):
    """(world size, this rank, the global ranks it sends to and receives from)."""
    p, r = dist.get_world_size(group), dist.get_rank(group)
    return p, r, (r + 1) % p, (r - 1) % p


def _pass_on(tensor, group):
    """Send ``tensor`` to the next rank and receive the previous one's: (requests, buffer)."""
    p, _, nxt, prev = _ring(group)
    buffer = torch.empty_like(tensor)
    reqs = [dist.isend(tensor.contiguous(), group=group, group_dst=nxt),
            dist.irecv(buffer, group=group, group_src=prev)]
    return reqs, buffer


def _wait(reqs: list) -> None:
    """Wait for the requests, once: the list is emptied (a gloo request waited twice hangs)."""
    while reqs:
        reqs.pop(0).wait()


class RingAttention(torch.autograd.Function):
    """Ring attention's forward and backward: see :func:`ring_attention`."""

    @staticmethod
    def forward(ctx, q, k, v, layout, causal, group, counts, emulated=None, overlap=True):
        p, r, _, _ = _ring(group)
        tokens = q.shape[-2] * p
        q_pos = sequence_positions(tokens, p, r, layout).to(q.device)
        state, kv = OnlineSoftmax(q), torch.stack([k, v])
        for step in range(p):
            if step < p - 1:  # the next block travels while this one computes
                reqs, incoming = _pass_on(kv, group)
                counts["messages"] += 1
                counts["bytes"] += kv.numel() * kv.element_size()
                if not overlap:  # (or, to compare, arrives before this one computes)
                    _wait(reqs)
            catch_up(emulated)  # an emulated device starts the block here (None: off) ...
            k_pos = sequence_positions(tokens, p, (r - step) % p, layout).to(q.device)
            scores, computed = block_scores(q, kv[0], q_pos, k_pos, causal, CHUNKS[layout])
            skip = scores is None
            if not skip:
                state.add(scores, kv[1])
            catch_up(emulated)  # ... and has computed it after its FLOPs / its rate
            counts["skipped" if skip else "blocks"] += 1
            counts["scores"] += computed
            counts["trace"].append((step, (r - step) % p, not skip))  # (step, owner, computed)
            if step < p - 1:
                _wait(reqs)
                kv = incoming
        out, lse = state.result()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.causal, ctx.group, ctx.counts = layout, causal, group, counts
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        p, r, _, _ = _ring(ctx.group)
        tokens, scale = q.shape[-2] * p, 1 / math.sqrt(q.shape[-1])
        q_pos = sequence_positions(tokens, p, r, ctx.layout).to(q.device)
        delta = (d_out * out).sum(dim=-1, keepdim=True)  # rowsum(dO * O)
        dq = torch.zeros_like(q)
        block = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])  # k, v, dk, dv
        for step in range(p):
            k_pos = sequence_positions(tokens, p, (r - step) % p, ctx.layout).to(q.device)
            scores, _ = block_scores(q, block[0], q_pos, k_pos, ctx.causal, CHUNKS[ctx.layout])
            if scores is not None:
                kb, vb = block[0], block[1]
                prob = torch.exp(scores - lse[..., None])
                d_score = prob * (d_out @ vb.transpose(-2, -1) - delta)
                dq += d_score @ kb * scale
                block[2] += d_score.transpose(-2, -1) @ q * scale
                block[3] += prob.transpose(-2, -1) @ d_out
            # p passes: the block, with the gradients of its keys and values, comes home (on
            # one rank it is home already: nothing to send to itself)
            if p > 1:
                reqs, block = _pass_on(block, ctx.group)
                _wait(reqs)
                ctx.counts["messages"] += 1
                ctx.counts["bytes"] += block.numel() * block.element_size()
        return dq, block[2], block[3], None, None, None, None, None, None


def ring_attention(q, k, v, *, causal: bool = False, layout: str = "contiguous", group=None,
                   counts: dict | None = None, emulated=None, overlap: bool = True):
    """Attention of this rank's queries over the whole sequence, whose keys and values are
    split over the ranks of ``group`` as ``layout`` splits them (:func:`split_sequence`): the
    key/value blocks go around the ring. Differentiable (backward passes the blocks around
    again, with their gradients). ``counts`` (if given) adds up blocks computed and skipped
    under the causal mask, scores computed per head (forward), messages and bytes sent, and
    keeps the forward's ``trace``: (step, whose keys were here, computed or not) per step.
    ``emulated`` (an ``EmulatedDevice``, inside its ``paced_step``) paces the forward's blocks;
    ``overlap=False`` waits for the next block before computing this one, to compare."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not q.shape == k.shape == v.shape:
        raise ValueError(f"q, k and v must have one shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if emulated is not None:
        check_cpu_rank(q.device)  # a GPU is timed as it is
    if counts is None:
        counts = {}
    for key in ("blocks", "skipped", "scores", "messages", "bytes"):
        counts.setdefault(key, 0)
    counts.setdefault("trace", [])
    return RingAttention.apply(q, k, v, layout, causal, group, counts, emulated, overlap)


def run_context_parallel(q, k, v, d_out, *, causal: bool = False, layout: str = "contiguous",
                         kind: str = "ring", group=None) -> dict:
    """On each rank: take this rank's share of the whole ``q``, ``k``, ``v`` (heads, tokens, d),
    attend with ``kind`` ("ring" or "ulysses", which splits contiguously), and backpropagate the
    share of ``d_out`` (the gradient of the output). Returns this rank's output and gradients of
    its shares, and the counts."""
    if kind not in ("ring", "ulysses"):
        raise ValueError(f"kind must be 'ring' or 'ulysses', got {kind!r}")
    p, r = dist.get_world_size(group), dist.get_rank(group)
    layout = layout if kind == "ring" else "contiguous"
    mine = [split_sequence(x, p, r, layout).to(device(group)) for x in (q, k, v, d_out)]
    q_, k_, v_ = (x.clone().requires_grad_(True) for x in mine[:3])
    counts: dict = {}
    attend = ring_attention if kind == "ring" else ulysses_attention
    options = dict(layout=layout) if kind == "ring" else {}
    out = attend(q_, k_, v_, causal=causal, group=group, counts=counts, **options)
    out.backward(mine[3])
    return {"out": out.detach().cpu(), "dq": q_.grad.cpu(), "dk": k_.grad.cpu(),
            "dv": v_.grad.cpu(), "counts": counts, "layout": layout}

