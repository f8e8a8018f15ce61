"""Diagrams of the lessons' ideas, drawn from the objects a lesson runs (not typed in).

A measurement shows what happened; a diagram shows the idea the measurement is about. Each
function here takes plain data a lesson reads off its own objects — the pids of the workers it
launched, the shapes its layers produced, the buckets its synchroniser built, the shards ZeRO
gives each rank, the ranks a plan's device mesh lays out — and draws the lectures' picture of
it. Nothing here computes the idea itself: a diagram is only as right as the objects it is given.
"""

from __future__ import annotations

import math

import matplotlib.patches
import matplotlib.pyplot as plt
from matplotlib.colors import to_rgba

from course_lib.plots import STYLE, course_style

COLORS = STYLE["axes.prop_cycle"].by_key()["color"]
NODE_COLORS = plt.get_cmap("tab10")  # up to 10 nodes told apart (then the colours repeat)
MAX_REPLICAS = 4  # a plan with more data-parallel replicas shows its first four


def _box(ax, x, y, w, h, text, color, *, fontsize=8):
    ax.add_patch(matplotlib.patches.FancyBboxPatch(
        (x, y), w, h, boxstyle="round,pad=0.02", facecolor=to_rgba(color, 0.35),
        edgecolor=color, linewidth=1.2))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def _blank(ax):
    ax.set_axis_off()
    ax.set_aspect("auto")


def plot_process_tree(kernel: int, parents: dict[int, int], ranks: dict[int, int], *,
                      names: dict[int, str] | None = None, title: str = "Who started whom"):
    """The processes of one launch: the notebook's ``kernel`` pid, ``parents`` {pid: its parent's
    pid} for every process in between and the workers, and ``ranks`` {rank: pid}; ``names``
    {pid: name} labels the processes in between. The workers must share one parent (as launch
    starts them). Their process group is drawn as the line that joins them (their messages go
    over it, not through the kernel)."""
    if not ranks:
        raise ValueError("ranks is empty: pass {rank: pid} of the launched workers")
    if len({parents.get(pid) for pid in ranks.values()}) != 1:
        raise ValueError("the workers do not share one parent: "
                         f"{ {rank: parents.get(pid) for rank, pid in ranks.items()} }")
    names = names or {}
    chain, pid = [], ranks[min(ranks)]
    while pid in parents and parents[pid] != kernel and len(chain) < 8:
        pid = parents[pid]
        chain.append(pid)  # the processes between the kernel and the workers
    with course_style():
        fig, ax = plt.subplots(figsize=(7.5, 1.6 + 1.0 * (len(chain) + 1)))
        levels = [("notebook kernel", kernel)] + [(names.get(p, "process")[:28], p)
                                                  for p in reversed(chain)]
        for depth, (name, pid) in enumerate(levels):
            _box(ax, 3.0, -depth, 2.0, 0.6, f"{name}\npid {pid}", COLORS[0])
            if depth:
                ax.annotate("", (4.0, -depth + 0.6), (4.0, -depth + 1.0),
                            arrowprops=dict(arrowstyle="->", color="0.4"))
        y = -len(levels)
        width = 8.0 / len(ranks)
        for i, (rank, pid) in enumerate(sorted(ranks.items())):
            x = i * width + (width - 1.8) / 2
            _box(ax, x, y, 1.8, 0.6, f"rank {rank}\npid {pid}", COLORS[1])
            ax.annotate("", (x + 0.9, y + 0.6), (4.0, y + 1.0),
                        arrowprops=dict(arrowstyle="->", color="0.4"))
        if len(ranks) > 1:
            first = (width - 1.8) / 2 + 0.9
            last = first + (len(ranks) - 1) * width
            ax.plot([first, last], [y - 0.25] * 2, color=COLORS[2], lw=2)
            ax.text((first + last) / 2, y - 0.45, "process group: messages between the ranks",
                    ha="center", va="top", fontsize=8, color=COLORS[2])
        ax.set(xlim=(-0.2, 8.2), ylim=(y - 0.9, 0.9), title=title)
        _blank(ax)
    return fig


def _shape_text(shape) -> str:
    return "×".join(str(s) for s in shape) or "scalar"


def plot_layer_chain(names, shapes, grad_shapes, *,
                     title: str = "Forward left to right, backward back"):
    """A network as the chain its backward pass walks: ``names`` of the layers in order,
    ``shapes`` of the tensors between them as forward produced them (the input's, then each
    layer's output: one more than the layers), and ``grad_shapes`` of the gradients backward
    handed down in the same places (measured, not assumed equal)."""
    if len(shapes) != len(names) + 1 or len(grad_shapes) != len(shapes):
        raise ValueError(f"{len(names)} layers need {len(names) + 1} shapes and as many "
                         f"gradient shapes (the input's and each layer's output), got "
                         f"{len(shapes)} and {len(grad_shapes)}")
    with course_style():
        fig, ax = plt.subplots(figsize=(1.7 * len(names) + 2.5, 2.6))
        for i, name in enumerate(names):
            _box(ax, 1.7 * i + 0.6, 0.0, 1.2, 0.8, name, COLORS[i % len(COLORS)], fontsize=8)
        for i, (shape, grad) in enumerate(zip(shapes, grad_shapes, strict=True)):
            x = 1.7 * i + 0.5
            ax.annotate("", (x + 0.1, 0.6), (x - 0.4, 0.6),
                        arrowprops=dict(arrowstyle="->", color="0.2"))
            ax.annotate("", (x - 0.4, 0.2), (x + 0.1, 0.2),
                        arrowprops=dict(arrowstyle="->", color=COLORS[1]))
            ax.text(x - 0.15, 0.95, _shape_text(shape), ha="center", fontsize=7)
            ax.text(x - 0.15, -0.15, _shape_text(grad), ha="center", va="top", fontsize=7,
                    color=COLORS[1])
        ax.text(-0.5, 0.6, "forward: activations", ha="right", va="center", fontsize=8)
        ax.text(-0.5, 0.2, "backward: gradients", ha="right", va="center", fontsize=8,
                color=COLORS[1])
        ax.set(xlim=(-2.4, 1.7 * len(names) + 0.6), ylim=(-0.6, 1.3), title=title)
        _blank(ax)
    return fig


def plot_buckets(sizes, buckets, *, unit: float = 2**10, unit_name: str = "KiB",
                 title: str = "Gradients in backward order, packed into buckets"):
    """Which gradients travel together: ``sizes`` the parameters' bytes in ``model.parameters()``
    order and ``buckets`` lists of their indices (the synchroniser's own buckets, first sent
    first). Drawn in the order backward produces them, one colour per bucket."""
    order = [i for bucket in buckets for i in bucket]
    if sorted(order) != list(range(len(sizes))):
        raise ValueError("buckets must hold every parameter index exactly once")
    with course_style():
        fig, ax = plt.subplots(figsize=(9.0, 1.9))
        left = 0.0
        for b, bucket in enumerate(buckets):
            start = left
            for i in bucket:
                ax.barh(0, sizes[i] / unit, left=left, height=0.6, color=COLORS[b % len(COLORS)],
                        edgecolor="white", linewidth=0.4)
                left += sizes[i] / unit
            ax.text((start + left) / 2, 0.45, f"bucket {b}\n{len(bucket)} tensors", ha="center",
                    va="bottom", fontsize=7)
        ax.set(xlim=(0, left), ylim=(-0.5, 1.3), yticks=[], title=title,
               xlabel=f"{unit_name} of gradients, in reverse order of model.parameters() "
                      f"(the order the buckets expect backward to write them)")
        ax.grid(False)
        fig.tight_layout()
    return fig


def plot_graphs(panels, *, title: str = "Who averages with whom"):
    """Gossip graphs from their mixing matrices: ``panels`` {name: W} (n x n), the nodes on a
    circle, a line wherever W_ij > 0 for i != j, as thick as the weight, and each node's weight
    on itself written beside it."""
    if not panels:
        raise ValueError("panels is empty: pass {name: mixing matrix}")
    with course_style():
        fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels), 2.9), squeeze=False)
        for ax, (name, W) in zip(axes[0], panels.items(), strict=True):
            n = len(W)
            xy = [(math.sin(2 * math.pi * i / n), math.cos(2 * math.pi * i / n)) for i in range(n)]
            for i in range(n):
                for j in range(i + 1, n):
                    if W[i][j] > 0:
                        ax.plot(*zip(xy[i], xy[j], strict=True), color="0.5",
                                lw=0.5 + 6 * float(W[i][j]), zorder=1)
            for i, (x, y) in enumerate(xy):
                ax.scatter([x], [y], s=260, color=COLORS[0], zorder=2)
                ax.text(x, y, str(i), ha="center", va="center", color="white", fontsize=8)
                ax.text(1.3 * x, 1.3 * y, f"{float(W[i][i]):.2f}", ha="center", va="center",
                        fontsize=6, color="0.3")
            ax.set(xlim=(-1.5, 1.5), ylim=(-1.5, 1.5), title=name)
            ax.set_aspect("equal")
            ax.set_axis_off()
        fig.suptitle(title)
    return fig


def plot_masks(masks, *, title: str = "Each client's mask, and their sum"):
    """Secure aggregation's pairwise masks: ``masks`` (clients x d, as ``pairwise_masks`` makes
    them), one row per client and a last row with their sum over the clients, on one diverging
    colour scale, each value written in its cell."""
    rows = [list(map(float, row)) for row in masks]
    if not rows:
        raise ValueError("masks is empty: pass one row per client")
    total = [sum(column) for column in zip(*rows, strict=True)]
    table = rows + [total]
    top = max(abs(v) for row in table for v in row) or 1.0
    with course_style():
        fig, ax = plt.subplots(figsize=(1.0 + 0.8 * len(total), 0.9 + 0.38 * len(table)))
        ax.imshow(table, cmap="RdBu", vmin=-top, vmax=top, aspect="auto")
        for r, row in enumerate(table):
            for c, value in enumerate(row):
                ax.text(c, r, f"{value:.0f}" if abs(value) >= 0.5 else "0", ha="center",
                        va="center", fontsize=7)
        ax.axhline(len(rows) - 0.5, color="black", lw=1.5)
        largest = max(abs(v) for v in total)
        ax.set_yticks(range(len(table)), [f"client {i}" for i in range(len(rows))]
                      + [f"sum (|·| ≤ {largest:.0e})"])
        ax.set_xticks(range(len(total)), [f"x{c}" for c in range(len(total))])
        ax.tick_params(length=0)
        ax.grid(False)
        ax.set_title(title)
        fig.tight_layout()
    return fig


def plot_zero_stages(numel: int, bounds, *,
                     title: str = "What each rank keeps, by ZeRO stage"):
    """The ZeRO stages on p ranks of a model of ``numel`` numbers: ``bounds`` = each rank's
    shard as (start, end, ...) of the flat vector, as the optimiser's own sharding gives them.
    Stage 0 is plain data parallelism; stage 1 shards the optimiser state, stage 2 also the
    gradients, stage 3 (FSDP) also the parameters."""
    p = len(bounds)
    if p == 0:
        raise ValueError("bounds is empty: pass each rank's (start, stop, numel)")
    if numel < 1:
        raise ValueError(f"numel must be positive, got {numel}")
    kinds = ("parameters", "gradients", "optimiser state")
    with course_style():
        fig, axes = plt.subplots(1, 4, figsize=(10.0, 1.0 + 0.45 * p), sharey=True)
        for stage, ax in enumerate(axes):
            for r, (start, stop, *_) in enumerate(bounds):
                for k, kind in enumerate(kinds):
                    sharded = stage >= (3, 2, 1)[k]  # stage 1 shards state, 2 grads, 3 params
                    lo, hi = (start, stop) if sharded else (0, numel)
                    ax.barh(r + (k - 1) * 0.27, (hi - lo) / numel, left=lo / numel, height=0.25,
                            color=COLORS[k], label=kind if (stage, r) == (0, 0) else None)
            ax.set(title=("stage 0 (data parallel)", "stage 1", "stage 2", "stage 3 (FSDP)")[stage],
                   xlim=(0, 1), xticks=[0, 1], xlabel="share of the model")
            ax.grid(False)
        axes[0].set_yticks(range(p), [f"rank {r}" for r in range(p)])
        axes[0].invert_yaxis()
        fig.legend(loc="lower center", ncol=3, bbox_to_anchor=(0.5, -0.12), frameon=False)
        fig.suptitle(title)
        fig.tight_layout()
    return fig


def plot_rank_grid(layout, *, gpus_per_node: int, title: str = "Where each rank sits"):
    """A plan's ranks: ``layout[d][s][t]`` the rank that is data-parallel replica d, pipeline
    stage s, tensor-parallel slice t (a device mesh's ``view(dp, pp, tp)``). One panel per
    replica, stages as rows, tensor slices as columns; the colour is the node a rank is on, so
    a group that crosses nodes shows as one of several colours."""
    dp, pp, tp = len(layout), len(layout[0]), len(layout[0][0])
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be positive, got {gpus_per_node}")
    shown = min(dp, MAX_REPLICAS)
    with course_style():
        fig, axes = plt.subplots(1, shown, figsize=(min(2.0 + 0.7 * tp * shown, 12.0),
                                                    1.0 + 0.6 * pp), squeeze=False)
        for d, ax in enumerate(axes[0]):
            for s in range(pp):
                for t in range(tp):
                    rank = int(layout[d][s][t])
                    _box(ax, t, -s, 0.85, 0.7, str(rank),
                         NODE_COLORS((rank // gpus_per_node) % 10), fontsize=7)
            more = f" (of {dp})" if d == shown - 1 and dp > shown else ""
            ax.set(xlim=(-0.1, tp), ylim=(-pp + 0.8, 0.8), title=f"replica {d}{more}")
            _blank(ax)
        for s in range(pp):
            axes[0][0].text(-0.2, -s + 0.35, f"stage {s}", ha="right", va="center", fontsize=8)
        fig.suptitle(title + f"\n(colour: the node, {gpus_per_node} GPUs each; a row: one "
                             f"tensor-parallel group)", fontsize=9)
        fig.tight_layout()
    return fig


def plot_plan_terms(ranked, terms, *, title: str = "The fastest plans that fit",
                    empty: str = "no plan fits"):
    """The planner's answer as a picture: one bar per ranked plan (``ranked``: objects with
    ``plan``, ``time`` {term: seconds} and ``memory["total"]`` in bytes, fastest first), its
    step time stacked term by term in the order of ``terms``, the plan and its memory at the
    bar's end. An empty ``ranked`` draws the ``empty`` note instead."""
    with course_style():
        fig, ax = plt.subplots(figsize=(9, 0.45 * max(len(ranked), 2) + 1.6))
        for i, r in enumerate(ranked):
            left = 0.0
            for k, term in enumerate(terms):
                ax.barh(i, r.time[term], left=left, color=COLORS[k % len(COLORS)],
                        label=term.replace("_", " ") if i == 0 else None)
                left += r.time[term]
            ax.text(left, i, f"  {r.plan}  ({r.memory['total'] / 2**30:.0f} GiB)", va="center",
                    fontsize=8)
        if not ranked:
            ax.text(0.5, 0.5, empty, ha="center", transform=ax.transAxes)
        ax.invert_yaxis()
        ax.set_yticks([])
        ax.set(xlabel="predicted step time (s)", title=title,
               xlim=(0, 1.9 * max((r.time["total"] for r in ranked), default=1)))
        if ranked:
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=len(terms),
                      fontsize=8)
    return fig
