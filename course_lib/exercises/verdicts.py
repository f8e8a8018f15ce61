"""What a check cell shows: one box with the verdict, the explanation first.

Lecture: none (the homework machinery). In a notebook's kernel a check never raises: it shows
"correct", "not solved yet" or "wrong" with what is wrong, and the traceback folded away (click
to open it, or ``last_traceback()``), so Run All goes on past an exercise the student has not
done. Everywhere else -- tests, scripts -- a check returns its verdict or raises
:class:`~course_lib.exercises.common.ExerciseFailed`. ``COURSE_LIB_CHECKS=show`` or ``raise``
forces one behaviour.
"""

from __future__ import annotations

import html
import os
import sys

MODE = "COURSE_LIB_CHECKS"  # "show" (boxes) or "raise"; unset: boxes in a Jupyter kernel only
COLOURS = {"correct": "#2e7d32", "recorded": "#1565c0", "not solved yet": "#9e6a00",
           "wrong": "#c62828"}
_LAST: dict = {"traceback": ""}


def showing() -> bool:
    """True where checks show boxes instead of raising: a Jupyter kernel, or MODE=show."""
    mode = os.environ.get(MODE, "")
    if mode in ("show", "raise"):
        return mode == "show"
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and hasattr(shell, "kernel")


def kind_of(verdict: str) -> str:
    """The box a returned verdict goes in: "correct", or "recorded" (judged by the grader)."""
    return "recorded" if verdict.startswith("recorded") else "correct"


def box(kind: str, message: str, traceback: str = "") -> dict:
    """The box as a MIME bundle: plain text (what a terminal or a saved notebook's text shows)
    and HTML, with the traceback folded in a ``<details>`` element."""
    if kind not in COLOURS:
        raise ValueError(f"kind must be one of {sorted(COLOURS)}, got {kind!r}")
    head = message if message.startswith(kind) else f"{kind}: {message}"
    text = head + ("\n(the traceback: course_lib.exercises.last_traceback())" if traceback
                   else "")
    folded = (f"<details><summary>traceback</summary><pre>{html.escape(traceback)}</pre>"
              f"</details>" if traceback else "")
    colour = COLOURS[kind]
    page = (f'<div style="border-left: 6px solid {colour}; padding: 0.4em 0.8em; '
            f'margin: 0.2em 0"><b style="color: {colour}">{html.escape(kind)}</b>'
            f"{html.escape(head[len(kind):])}{folded}</div>")
    return {"text/plain": text, "text/html": page}


def show(kind: str, message: str, traceback: str = "") -> None:
    """Display the box in the cell (print its text where there is no display)."""
    _LAST["traceback"] = traceback
    bundle = box(kind, message, traceback)
    ipython = sys.modules.get("IPython")
    if ipython is None or ipython.get_ipython() is None:  # a terminal, a test
        print(bundle["text/plain"])
        return
    from IPython.display import display

    display(bundle, raw=True)


def last_traceback() -> str:
    """The traceback of the last check that failed here (empty when there was none)."""
    print(_LAST["traceback"] or "no check has failed with a traceback")
    return _LAST["traceback"]
