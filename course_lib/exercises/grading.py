"""Homework: mark the lessons' exercises for nbgrader, write student versions, grade submissions.

Every lesson ends with exercises: a **solution cell** (the answer between ``### BEGIN SOLUTION``
and ``### END SOLUTION``) followed by a **check cell** that calls a ``check_`` function of
``course_lib.exercises.lessonNN``
(optionally with extra checks between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``).
These are nbgrader's own markers, and ``mark`` writes nbgrader's cell metadata (solution cells,
graded test cells with points, ``grade_id``), so the lesson notebooks also work as the source of
an nbgrader course. For a classroom without nbgrader, this module is the thin layer that does the
two jobs an instructor needs::

    python -m course_lib.exercises mark notebooks               # authoring (idempotent)
    python -m course_lib.exercises release notebooks student    # the notebooks to hand out
    python -m course_lib.exercises grade submissions --source notebooks --out reports

Grading runs each submission in a fresh kernel with a time limit per cell and for the whole
notebook, replaces the graded check cells by the instructor's (with their hidden tests), and
gives each exercise its points if its check cell runs without error. A cell that raises, hangs
or prints without end costs its own exercise at most; worker processes are killed afterwards.
"""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path

import nbformat

from course_lib.exercises.kernels import (
    HIDDEN_FAILED,
    _kernel_pid,
    _kill_children,
    _responsive,
    _restart,
    _run_hidden,
)

SOLUTION = re.compile(r"^([ \t]*)### BEGIN SOLUTION[^\n]*\n.*?^[ \t]*### END SOLUTION[^\n]*(\n|$)",
                      re.MULTILINE | re.DOTALL)
HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS[^\n]*\n.*?^[ \t]*### END HIDDEN TESTS[^\n]*"
                    r"(\n|$)", re.MULTILINE | re.DOTALL)
STUB = 'raise NotImplementedError("write your solution here")\n'
MAX_OUTPUTS = 200  # per cell: a cell that prints without end cannot fill the grader's memory
HIDDEN_KEY = "course_lib_hidden_tests_of"  # cell metadata: the hidden tests of this exercise
MAX_OUTPUT_BYTES = 1_000_000  # per cell, counted over what is kept: few huge prints alike


# -- authoring ---------------------------------------------------------------------------------


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def mark(nb, points: int = 1):
    """Give each exercise nbgrader metadata: its solution cell (``### BEGIN SOLUTION``) and the
    next code cell that calls a ``check_`` function, its graded test cell worth ``points``
    (points already set are kept). Returns the notebook (changed in place)."""
    number = 0
    cells = nb.cells
    for i, cell in enumerate(cells):
        if cell.cell_type != "code" or "### BEGIN SOLUTION" not in cell.source:
            continue
        number += 1
        cell.metadata["nbgrader"] = dict(grade=False, grade_id=f"exercise-{number}-solution",
                                         locked=False, schema_version=3, solution=True)
        for test in cells[i + 1:]:
            if test.cell_type == "code" and "check_" in test.source and \
                    "### BEGIN SOLUTION" not in test.source:
                old = _meta(test).get("points", points)
                test.metadata["nbgrader"] = dict(grade=True, grade_id=f"exercise-{number}",
                                                 locked=True, points=old, schema_version=3,
                                                 solution=False)
                break
        else:
            raise ValueError(f"exercise {number}: no check cell (a code cell calling check_...) "
                             f"after its solution cell")
    return nb


def exercises(nb) -> list[dict]:
    """The graded cells of a marked notebook: grade_id, points and cell index."""
    return [dict(grade_id=_meta(c)["grade_id"], points=_meta(c).get("points", 0), index=i)
            for i, c in enumerate(nb.cells) if _meta(c).get("grade")]


# -- student versions ------------------------------------------------------------------------------


def student_version(nb):
    """A copy with every solution replaced by a stub that raises NotImplementedError, hidden
    tests removed and all outputs cleared."""
    out = copy.deepcopy(nb)
    for cell in out.cells:
        if cell.cell_type != "code":
            continue
        cell.source = SOLUTION.sub(lambda m: m.group(1) + STUB, cell.source)
        cell.source = HIDDEN.sub("", cell.source)
        cell.outputs, cell.execution_count = [], None
    out.metadata.pop("widgets", None)
    return out


def release(source: Path, target: Path) -> list[Path]:
    """Write the student version of every notebook in ``source`` into ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(Path(source).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        nbformat.write(student_version(nb), target / path.name)
        written.append(target / path.name)
    return written


# -- grading ---------------------------------------------------------------------------------------


def _client(nb, cwd, cell_timeout):
    from nbclient import NotebookClient

    class CappedClient(NotebookClient):
        kept_bytes: dict = {}

        def output(self, outs, msg, display_id, cell_index):
            content = msg.get("content", {})
            size = len(json.dumps(content, default=str))
            kept = self.kept_bytes.get(cell_index, 0) if outs else 0  # outs empty: a new run
            if len(outs) >= MAX_OUTPUTS or kept >= MAX_OUTPUT_BYTES:
                return None  # drop the rest: printing without end must not fill memory
            if kept + size > MAX_OUTPUT_BYTES:
                if msg["msg_type"] != "stream":
                    return None
                # the kernel batches prints into one message: keep its head, say so
                room = max(MAX_OUTPUT_BYTES - kept - 200, 0)
                msg = {**msg, "content": {**content, "text": content.get("text", "")[:room]
                                          + "\n[output cut by the grader]\n"}}
                size = MAX_OUTPUT_BYTES - kept
            self.kept_bytes[cell_index] = kept + size
            return super().output(outs, msg, display_id, cell_index)

    timeout_error = dict(ename="CellTimeout", evalue=f"the cell ran longer than {cell_timeout} s "
                         f"and was interrupted", traceback=[])
    return CappedClient(nb, timeout=cell_timeout, kernel_name="python3", allow_errors=False,
                        interrupt_on_timeout=True, error_on_timeout=timeout_error,
                        resources={"metadata": {"path": str(cwd)}})


def _first_line(error) -> str:
    ename, evalue = getattr(error, "ename", type(error).__name__), getattr(error, "evalue", "")
    return f"{ename}: {evalue}".strip().splitlines()[0][:500] if (ename or evalue) else str(error)


def grade(submission, source, *, cell_timeout: float = 120, timeout: float = 900,
          keep: Path | None = None) -> dict:
    """Run a submitted notebook and score each exercise of its lesson ``source``.

    The graded cells are the instructor's (from ``source``, hidden tests included), whatever the
    submission did to them; everything else is the student's. Returns a report: the points per
    exercise with why any were lost, the total and the seconds taken."""
    from nbclient.exceptions import CellExecutionError, DeadKernelError

    source_nb = nbformat.read(source, as_version=4)
    graded = {e["grade_id"]: e for e in exercises(source_nb)}
    nb = nbformat.read(submission, as_version=4)
    results = {gid: dict(grade_id=gid, points=e["points"], score=0.0, feedback="not run")
               for gid, e in graded.items()}
    for gid in _place_check_cells(nb, source_nb, graded):
        results[gid]["feedback"] = "the check cell is missing from the submission"
    client = _client(nb, Path(source).parent, cell_timeout)
    start = time.monotonic()
    earlier = None  # the last failure of an ungraded cell since the previous graded one
    with client.setup_kernel():
        kernel_pid = _kernel_pid(client)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            gid = _meta(cell).get("grade_id") if _meta(cell).get("grade") else None
            hidden_of = cell.metadata.get(HIDDEN_KEY)
            if hidden_of is not None:  # its visible check passed: run it; else skip it
                if results[hidden_of].get("visible_passed") and \
                        _run_hidden(client, cell, i, kernel_pid):
                    results[hidden_of].update(score=float(results[hidden_of]["points"]),
                                              feedback="correct")
                kernel_pid = _kernel_pid(client)  # a new one if the hidden tests needed it
                continue
            if time.monotonic() - start > timeout:
                if gid in results:
                    results[gid]["feedback"] = f"not run: the notebook passed its {timeout} s limit"
                continue
            try:
                client.execute_cell(cell, i)
            except CellExecutionError as error:
                why = _first_line(error)
                if getattr(error, "ename", "") == "CellTimeout" and not _responsive(client):
                    # the cell ignored the interrupt: only a new kernel frees the next cells
                    _kill_children(kernel_pid)
                    kernel_pid = _restart(client)
                    why += " (it ignored the interrupt: the kernel was restarted, and later " \
                           "cells ran without what earlier cells defined)"
                if gid in results:
                    before = f" (an earlier cell failed: {earlier})" if earlier else ""
                    results[gid]["feedback"] = why + before
                    earlier = None
                else:
                    earlier = f"cell {i}: {why}"
                continue
            except DeadKernelError:
                if gid in results:
                    results[gid]["feedback"] = "the kernel died while this cell ran"
                else:
                    earlier = f"cell {i}: the kernel died (restarted: earlier cells' work lost)"
                kernel_pid = _restart(client)
                continue
            finally:
                if kernel_pid:
                    _kill_children(kernel_pid)  # workers a cell left behind
            if gid in results:
                if any(c.metadata.get(HIDDEN_KEY) == gid for c in nb.cells):
                    results[gid].update(visible_passed=True, feedback=HIDDEN_FAILED)
                else:
                    results[gid].update(score=float(results[gid]["points"]), feedback="correct")
                earlier = None
    for result in results.values():
        result.pop("visible_passed", None)
    if keep is not None:  # the executed notebook, outputs capped, for audit
        nbformat.write(nb, keep)
    report = dict(submission=str(submission), lesson=Path(source).name,
                  exercises=list(results.values()),
                  score=sum(r["score"] for r in results.values()),
                  points=sum(r["points"] for r in results.values()),
                  seconds=round(time.monotonic() - start, 1))
    return report


def _place_check_cells(nb, source_nb, graded) -> list[str]:
    """Put the instructor's check cells where the submission has them, in place, and their
    hidden tests at the end. The submission's own grading metadata is not trusted: only the
    first code cell carrying an exercise's grade_id becomes its check cell; every other cell, a
    copy of a check cell included, loses its grading metadata and runs as plain student code, so
    it can never score. Returns the grade_ids the submission has no cell for."""
    first = {}
    for i, cell in enumerate(nb.cells):
        cell.get("metadata", {}).pop(HIDDEN_KEY, None)  # only the grader marks hidden cells
        meta = cell.get("metadata", {}).pop("nbgrader", None)
        gid = meta.get("grade_id") if isinstance(meta, dict) else None
        if cell.cell_type == "code" and gid in graded and gid not in first:
            first[gid] = i
    hidden_cells = []
    for gid, i in first.items():
        check = copy.deepcopy(source_nb.cells[graded[gid]["index"]])
        hidden = "".join(m.group(0) for m in HIDDEN.finditer(check.source))
        check.source = HIDDEN.sub("", check.source)
        nb.cells[i] = check
        if hidden:
            hidden_cells.append(nbformat.v4.new_code_cell(hidden, metadata={HIDDEN_KEY: gid}))
    # Hidden tests run last, apart from the visible checks, and a report only says whether they
    # passed: no cell runs after them whose error message (the student's code talking) could
    # carry their text into a report.
    nb.cells += hidden_cells
    return [gid for gid in graded if gid not in first]


def summary(report: dict) -> str:
    """A report people read: one line per exercise."""
    lines = [f"{report['submission']}: {report['score']:g} / {report['points']:g} points "
             f"({report['seconds']} s)"]
    for r in report["exercises"]:
        lines.append(f"  {r['grade_id']:12s} {r['score']:g}/{r['points']:g}  {r['feedback']}")
    return "\n".join(lines)
