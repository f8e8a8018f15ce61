"""Saying what a run showed, truthfully: sentences printed from the values, and figures a reader
sees without a running kernel.

A lesson never types a measured number into its prose: the number changes with the machine and
the seed, the prose would not. Code prints it, and a sentence that depends on it ("41% slower
than the model", "0.93 ± 0.01 over 3 seeds") comes from these helpers, and a conclusion stated
in words is checked against the run with ``claim``, which stops the notebook when it is false.
An interactive figure shows its default state as a saved picture and redraws that same picture
when its controls move. A long sweep shows a progress bar while it runs, which collapses into
one line when done.
"""

from __future__ import annotations

import math
import statistics
import time
import uuid

import numpy as np


class ClaimFailed(AssertionError):
    """A lesson's sentence that this run did not bear out (``claim``)."""


def _evidence(evidence: dict) -> str:
    def show(value):
        if isinstance(value, float):
            return f"{value:.4g}"
        if isinstance(value, (list, tuple)) and all(isinstance(v, float) for v in value):
            return "[" + ", ".join(f"{v:.4g}" for v in value) + "]"
        return repr(value) if isinstance(value, str) else str(value)

    return ", ".join(f"{name} = {show(value)}" for name, value in evidence.items())


def claim(statement: str, holds: bool, **evidence) -> None:
    """Check a conclusion the lesson states in words against this run's values: prints
    "claim holds: <statement> (<evidence>)" when ``holds`` is true (and returns nothing, so a
    cell that ends with it shows the line once); raises
    ``ClaimFailed`` with the statement and the same evidence when it is false, so that a notebook
    run (and CI's) stops rather than leave a false sentence in front of the reader.

    ``claim("buckets beat the all-reduce after backward", bucket < after, bucket_ms=...,
    after_ms=...)``. ``holds`` must be a ``bool`` (numpy's too): a claim is decided by a
    comparison, not by a value's truthiness."""
    if not statement or not isinstance(statement, str):
        raise ValueError("a claim needs its statement, in words")
    if getattr(holds, "dtype", None) is not None and str(holds.dtype) in ("torch.bool", "bool") \
            and getattr(holds, "ndim", 1) == 0:
        holds = bool(holds)  # a comparison of one-number tensors or arrays
    if not isinstance(holds, (bool, np.bool_)):
        raise TypeError(f"holds must be a bool (a comparison), not {type(holds).__name__}")
    line = f"{statement} ({_evidence(evidence)})" if evidence else statement
    if not holds:
        raise ClaimFailed(f"the lesson says: {line} -- this run does not bear it out")
    print(f"claim holds: {line}")


def percent_off(measured: float, expected: float, *, close: float = 0.05,
                above: str = "above", below: str = "below") -> str:
    """How ``measured`` stands against ``expected``, in words: "within 5% of", "41% above",
    "12% below" (``above``/``below`` can say "slower than"/"faster than"). Finish the sentence
    with what was expected: f"... {percent_off(t, model)} the model"."""
    if not (math.isfinite(measured) and math.isfinite(expected)):
        raise ValueError(f"need finite values, got {measured} and {expected}")
    if expected == 0:
        raise ValueError("expected is 0: a relative difference is undefined")
    if not close >= 0:
        raise ValueError(f"close is a share, zero or more; got {close}")
    off = (measured - expected) / abs(expected)

    def share(x):  # whole per cents, or enough digits that none reads "0%"
        return f"{x:.0%}" if x >= 0.01 or x == 0 else f"{100 * x:.2g}%"
    if abs(off) <= close:
        return f"within {share(close)} of"
    return f"{share(abs(off))} {above if off > 0 else below}"


def times_as(measured: float, reference: float, *, more: str = "faster",
             less: str = "slower") -> str:
    """A ratio in words: "1.7x faster than" when measured / reference = 1.7, "2.0x slower than"
    when it is 0.5 (``more``/``less`` name the directions); "within 5% of" where the ratio would
    print as 1.0x either way (no direction claimed on a difference that small)."""
    if not (0 < measured < math.inf and 0 < reference < math.inf):
        raise ValueError(f"need positive finite values, got {measured} and {reference}")
    ratio = measured / reference
    if 1 / 1.05 < ratio < 1.05:
        return "within 5% of"
    return f"{ratio:.1f}x {more} than" if ratio >= 1 else f"{1 / ratio:.1f}x {less} than"


def mean_spread(values, fmt: str = "{:.3g}", *, count: bool = True) -> str:
    """Mean ± sample standard deviation over runs (seeds): "0.935 ± 0.004 (3 seeds)"; without
    the "(3 seeds)" when ``count`` is False (a table that says it once). Where a value is NaN or
    infinite (a run that diverged) it says so instead of printing "nan ± nan"."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("no values")
    seeds = f" ({len(values)} seed{'s' if len(values) > 1 else ''})" if count else ""
    if not all(math.isfinite(v) for v in values):  # a run that diverged: no mean to give
        bad = sum(not math.isfinite(v) for v in values)
        return f"not finite (NaN or inf) in {bad} of {len(values)} {'seeds' if count else 'runs'}"
    if len(values) == 1:
        return f"{fmt.format(values[0])}{seeds}"
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(statistics.stdev(values))}{seeds}"


def rank_correlation(a, b) -> float:
    """Spearman's rank correlation of two equally long sequences: the correlation of their
    ranks (ties share the mean rank). 1: the same order; -1: reversed."""
    a, b = [float(v) for v in a], [float(v) for v in b]
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"need two sequences of the same length >= 2, got {len(a)} and "
                         f"{len(b)}")
    if any(math.isnan(v) for v in a + b):
        raise ValueError("a NaN has no rank: need numbers")

    def ranks(values):
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        i = 0
        while i < len(order):  # a run of ties gets the mean of its positions
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    spread = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    if spread == 0:
        raise ValueError("a sequence whose values are all equal has no order to correlate")
    return cov / spread


def interactive_figure(draw, note: str = "", **controls):
    """Show ``draw(**values)`` -- a function returning a matplotlib Figure -- as one figure with
    the ipywidgets ``controls`` (name -> widget, labelled with its name unless it has a
    description) under it. The figure of the controls' default
    values is a plain image, so it is saved with the notebook and seen without a kernel; moving
    a control redraws that same image in place, in a running notebook."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display, update_display

    handle = f"course-lib-figure-{uuid.uuid4().hex}"
    figure = draw(**{name: control.value for name, control in controls.items()})
    display(figure, display_id=handle)
    plt.close(figure)

    def redraw(change=None):
        new = draw(**{name: control.value for name, control in controls.items()})
        update_display(new, display_id=handle)
        plt.close(new)

    for name, control in controls.items():
        if not control.description:  # a slider without a label says nothing: name it
            control.description = name.replace("_", " ")
            control.style.description_width = "initial"  # the whole label, not cut short
        control.observe(redraw, names="value")
    box = widgets.VBox(list(controls.values()))
    bundle = box._repr_mimebundle_()
    # what a reader without a kernel sees in place of the controls: a sentence, not a repr
    bundle["text/plain"] = note or ("(controls: " + ", ".join(controls) + " -- they redraw the "
                                    "figure above in a running notebook)")
    display(bundle, raw=True)


def _in_a_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with the notebooks
        return False
    return getattr(get_ipython(), "kernel", None) is not None


def progress(iterable, description: str = "", total: int | None = None):
    """Iterate over ``iterable``; in a notebook, show a progress bar while the loop runs and
    replace it, when the loop ends, by one line: "description: 30 of 30 in 12.3 s". Outside
    a notebook (a script, a test, CI's log) it shows and prints nothing."""
    if not _in_a_kernel():
        yield from iterable
        return
    import ipywidgets as widgets
    from IPython.display import display, update_display

    total = total if total is not None else len(iterable)
    bar = widgets.IntProgress(value=0, min=0, max=max(total, 1), description=description,
                              style={"description_width": "initial"})
    label = widgets.Label(f"0 of {total}")
    box, handle, start, done = widgets.HBox([bar, label]), f"progress-{uuid.uuid4().hex}", \
        time.perf_counter(), 0
    display(box, display_id=handle)
    try:
        for item in iterable:
            yield item
            done += 1
            bar.value = done
            label.value = f"{done} of {total}, {time.perf_counter() - start:.0f} s"
    finally:  # also when the loop stops early or raises: the bar never stays behind
        box.close()
        update_display({"text/plain": f"{description}: {done} of {total} in "
                                      f"{time.perf_counter() - start:.1f} s"},
                       raw=True, display_id=handle)
