"""Diagrams of the lessons on workers, backpropagation and data parallelism: who started whom, a
layer chain both ways, gradient buckets, a parameter server's star, who averages with whom, secure
aggregation's masks."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt

from course_lib.diagrams.shapes import COLORS, blank, box
from course_lib.plots import course_style


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
            box(ax, 3.0, -depth, 2.0, 0.6, f"{name}\npid {pid}", COLORS[0])
            if depth:
                ax.annotate("", (4.0, -depth + 0.6), (4.0, -depth + 1.0),
                            arrowprops=dict(arrowstyle="->", color="0.4"))
        y = -len(levels)
        width = 8.0 / len(ranks)
        for i, (rank, pid) in enumerate(sorted(ranks.items())):
            x = i * width + (width - 1.8) / 2
            box(ax, x, y, 1.8, 0.6, f"rank {rank}\npid {pid}", COLORS[1])
            ax.annotate("", (x + 0.9, y + 0.6), (4.0, y + 1.0),
                        arrowprops=dict(arrowstyle="->", color="0.4"))
        if len(ranks) > 1:
            first = (width - 1.8) / 2 + 0.9
            last = first + (len(ranks) - 1) * width
            ax.plot([first, last], [y - 0.25] * 2, color=COLORS[2], lw=2)
            ax.text((first + last) / 2, y - 0.45, "process group: messages between the ranks",
                    ha="center", va="top", fontsize=8, color=COLORS[2])
        ax.set(xlim=(-0.2, 8.2), ylim=(y - 0.9, 0.9), title=title)
        blank(ax)
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
            box(ax, 1.7 * i + 0.6, 0.0, 1.2, 0.8, name, COLORS[i % len(COLORS)], fontsize=8)
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
        blank(ax)
    return fig


def plot_buckets(sizes, buckets, *, unit: float = 2**10, unit_name: str = "KiB",
                 title: str = "Gradients in backward order, packed into buckets"):
    """Which gradients travel together: ``sizes`` the parameters' bytes in ``model.parameters()``
    order and ``buckets`` lists of their indices (the synchroniser's own buckets, first sent
    first). Drawn in the order backward produces them, one colour per bucket."""
    if not unit > 0:
        raise ValueError(f"unit must be a positive number of bytes, got {unit!r}")
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


def plot_server_star(panels, *, title: str = "Who the server hears from"):
    """Parameter-server runs as stars: ``panels`` {name: {"shares": [...], "labels": [...]}},
    one entry per worker. The server (S) sits in the middle; worker w sits on a circle, its line
    to the server as thick as its share of the gradients the server applied, and its label
    (e.g. the mean staleness of its gradients) beside it."""
    if not panels:
        raise ValueError("panels is empty: pass {name: {'shares': [...], 'labels': [...]}}")
    with course_style():
        fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.0), squeeze=False)
        for ax, (name, panel) in zip(axes[0], panels.items(), strict=True):
            shares, labels = list(panel["shares"]), list(panel["labels"])
            if not shares or len(shares) != len(labels) or min(shares) < 0:
                raise ValueError(f"{name}: give one share (>= 0) and one label per worker, got "
                                 f"{len(shares)} shares and {len(labels)} labels")
            m = len(shares)
            for w, (share, label) in enumerate(zip(shares, labels, strict=True)):
                x, y = math.sin(2 * math.pi * w / m), math.cos(2 * math.pi * w / m)
                ax.plot([0, x], [0, y], color="0.5", lw=0.5 + 12 * float(share), zorder=1)
                ax.scatter([x], [y], s=260, color=COLORS[0], zorder=2)
                ax.text(x, y, str(w + 1), ha="center", va="center", color="white", fontsize=8)
                side = "left" if x > 0.3 else "right" if x < -0.3 else "center"
                ax.text(x + 0.32 * math.copysign(1, x) * (side != "center"), 1.35 * y, label,
                        ha=side, va="center", fontsize=7, color="0.3")
            ax.scatter([0], [0], s=420, color=COLORS[1], zorder=2)
            ax.text(0, 0, "S", ha="center", va="center", color="white", fontsize=9)
            ax.set(xlim=(-2.2, 2.2), ylim=(-1.6, 1.6), title=name)
            ax.set_aspect("equal")
            ax.set_axis_off()
        fig.suptitle(title)
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
    if not rows or not rows[0]:
        raise ValueError("masks is empty: pass one row per client, one number per coordinate")
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
