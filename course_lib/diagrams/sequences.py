"""Diagrams of the lesson on long sequences and experts: the ring's key/value blocks step by
step, which queries each rank owns under a causal mask, and a token's path to its experts."""

from __future__ import annotations

import matplotlib.patches
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap, to_rgba

from course_lib.diagrams.shapes import COLORS, blank, box
from course_lib.plots import course_style
from course_lib.training import check_whole


def plot_ring_steps(traces, *, title: str = "Ring attention: whose keys each rank holds"):
    """``traces[r]``: rank r's forward trace, (step, the rank whose keys and values it holds,
    computed or skipped under the causal mask) per step, as ``ring_attention`` records it. A row
    per rank, a column per step; an arrow shows each block moving on to the next rank."""
    p = len(traces)
    steps = max(len(t) for t in traces) if traces else 0
    if not p or not steps:
        raise ValueError("traces is empty: pass each rank's counts['trace']")
    with course_style():
        fig, ax = plt.subplots(figsize=(1.3 + 1.45 * steps, 0.9 + 0.75 * p))
        for r, trace in enumerate(traces):
            ax.text(-0.2, -r + 0.3, f"rank {r}", ha="right", va="center", fontsize=8)
            for step, owner, computed in trace:
                color = COLORS[owner % len(COLORS)] if computed else "0.8"
                label = f"K,V of {owner}" + ("" if computed else "\nskipped")
                box(ax, 1.45 * step, -r, 1.1, 0.6, label, color, fontsize=7)
                if step < steps - 1 and p > 1:  # on to the next rank for the next step
                    nxt = (r + 1) % p
                    ax.annotate("", xy=(1.45 * (step + 1), -nxt + 0.3),
                                xytext=(1.45 * step + 1.1, -r + 0.3),
                                arrowprops=dict(arrowstyle="->", color="0.55", lw=0.8))
        for step in range(steps):
            ax.text(1.45 * step + 0.55, 0.85, f"step {step}", ha="center", fontsize=8)
        ax.set(xlim=(-1.0, 1.45 * steps), ylim=(-p + 0.5, 1.1), title=title)
        blank(ax)
    return fig


def plot_causal_work(splits, tokens: int, *, title: str = "Causal attention: whose rows"):
    """``splits``: {layout name: [positions of rank r's tokens for each r]}. For each layout,
    the causal score matrix (query rows, key columns; above the diagonal masked) coloured by the
    rank that owns the query row, with each rank's share of the unmasked pairs."""
    if not splits:
        raise ValueError("splits is empty: pass {layout: positions per rank}")
    p = len(next(iter(splits.values())))
    if {len(v) for v in splits.values()} != {p} or p < 1:
        raise ValueError(f"every layout must give the same number of ranks, at least one: got "
                         f"{ {name: len(v) for name, v in splits.items()} }")
    for name, positions in splits.items():
        flat = [int(q) for pos in positions for q in np.asarray(pos).ravel()]
        if not flat or min(flat) < 0 or max(flat) >= tokens:
            raise ValueError(f"layout {name!r}: positions must lie in 0..{tokens - 1}, and some "
                             f"rank must hold one")
    cmap = ListedColormap([to_rgba("white")] + [to_rgba(COLORS[r % len(COLORS)]) for r in
                                                range(p)])
    with course_style():
        fig, axes = plt.subplots(1, len(splits), figsize=(3.6 * len(splits), 3.9), squeeze=False)
        for ax, (name, positions) in zip(axes[0], splits.items(), strict=True):
            owner = np.zeros((tokens, tokens))
            for r, pos in enumerate(positions):
                for q in np.asarray(pos):
                    owner[q, :q + 1] = r + 1  # row q's keys 0..q, owned by rank r
            ax.imshow(owner, cmap=cmap, vmin=0, vmax=p, interpolation="nearest")
            work = [(owner == r + 1).sum() for r in range(p)]
            shares = ", ".join(f"{w / sum(work):.0%}" for w in work)
            ax.set(title=f"{name}\nrank shares: {shares}", xlabel="key position",
                   ylabel="query position")
        fig.suptitle(title, fontsize=10)
        fig.legend(handles=[matplotlib.patches.Patch(color=COLORS[r % len(COLORS)],
                                                     label=f"rank {r}") for r in range(p)],
                   loc="lower center", ncol=p, bbox_to_anchor=(0.5, -0.06), frameon=False)
        fig.tight_layout()
    return fig


def plot_token_path(experts, slots, gates, experts_per_rank: int, *, first: int = 0,
                    title: str = "Each token's path: router, experts, ranks"):
    """A few tokens' routes through a layer of experts, left to right: the token, the router
    (its top-k experts and their gates), the dispatch all-to-all to the experts (grouped by the
    rank that holds them, ``experts_per_rank`` each), the combine all-to-all back, and the
    token's output, the gate-weighted sum of its experts' outputs. ``experts`` (tokens, k) the
    chosen experts, ``slots`` (tokens, k) their slots (-1: dropped, the expert was full: that
    route is dashed and sends nothing back), ``gates`` (tokens, k). The tokens are numbered from
    ``first`` (their place in the batch)."""
    check_whole("experts_per_rank", experts_per_rank)
    experts, slots, gates = (np.asarray(a) for a in (experts, slots, gates))
    n, num_experts = len(experts), int(experts.max()) + 1 if experts.size else 0
    if not n:
        raise ValueError("no tokens to draw")
    num_experts = max(num_experts, experts_per_rank)
    ranks = -(-num_experts // experts_per_rank)
    rows = max(n, ranks * experts_per_rank)
    x_router, x_expert, x_out = 1.7, 4.6, 7.5  # columns: token, router, experts, output

    def arrow(ax, x0, y0, x1, y1, width=0.8, dashed=False, color="0.3"):
        ax.annotate("", xy=(x1, y1 + 0.2), xytext=(x0, y0 + 0.2),
                    arrowprops=dict(arrowstyle="->", lw=width, ls="--" if dashed else "-",
                                    color=color))

    with course_style():
        fig, ax = plt.subplots(figsize=(9.5, 0.9 + 0.5 * rows))
        for t in range(n):
            picks = ", ".join(f"E{int(e)} {g:.2f}" for e, g in zip(experts[t], gates[t],
                                                                    strict=True))
            box(ax, 0.0, -t, 1.1, 0.4, f"token {first + t}", COLORS[0], fontsize=7)
            box(ax, x_router, -t, 1.5, 0.4, f"router\n{picks}", "0.6", fontsize=6)
            box(ax, x_out, -t, 1.3, 0.4, f"output {first + t}", COLORS[0], fontsize=7)
            arrow(ax, 1.1, -t, x_router, -t)
        for e in range(ranks * experts_per_rank):
            rank = e // experts_per_rank
            box(ax, x_expert, -e, 1.4, 0.4, f"expert {e}\nrank {rank}",
                COLORS[(rank + 1) % len(COLORS)], fontsize=7)
        for t in range(n):
            for j in range(experts.shape[1]):
                kept, e, width = slots[t, j] >= 0, int(experts[t, j]), 0.6 + 2 * float(gates[t, j])
                arrow(ax, x_router + 1.5, -t, x_expert, -e, width, not kept,
                      "0.3" if kept else COLORS[3])
                if kept:  # the expert's output goes back to the token's rank, times the gate
                    arrow(ax, x_expert + 1.4, -e, x_out, -t, width, color=COLORS[2])
        for x, text in ((x_router + 1.5, "all-to-all: dispatch"), (x_expert + 1.4,
                                                                    "all-to-all: combine")):
            ax.text((x + (x_expert if x < x_expert else x_out)) / 2, 0.75, text, ha="center",
                    fontsize=8)
        ax.set(xlim=(-0.3, x_out + 1.5), ylim=(-rows + 0.2, 1.1),
               title=title + "\n(router: expert E and gate; width: the gate; dashed: dropped, the "
               "expert was full)")
        blank(ax)
    return fig
