"""Diagrams of the lessons on model parallelism and plans: ZeRO's partitions, a plan's rank grid,
the planner's step time term by term."""

from __future__ import annotations

import matplotlib.pyplot as plt

from course_lib.diagrams.shapes import COLORS, NODE_COLORS, blank, box
from course_lib.plots import course_style
from course_lib.training import check_whole

MAX_REPLICAS = 4  # a plan with more data-parallel replicas shows its first four


def plot_zero_stages(numel: int, bounds, *,
                     title: str = "What each rank keeps, by ZeRO stage"):
    """The ZeRO stages on p ranks of a model of ``numel`` numbers: ``bounds`` = each rank's
    shard as (start, end, ...) of the flat vector, as the optimiser's own sharding gives them.
    Stage 0 is plain data parallelism; stage 1 shards the optimiser state, stage 2 also the
    gradients, stage 3 (FSDP) also the parameters."""
    p = len(bounds)
    if p == 0:
        raise ValueError("bounds is empty: pass each rank's (start, stop, numel)")
    check_whole("numel", numel)
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
    check_whole("gpus_per_node", gpus_per_node)
    shown = min(dp, MAX_REPLICAS)
    with course_style():
        fig, axes = plt.subplots(1, shown, figsize=(min(2.0 + 0.7 * tp * shown, 12.0),
                                                    1.0 + 0.6 * pp), squeeze=False)
        for d, ax in enumerate(axes[0]):
            for s in range(pp):
                for t in range(tp):
                    rank = int(layout[d][s][t])
                    box(ax, t, -s, 0.85, 0.7, str(rank),
                         NODE_COLORS((rank // gpus_per_node) % 10), fontsize=7)
            more = f" (of {dp})" if d == shown - 1 and dp > shown else ""
            ax.set(xlim=(-0.1, tp), ylim=(-pp + 0.8, 0.8), title=f"replica {d}{more}")
            blank(ax)
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
    bar's end; the legend names the terms some bar has. An empty ``ranked`` draws the ``empty``
    note instead, with no axis."""
    shown = [term for term in terms if any(r.time[term] > 0 for r in ranked)]
    with course_style():
        fig, ax = plt.subplots(figsize=(9, 0.45 * max(len(ranked), 2) + 1.6))
        for i, r in enumerate(ranked):
            left = 0.0
            for k, term in enumerate(terms):
                ax.barh(i, r.time[term], left=left, color=COLORS[k % len(COLORS)],
                        label=term.replace("_", " ") if i == 0 and term in shown else None)
                left += r.time[term]
            ax.text(left, i, f"  {r.plan}  ({r.memory['total'] / 2**30:.0f} GiB)", va="center",
                    fontsize=8)
        if not ranked:
            ax.text(0.5, 0.5, empty, ha="center", transform=ax.transAxes)
            ax.set_xticks([])
        ax.invert_yaxis()
        ax.set_yticks([])
        ax.set(xlabel="predicted step time (s)" if ranked else "", title=title,
               xlim=(0, 1.9 * max((r.time["total"] for r in ranked), default=1)))
        if ranked:
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=max(1, len(shown)),
                      fontsize=8)
    return fig
