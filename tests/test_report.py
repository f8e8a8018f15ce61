"""Sentences from values and figures a reader sees (course_lib.report)."""

import math

import IPython.display
import ipywidgets as widgets
import matplotlib.pyplot as plt
import pytest

from course_lib import report


def test_a_claim_that_holds_is_printed_with_its_evidence(capsys):
    assert report.claim("buckets beat one all-reduce after backward", 0.58 < 0.9,
                        ratio=0.5812, seeds=[0.58, 0.61, 0.6], backend="gloo") is None
    assert capsys.readouterr().out == (
        "claim holds: buckets beat one all-reduce after backward (ratio = 0.5812, "
        "seeds = [0.58, 0.61, 0.6], backend = 'gloo')\n")
    import numpy as np

    report.claim("numpy's bools count", np.float64(1.0) > 0)
    assert capsys.readouterr().out == "claim holds: numpy's bools count\n"


def test_a_false_claim_stops_the_notebook_with_its_evidence(capsys):
    with pytest.raises(report.ClaimFailed, match=r"the lesson says: faster \(speedup = 0.9\) "
                       r"-- this run does not bear it out"):
        report.claim("faster", 0.9 > 1.0, speedup=0.9)
    assert capsys.readouterr().out == ""  # nothing printed as if it held
    assert issubclass(report.ClaimFailed, AssertionError)  # nbval and pytest see a failure
    with pytest.raises(TypeError, match="must be a bool"):
        report.claim("a value is not a comparison", 0.9)
    with pytest.raises(ValueError, match="statement"):
        report.claim("", True)


def test_percent_off_says_within_above_or_below():
    assert report.percent_off(1.02, 1.0) == "within 5% of"
    assert report.percent_off(1.41, 1.0) == "41% above"
    assert report.percent_off(0.88, 1.0, above="slower", below="faster") == "12% faster"
    assert report.percent_off(7.55, 4.54, close=0.1) == "66% above"
    with pytest.raises(ValueError, match="undefined"):
        report.percent_off(1.0, 0.0)
    for measured, expected in ((float("nan"), 1.0), (1.0, float("inf"))):
        with pytest.raises(ValueError, match="need finite values"):
            report.percent_off(measured, expected)
    with pytest.raises(ValueError, match="close is a share"):
        report.percent_off(1.0, 1.0, close=-1)


def test_times_as_names_the_direction():
    assert report.times_as(1.7, 1.0) == "1.7x faster than"
    assert report.times_as(0.5, 1.0) == "2.0x slower than"
    assert report.times_as(2.0, 1.0, more="more", less="less") == "2.0x more than"
    assert report.times_as(0.96, 1.0) == report.times_as(1.04, 1.0) == "within 5% of"
    assert report.times_as(1.06, 1.0) == "1.1x faster than"
    for measured, reference in ((0.0, 1.0), (float("nan"), 1.0), (1.0, float("inf"))):
        with pytest.raises(ValueError, match="need positive finite values"):
            report.times_as(measured, reference)


def test_mean_spread_over_seeds():
    assert report.mean_spread([0.93, 0.94, 0.95], "{:.2f}") == "0.94 ± 0.01 (3 seeds)"
    assert report.mean_spread([3.0]) == "3 (1 seed)"
    assert report.mean_spread([20, 24, 22], "{:.0f}", count=False) == "22 ± 2"
    with pytest.raises(ValueError):
        report.mean_spread([])
    # a run that diverged: said in words, not "nan ± nan"
    assert report.mean_spread([0.5, float("nan"), 0.4]) == "not finite (NaN or inf) in 1 of 3 seeds"
    assert report.mean_spread([math.inf], count=False) == "not finite (NaN or inf) in 1 of 1 runs"


def test_rank_correlation_is_spearmans_with_ties_sharing_their_mean_rank():
    from scipy.stats import spearmanr  # scikit-learn's dependency: the reference

    from course_lib.report import rank_correlation

    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    for a, b in (([3.1, 1.0, 2.2, 5.0, 4.4], [2, 1, 4, 3, 5]),
                 ([1, 2, 2, 3, 7, 7], [0.5, 0.1, 0.3, 0.9, 0.2, 0.8])):
        assert rank_correlation(a, b) == pytest.approx(spearmanr(a, b).statistic)
    with pytest.raises(ValueError, match="same length"):
        rank_correlation([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="all equal"):
        rank_correlation([1, 1, 1], [1, 2, 3])
    with pytest.raises(ValueError, match="a NaN has no rank"):
        rank_correlation([1, float("nan"), 3, 2], [1, 2, 3, 4])


def test_interactive_figure_saves_one_picture_and_redraws_it_in_place(monkeypatch):
    shown, updated, drawn = [], [], []

    def draw(n):
        drawn.append(n)
        fig, ax = plt.subplots()
        ax.plot(range(n))
        return fig

    monkeypatch.setattr(IPython.display, "display",
                        lambda obj, **kw: shown.append((obj, kw)))
    monkeypatch.setattr(IPython.display, "update_display",
                        lambda obj, **kw: updated.append((obj, kw)))
    slider = widgets.IntSlider(value=3, min=1, max=9)
    named = widgets.IntSlider(value=1, description="kept")
    report.interactive_figure(lambda n, micro_batches: draw(n), n=slider, micro_batches=named)
    assert slider.description == "n" and named.description == "kept"  # every control labelled
    shown.clear(), drawn.clear()
    named.description = ""
    report.interactive_figure(lambda micro_batches: draw(3), micro_batches=named)
    assert named.description == "micro batches"
    shown.clear(), drawn.clear()
    slider = widgets.IntSlider(value=3, min=1, max=9)
    report.interactive_figure(draw, n=slider)
    (figure, figure_kw), (bundle, bundle_kw) = shown
    assert isinstance(figure, plt.Figure) and drawn == [3]
    assert bundle_kw == {"raw": True} and "redraw the figure above" in bundle["text/plain"]
    assert "application/vnd.jupyter.widget-view+json" in bundle
    slider.value = 5  # a reader moves the slider: the same display is redrawn
    assert drawn == [3, 5] and updated[0][1]["display_id"] == figure_kw["display_id"]


def test_progress_outside_a_notebook_only_iterates(capsys):
    assert list(report.progress(range(4), "sweep")) == [0, 1, 2, 3]
    assert capsys.readouterr().out == ""


def test_progress_in_a_notebook_shows_a_bar_then_one_line(monkeypatch):
    shown, updated = [], []
    monkeypatch.setattr(report, "_in_a_kernel", lambda: True)
    monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: shown.append((obj, kw)))
    monkeypatch.setattr(IPython.display, "update_display",
                        lambda obj, **kw: updated.append((obj, kw)))
    seen = []
    for i in report.progress([10, 20, 30], "Table 2"):
        seen.append(i)
        bar = shown[0][0].children[0]
        assert bar.value == len(seen) - 1  # counted once the step is done
    assert seen == [10, 20, 30] and len(shown) == 1 and bar.value == 3
    (line, kw), = updated
    assert kw["display_id"] == shown[0][1]["display_id"] and kw["raw"]
    assert line["text/plain"].startswith("Table 2: 3 of 3 in ")  # the bar collapsed to a line
    with pytest.raises(ZeroDivisionError):  # a loop that fails still collapses its bar
        for _ in report.progress([1, 0], "failing"):
            1 / _
    assert updated[-1][0]["text/plain"].startswith("failing: 1 of 2")


def test_saved_notebooks_keep_no_state_of_closed_progress_bars():
    """A finished progress bar leaves one line of output and nothing in the notebook's saved
    widget state: every saved widget model is one a displayed widget needs."""
    import json
    import re
    from pathlib import Path

    ref = re.compile(r"IPY_MODEL_([0-9a-f]+)")
    for path in sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb")):
        nb = json.loads(path.read_text())
        state = (nb["metadata"].get("widgets", {})
                 .get("application/vnd.jupyter.widget-state+json", {}).get("state", {}))
        todo = [o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
                for c in nb["cells"] for o in c.get("outputs", [])
                if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
        needed = set()
        while todo:
            model = todo.pop()
            if model in state and model not in needed:
                needed.add(model)
                todo += ref.findall(json.dumps(state[model]))
        assert set(state) == needed, f"{path.name}: state of {len(set(state) - needed)} " \
                                     f"widgets no output shows (closed progress bars?)"
        assert "IntProgressModel" not in {m["model_name"] for m in state.values()}, path.name


def test_percent_off_never_reads_zero_per_cent_for_a_difference():
    assert report.percent_off(1.004, 1.0, close=0.001) == "0.4% above"  # it said "0% above"
    assert report.percent_off(1.0004, 1.0, close=0.001) == "within 0.1% of"
    assert report.percent_off(1.0, 1.0, close=0) == "within 0% of"


def test_a_claim_takes_a_comparison_of_one_number_tensors_but_not_of_many():
    import torch
    report.claim("a one-number comparison", torch.tensor(1.0) < torch.tensor(2.0))
    with pytest.raises(report.ClaimFailed):
        report.claim("a false one", torch.tensor(3.0) < torch.tensor(2.0))
    with pytest.raises(TypeError, match="holds must be a bool"):
        report.claim("many at once", torch.tensor([1.0, 2.0]) < 3)
