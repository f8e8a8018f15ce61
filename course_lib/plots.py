"""Figures every lesson shares: speedup and efficiency, convergence by step and by wall-clock.

Lecture: "Parallel computing for empirical risk minimization", section 2.4 (speedup ratio: ideal
m, actual lower and flattening as m grows) and slides part 1 (speedup against processors).
Each function returns a matplotlib Figure, draws the theory next to the measurement and works
without a display.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import contextmanager

import matplotlib
import matplotlib.patches
import matplotlib.pyplot as plt
import numpy as np

from course_lib.cost_models import amdahl_speedup, fit_amdahl, fit_gustafson, gustafson_speedup
from course_lib.runtime.timing import Span, Timing

STYLE = {
    "figure.figsize": (9.0, 3.6), "figure.dpi": 100, "axes.grid": True, "grid.alpha": 0.3,
    "axes.spines.top": False, "axes.spines.right": False,
    "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
    "lines.linewidth": 1.8, "lines.markersize": 6,
    "axes.prop_cycle": matplotlib.cycler(color=["#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                                "#ff7f0e", "#8c564b", "#17becf"]),
}
THEORY = dict(color="0.45", linestyle="--", linewidth=1.2)  # ideal lines and fitted models


@contextmanager
def course_style():
    """The course's look for the figures made inside the block. Unlike ``plt.style.context`` it
    restores only the keys it set: a notebook's first figure turns pyplot's interactive mode on,
    and restoring every rcParam afterwards would turn it off (later figures would not show)."""
    saved = {key: matplotlib.rcParams[key] for key in STYLE}
    matplotlib.rcParams.update(STYLE)
    try:
        yield
    finally:
        matplotlib.rcParams.update(saved)
RUN_STYLES = ["-", "--", ":", "-."]  # runs that coincide (as they should, often) stay visible


def _medians_and_errors(times):
    """Medians and (low, high) error bars from Timings, lists of runs, or plain numbers (each
    checked as a Timing is: finite, not negative; a speedup also needs it above 0)."""
    rows = []  # (median, first quartile, third quartile) of each entry
    for t in times:
        timing = t if isinstance(t, Timing) else Timing(list(t) if isinstance(t, Sequence)
                                                        else [float(t)])
        if not timing.median > 0:
            raise ValueError(f"a time of 0 gives no speedup: every median must be above 0, got "
                             f"{timing.median!r}")
        rows.append((timing.median, *timing.quartiles))
    return tuple(np.array(rows, dtype=float).reshape(-1, 3).T)  # medians, low and high ends


def plot_speedup(workers, times, *, title: str = "Speedup", label: str = "measured",
                 scaling: str = "strong", cores: int | None = None):
    """Speedup and efficiency against the number of workers, with the ideal line and the fitted
    law: Amdahl's for strong scaling (fixed total work), Gustafson's for weak scaling (work
    grows with m; speedup = m T(1) / T(m)). ``times[i]`` is the time with ``workers[i]`` workers
    (a Timing, a list of runs or a number); ``workers`` must include 1, the baseline.

    The law's one parameter f is fitted to every measured m > 1 that has its own cores, and
    only when there are at least two of them (a point more than the parameters). Counts above
    ``cores`` are drawn hollow and shaded as oversubscribed, and left out of the fit: they
    measure processes sharing cores, not the law.
    """
    p = np.asarray(workers, dtype=float)
    if len(p) != len(times) or not np.all((p >= 1) & (p == np.round(p))):
        raise ValueError(f"workers must be whole numbers of at least 1, one per entry of times: "
                         f"got {list(workers)} and {len(times)} times")
    if 1 not in list(workers):
        raise ValueError("workers must include 1: speedup is measured against one worker")
    if scaling not in ("strong", "weak"):
        raise ValueError(f"scaling must be 'strong' or 'weak', got {scaling!r}")
    med, low, high = _medians_and_errors(times)
    t1 = med[list(workers).index(1)]
    work = p if scaling == "weak" else np.ones_like(p)
    speedup = work * t1 / med
    # a slower run (high time) gives a lower speedup: error bars swap ends
    err = np.abs(np.vstack([speedup - work * t1 / high, work * t1 / low - speedup]))
    law, fit_f, model = (("Amdahl", fit_amdahl, amdahl_speedup) if scaling == "strong" else
                         ("Gustafson", fit_gustafson, gustafson_speedup))
    over = p > cores if cores is not None else np.zeros_like(p, dtype=bool)
    informative = (p > 1) & ~over  # S(1) = 1 whatever f is; oversubscribed: not the law
    f = fit_f(p[informative], speedup[informative]) if informative.sum() >= 2 else None
    grid = np.linspace(1, p.max(), 100)
    with course_style():
        fig, (ax_s, ax_e) = plt.subplots(1, 2)
        ax_s.plot(grid, grid, label="ideal (S = m)", **THEORY)
        ax_e.axhline(1.0, label="ideal", **THEORY)
        fit_label = (f"{law} fit, f = {f:.2f} ({informative.sum()} points)" if f is not None
                     else f"no {law} fit: needs 2 points with m > 1"
                     + (f" and m <= {cores} cores" if cores is not None else ""))
        if f is not None:
            ax_s.plot(grid, model(grid, f), label=fit_label, color="0.2", linestyle=":")
            ax_e.plot(grid, model(grid, f) / grid, color="0.2", linestyle=":", label=f"{law} fit")
        else:
            ax_s.plot([], [], " ", label=fit_label)
        for ax, values, errors in ((ax_s, speedup, err), (ax_e, speedup / p, err / p)):
            line = ax.errorbar(p[~over], values[~over], yerr=errors[:, ~over], marker="o",
                               capsize=3, label=label)
            if over.any():
                ax.errorbar(p[over], values[over], yerr=errors[:, over], marker="o", capsize=3,
                            linestyle="none", mfc="white", color=line[0].get_color(),
                            label=f"{label}, oversubscribed (> {cores} cores)")
                ax.axvspan(cores + 0.5, p.max() + 0.5, color="0.93", zorder=0)
        ax_s.set(xlabel="workers m", ylabel="speedup S = T(1) / T(m)" if scaling == "strong"
                 else "scaled speedup m T(1) / T(m)", title=f"{title} ({scaling} scaling)")
        ax_e.set(xlabel="workers m", ylabel="efficiency E = S / m", title="Efficiency",
                 ylim=(0, 1.15 * max(1.0, float(np.max(speedup / p)))))
        for ax, where in ((ax_s, "upper left"), (ax_e, "best")):  # above S(m) <= m: empty
            ax.set_xticks(p)
            ax.legend(fontsize=8, loc=where)
        fig.tight_layout()
    return fig


def plot_convergence(runs: Mapping[str, Mapping[str, Sequence[float]]], *,
                     metric: str = "loss", title: str = "Convergence", log_y: bool = False,
                     step_label: str = "step"):
    """One curve per run against step (left) and against wall-clock seconds (right).

    ``runs`` maps a label to ``{"step": [...], "time": [...], metric: [...]}``. Runs without
    "time" appear on the left only; when no run has one, there is only the left panel.
    ``step_label`` names the x axis of the left panel (e.g. "epoch").
    """
    if not runs:
        raise ValueError("runs is empty: pass {label: {'step': [...], 'time': [...], "
                         f"'{metric}': [...]}}")
    for label, run in runs.items():
        if not isinstance(run, Mapping) or metric not in run or "step" not in run:
            raise ValueError(f"run {label!r} needs 'step' and '{metric}' (it has "
                             f"{sorted(run) if isinstance(run, Mapping) else type(run).__name__})")
        if len(run["step"]) != len(run[metric]):
            raise ValueError(f"run {label!r}: 'step' and '{metric}' differ in length")
    timed = any("time" in run for run in runs.values())
    with course_style():
        if timed:
            fig, (ax_step, ax_time) = plt.subplots(1, 2, sharey=True)
        else:
            fig, ax_step = plt.subplots(figsize=(6.0, 3.6))
            ax_time = None
        for i, (label, run) in enumerate(runs.items()):
            style = RUN_STYLES[i % len(RUN_STYLES)]
            line, = ax_step.plot(run["step"], run[metric], label=label, linestyle=style)
            if "time" in run:
                ax_time.plot(run["time"], run[metric], label=label, color=line.get_color(),
                             linestyle=style)
        ax_step.set(xlabel=step_label, ylabel=metric,
                    title=f"{title}: by {step_label}" if timed else title)
        axes = [ax_step]
        if timed:
            ax_time.set(xlabel="wall-clock time (s)", title=f"{title}: by wall-clock")
            axes.append(ax_time)
        for ax in axes:
            if log_y:
                ax.set_yscale("log")
            if ax.get_lines():
                ax.legend()
        fig.tight_layout()
    return fig


def plot_times(timings: Mapping[str, Timing], *, title: str = "Wall time",
               predicted: Mapping[str, float] | None = None, unit: str = "s"):
    """Median time of each variant as a bar with its interquartile range, and, when given, the
    time a model predicts for it as a grey tick: measurement next to theory."""
    if not timings:
        raise ValueError("timings is empty")
    if unit not in ("s", "ms", "us"):
        raise ValueError(f"unit must be 's', 'ms' or 'us', got {unit!r}")
    if bad := [f"{k!r} ({type(t).__name__})" for k, t in timings.items()
               if not isinstance(t, Timing)]:
        raise ValueError(f"plot_times takes {{name: Timing}} (measure's results): {bad[0]} is not")
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    names = list(timings)
    med = np.array([timings[n].median for n in names]) * scale
    q = np.array([timings[n].quartiles for n in names]) * scale
    with course_style():
        fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(names), 3.4))
        ax.bar(names, med, yerr=np.abs([med - q[:, 0], q[:, 1] - med]), capsize=4,
               color=[STYLE["axes.prop_cycle"].by_key()["color"][i % 7]
                      for i in range(len(names))], label="measured median (IQR)")
        if predicted:
            xs = [names.index(n) for n in predicted if n in timings]
            ys = [predicted[n] * scale for n in predicted if n in timings]
            ax.scatter(xs, ys, marker="_", s=900, linewidths=2.5, color="0.3", zorder=3,
                       label="predicted")
        ax.set(ylabel=f"time ({unit})", title=title, ylim=(0, 1.3 * float(q[:, 1].max())))
        ax.grid(axis="x", visible=False)
        ax.legend(loc="upper left", ncols=2)
        fig.tight_layout()
    return fig


GANTT_COLORS = {"compute": "#1f77b4", "forward": "#1f77b4", "backward": "#2ca02c",
                "communicate / wait": "#ff7f0e", "idle (waiting for the straggler)": "0.85",
                "idle": "0.85", "all-reduce": "#ff7f0e", "wait": "#d62728",
                "optimizer": "#9467bd", "GPU compute": "#1f77b4"}


def plot_gantt(spans, *, title: str = "Timeline", worker_label: str = "worker",
               unit: str = "ms", lane_names=None):
    """A timeline: one row per lane (worker, rank, stage), one bar per :class:`Span`, a colour
    per kind — the lectures' pictures of who computes, talks or waits when. Times are seconds
    shown in ``unit`` ("s" or "ms"); any other unit (e.g. "forward steps") labels times given
    in that unit as they are. ``lane_names`` ({lane: label}) names the rows instead of
    ``worker_label`` and the lane's number."""
    spans = [Span(*s) for s in spans]
    if not spans:
        raise ValueError("spans is empty: pass Span(lane, start, duration, kind) values")
    if bad := [s for s in spans if not (np.isfinite(s.start) and s.duration >= 0)]:
        raise ValueError(f"a span needs a finite start and a duration of at least 0, got {bad[0]}")
    scale = {"s": 1.0, "ms": 1e3}.get(unit, 1.0)
    workers = sorted({s[0] for s in spans})
    kinds = list(dict.fromkeys(s[3] for s in spans))
    palette = STYLE["axes.prop_cycle"].by_key()["color"]
    taken = {GANTT_COLORS[k] for k in kinds if k in GANTT_COLORS}
    free = [c for c in palette if c not in taken] or palette  # no two kinds share a colour
    colors = {k: GANTT_COLORS.get(k, free[i % len(free)]) for i, k in enumerate(kinds)}
    with course_style():
        fig, ax = plt.subplots(figsize=(9.0, 1.1 + 0.4 * len(workers)))
        for worker, start, duration, kind in spans:
            ax.barh(worker, duration * scale, left=start * scale, height=0.7,
                    color=colors[kind], edgecolor="white", linewidth=0.5)
        handles = [matplotlib.patches.Patch(color=colors[k], label=k) for k in kinds]
        ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        names = lane_names or {}
        ax.set_yticks(workers, [names.get(w, f"{worker_label} {w}") for w in workers])
        ax.invert_yaxis()
        ax.set(xlabel=f"time ({unit})", title=title)
        ax.grid(axis="y", visible=False)
        fig.tight_layout()
    return fig


def plot_rank_chunks(grids, titles, *, labels=None, suptitle: str = "", column: str = "c"):
    """Panels of rank x chunk tables, the slides' pictures of collectives: row = rank, column =
    chunk (``column`` and its number), the number (or ``labels[i][rank][chunk]``) in each cell.
    Empty cells (None or NaN) are left white: that rank holds nothing useful there."""
    if len(grids) == 0 or len(grids) != len(titles):
        raise ValueError(f"pass at least one grid and a title for each: {len(grids)} grids, "
                         f"{len(titles)} titles")
    with course_style():
        fig, axes = plt.subplots(1, len(grids), figsize=(2.3 * len(grids), 2.6), squeeze=False)
        for i, (grid, ax) in enumerate(zip(grids, axes[0], strict=True)):
            values = np.array([[np.nan if v is None else float(v) for v in row] for row in grid])
            ax.imshow(np.ma.masked_invalid(values), cmap="Blues", vmin=0,
                      vmax=np.nanmax(values) * 1.6 if np.isfinite(values).any() else 1)
            for r in range(values.shape[0]):
                for c in range(values.shape[1]):
                    text = labels[i][r][c] if labels is not None else (
                        "" if np.isnan(values[r, c]) else f"{values[r, c]:g}")
                    ax.text(c, r, text, ha="center", va="center", fontsize=8)
            ax.set_xticks(range(values.shape[1]), [f"{column}{c}" for c in range(values.shape[1])])
            ax.set_yticks(range(values.shape[0]), [f"rank {r}" for r in range(values.shape[0])])
            ax.tick_params(length=0)
            ax.grid(False)
            for spine in ax.spines.values():
                spine.set_visible(False)
            ax.set_title(titles[i], fontsize=9)
        if suptitle:
            fig.suptitle(suptitle)
        fig.tight_layout()
    return fig


def plot_label_counts(panels, *, title: str = "Label counts per client"):
    """One heatmap per partition: rows = clients, columns = classes, colour = how many rows of
    that class the client holds; each panel's title carries its mean skew (EMD) when given as
    ``{name: (counts, emd)}`` instead of ``{name: counts}``. One colour scale for all panels,
    from 0 to the largest count, so the one colour bar reads every panel."""
    if not panels:
        raise ValueError("panels is empty: pass {name: counts matrix}")
    pairs = {name: panel if isinstance(panel, tuple) else (panel, None)
             for name, panel in panels.items()}
    for name, (_, skew) in pairs.items():
        if skew is not None and np.ndim(skew):
            raise ValueError(f"panel {name!r}: its EMD must be one number (the mean skew over "
                             f"clients), got an array of shape {np.shape(skew)}")
    top = max(float(np.max(np.asarray(counts), initial=0)) for counts, _ in pairs.values())
    with course_style():
        fig, axes = plt.subplots(1, len(panels), figsize=(2.4 * len(panels) + 0.8, 3.6),
                                 squeeze=False)
        for ax, (name, (counts, skew)) in zip(axes[0], pairs.items(), strict=True):
            image = ax.imshow(np.asarray(counts), aspect="auto", cmap="viridis",
                              interpolation="nearest", vmin=0, vmax=top or 1)
            ax.set(xlabel="class", title=name if skew is None else f"{name}\nEMD {skew:.2f}")
            ax.grid(False)
        axes[0][0].set_ylabel("client")
        fig.colorbar(image, ax=axes[0].tolist(), label="rows", shrink=0.8)
        fig.suptitle(title, y=1.04)
    return fig
