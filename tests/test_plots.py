"""Plots (course_lib.plots): speedup with ideal and Amdahl, convergence by step and time."""

import os

import numpy as np
import pytest
import torch

from course_lib import plots
from course_lib.cost_models import amdahl_speedup, gustafson_speedup
from course_lib.runtime.timing import Timing


def test_plot_speedup_draws_measured_ideal_and_fit():
    fig = plots.plot_speedup([1, 2, 4], [Timing([1.0, 1.1]), [0.55, 0.6], 0.4], cores=2)
    speedup_ax, efficiency_ax = fig.axes
    labels = [t.get_text() for t in speedup_ax.get_legend().get_texts()]
    assert any("ideal" in x for x in labels) and any("Amdahl" in x for x in labels)
    assert any("oversubscribed" in x for x in labels)
    assert "speedup" in speedup_ax.get_ylabel() and "efficiency" in efficiency_ax.get_ylabel()


def test_plot_speedup_weak_scaling_fits_gustafson_and_errors():
    p = [1, 2, 4]
    times = [1.0] + [q / gustafson_speedup(q, 0.7) for q in p[1:]]  # T(p) = p T(1) / S(p)
    fig = plots.plot_speedup(p, times, scaling="weak")
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "weak" in fig.axes[0].get_title()
    assert any("Gustafson fit, f = 0.70 (2 points)" in x for x in legend)
    with pytest.raises(ValueError, match="include 1"):
        plots.plot_speedup([2, 4], [1.0, 0.5])
    with pytest.raises(ValueError, match="scaling"):
        plots.plot_speedup([1, 2], [1.0, 0.5], scaling="medium")
    for workers, times in (([1, 2, 4], [1.0, 0.6]), ([1, 0, 4], [1.0, 0.6, 0.4]),
                           ([1, -2, 4], [1.0, 0.6, 0.4]), ([1, 2.5], [1.0, 0.6])):
        with pytest.raises(ValueError, match="whole numbers of at least 1, one per entry"):
            plots.plot_speedup(workers, times)
    # plain numbers are checked as runs are: -1 and NaN used to draw, 0 to fail in matplotlib
    for bad in (-1.0, float("nan"), [0.5, -1.0]):
        with pytest.raises(ValueError, match="each finite and zero or more"):
            plots.plot_speedup([1, 2], [1.0, bad])
    with pytest.raises(ValueError, match="a time of 0 gives no speedup"):
        plots.plot_speedup([1, 2], [1.0, 0.0])


def test_plot_convergence_by_step_and_wall_clock():
    runs = {"sync": {"step": [0, 1, 2], "time": [0, 0.1, 0.2], "loss": [2, 1, 0.5]},
            "async": {"step": [0, 1, 2], "loss": [2, 1.2, 0.7]}}
    fig = plots.plot_convergence(runs, log_y=True)
    by_step, by_time = fig.axes
    assert len(by_step.get_lines()) == 2 and len(by_time.get_lines()) == 1
    assert by_time.get_xlabel() == "wall-clock time (s)"


def test_plot_convergence_rejects_malformed_runs():
    with pytest.raises(ValueError, match="empty"):
        plots.plot_convergence({})
    with pytest.raises(ValueError, match="needs 'step' and 'loss'"):
        plots.plot_convergence({"a": {"step": [0]}})
    with pytest.raises(ValueError, match="differ in length"):
        plots.plot_convergence({"a": {"step": [0, 1], "loss": [1.0]}})
    with pytest.raises(ValueError, match=r"needs 'step' and 'loss' \(it has ndarray\)"):
        plots.plot_convergence({"a": np.array([1.0, 0.5])})  # an array, not a run


def test_plot_times_draws_bars_with_spread_and_predictions():
    timings = {"launch": Timing([2.0, 2.2, 2.1]), "torchrun": Timing([7.0, 7.5])}
    fig = plots.plot_times(timings, predicted={"launch": 2.5, "torchrun": 6.0}, unit="ms")
    ax = fig.axes[0]
    heights = [bar.get_height() for bar in ax.patches]
    assert heights == pytest.approx([2100.0, 7250.0])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["predicted",
                                                                 "measured median (IQR)"]
    with pytest.raises(ValueError):
        plots.plot_times({})
    with pytest.raises(ValueError, match="unit must be 's', 'ms' or 'us', got 'min'"):
        plots.plot_times(timings, unit="min")
    with pytest.raises(ValueError, match=r"takes \{name: Timing\} .*: 'a' \(list\) is not"):
        plots.plot_times({"a": [1.0]})


def test_plot_convergence_gives_each_run_its_own_line_style():
    runs = {name: {"step": [0, 1], "loss": [1.0, 0.5]} for name in ("a", "b")}
    styles = [line.get_linestyle() for line in plots.plot_convergence(runs).axes[0].get_lines()]
    assert len(set(styles)) == 2  # identical curves must not hide each other


def test_plot_gantt_draws_one_row_per_worker_and_a_legend_per_kind():
    spans = [(0, 0.0, 0.01, "compute"), (1, 0.0, 0.02, "compute"),
             (0, 0.01, 0.01, "idle"), (0, 0.02, 0.005, "communicate / wait")]
    ax = plots.plot_gantt(spans).axes[0]
    assert len(ax.patches) == 4
    assert [t.get_text() for t in ax.get_yticklabels()] == ["worker 0", "worker 1"]
    assert len(ax.get_legend().get_texts()) == 3
    with pytest.raises(ValueError):
        plots.plot_gantt([])
    for bad in ((0, 0.0, -0.01, "compute"), (0, float("nan"), 0.01, "compute"),
                (0, 0.0, float("nan"), "compute")):
        with pytest.raises(ValueError, match="a finite start and a duration of at least 0"):
            plots.plot_gantt(spans + [bad])


def test_the_fit_leaves_out_the_oversubscribed_points_and_marks_them():
    p = [1, 2, 3, 4]
    times = [1.0] + [1.0 / amdahl_speedup(q, 0.9) for q in p[1:3]] + [5.0]  # 4: cores shared
    legend = [t.get_text() for t in
              plots.plot_speedup(p, times, cores=3).axes[0].get_legend().get_texts()]
    assert any("Amdahl fit, f = 0.90 (2 points)" in x for x in legend)
    assert any("oversubscribed (> 3 cores)" in x for x in legend)
    legend = [t.get_text() for t in
              plots.plot_speedup(p[:3], times[:3], cores=2).axes[0].get_legend().get_texts()]
    assert any("no Amdahl fit: needs 2 points with m > 1 and m <= 2 cores" in x for x in legend)


def test_no_fit_from_a_single_informative_point():
    legend = [t.get_text() for t in
              plots.plot_speedup([1, 2], [1.0, 0.6]).axes[0].get_legend().get_texts()]
    assert any("no Amdahl fit: needs 2 points with m > 1" in x for x in legend)
    assert not any("f =" in x for x in legend)


def test_plot_rank_chunks_writes_every_cell_and_leaves_empty_ones_blank():
    before = [[1, 2], [3, 4]]
    after = [[4, 6], [None, None]]
    fig = plots.plot_rank_chunks([before, after], ["before", "after reduce"])
    texts = [[t.get_text() for t in ax.texts] for ax in fig.axes]
    assert texts[0] == ["1", "2", "3", "4"] and texts[1] == ["4", "6", "", ""]
    labelled = plots.plot_rank_chunks([before], ["x"], labels=[[["a", "b"], ["c", "d"]]])
    named = plots.plot_rank_chunks([before], ["x"], column="step ")
    assert [t.get_text() for t in named.axes[0].get_xticklabels()] == ["step 0", "step 1"]
    assert [t.get_text() for t in labelled.axes[0].texts] == ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match="1 grids, 0 titles"):
        plots.plot_rank_chunks([before], [])
    with pytest.raises(ValueError, match="at least one grid"):
        plots.plot_rank_chunks([], [])
    array = plots.plot_rank_chunks(np.array([before, before]), ["a", "b"])  # an array of grids
    assert [t.get_text() for t in array.axes[1].texts] == ["1", "2", "3", "4"]


def test_course_style_restores_only_its_own_settings():
    import matplotlib

    before = matplotlib.rcParams["axes.grid"], matplotlib.rcParams["interactive"]
    with plots.course_style():
        assert matplotlib.rcParams["axes.grid"] is True
        matplotlib.rcParams["interactive"] = not before[1]  # as a backend switch would
    assert matplotlib.rcParams["axes.grid"] == before[0]
    assert matplotlib.rcParams["interactive"] == (not before[1])  # left as the switch set it
    matplotlib.rcParams["interactive"] = before[1]


def test_every_figure_of_a_notebook_is_shown(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    make = "plots.plot_rank_chunks([[[1, 2], [3, 4]]], ['a'])\nassert True"
    nb.cells = [nbformat.v4.new_code_cell("from course_lib import plots"),
                nbformat.v4.new_code_cell(make), nbformat.v4.new_code_cell(make)]
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # as in a real notebook
    nbclient.NotebookClient(nb, timeout=60, kernel_name="python3").execute(env=env)
    shown = [any("image/png" in o.get("data", {}) for o in cell.outputs) for cell in nb.cells[1:]]
    assert shown == [True, True]


def test_plot_convergence_without_times_has_one_panel_with_its_own_x_label():
    fig = plots.plot_convergence({"a": {"step": [1, 2], "loss": [1.0, 0.5]}}, step_label="epoch")
    assert len(fig.axes) == 1 and fig.axes[0].get_xlabel() == "epoch"


def test_plot_gantt_can_label_model_time_units():
    ax = plots.plot_gantt([(0, 0.0, 1.0, "forward")], unit="forward steps").axes[0]
    assert ax.get_xlabel() == "time (forward steps)"
    assert ax.patches[0].get_width() == pytest.approx(1.0)  # not rescaled


def test_plot_label_counts_draws_one_heatmap_per_partition():
    from course_lib.plots import plot_label_counts

    counts = np.array([[3, 0], [1, 2]])
    fig = plot_label_counts({"a": counts, "b": (counts, 0.5)})
    titles = [ax.get_title() for ax in fig.axes[:2]]
    assert titles == ["a", "b\nEMD 0.50"]
    wide = plot_label_counts({"small": counts, "large": torch.as_tensor(counts) * 9})  # a tensor
    # one scale for every panel, so the one colour bar reads each: 0 to the largest count
    assert [ax.images[0].get_clim() for ax in wide.axes[:2]] == [(0, 27), (0, 27)]
    with pytest.raises(ValueError, match="empty"):
        plot_label_counts({})
    with pytest.raises(ValueError, match="'b': its EMD must be one number"):
        plot_label_counts({"b": (counts, np.array([0.1, 0.9]))})  # per client, not the mean


def test_plot_gantt_names_lanes_it_is_given_and_numbers_the_others():
    spans = [(0, 0.0, 1.0, "backward"), (1, 0.5, 1.0, "all-reduce"), (2, 0.0, 1.0, "backward")]
    ax = plots.plot_gantt(spans, lane_names={0: "rank 0 compute", 1: "rank 0 all-reduce"}).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0 compute",
                                                            "rank 0 all-reduce", "worker 2"]
