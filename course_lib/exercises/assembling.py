"""The notebook the grader runs: the lesson's own cells with the student's solutions in them,
cut down to what the exercises need.

Lecture: none (the homework machinery; ``grading`` runs what this assembles). What is graded is
the lesson itself -- the instructor's cells, in the instructor's order -- with the student's code
in its solution cells and nowhere else. A solution is found by its nbgrader ``grade_id``, or
where an editor stripped the metadata, as the cell just before the lesson's check cell.
"""

from __future__ import annotations

import copy

from course_lib.exercises import slicing
from course_lib.exercises.editions import HIDDEN, nbgrader_meta, stub


def _by_position(submitted, lesson) -> dict[str, str]:
    """Solutions found without metadata (an editor that strips it): for each of the lesson's
    solution cells, the submission's code cell just before a cell holding the lesson's next
    check cell, word for word, the first such pair."""
    found, code = {}, [c for c in submitted.cells if c.get("cell_type") == "code"
                       and isinstance(c.get("source"), str)]
    for i, cell in enumerate(lesson.cells):
        gid = nbgrader_meta(cell).get("grade_id") if nbgrader_meta(cell).get("solution") else None
        check = next((c for c in lesson.cells[i + 1:] if nbgrader_meta(c).get("grade")), None)
        if gid is None or check is None:
            continue
        for before, after in zip(code, code[1:], strict=False):  # each cell and the next
            if after.source.strip() == check.source.strip():
                found[gid] = before.source
                break
    return found


def _checks(nb) -> list[str]:
    """The sources of ``nb``'s check cells (graded, not a solution) as the student edition has
    them: hidden tests left out, stripped."""
    return [HIDDEN.sub("", c["source"]).strip() for c in nb.cells
            if isinstance(c.get("source"), str) and nbgrader_meta(c).get("grade")
            and not nbgrader_meta(c).get("solution")]


def another_lesson(submitted, lesson) -> str | None:
    """Why the submission looks like another lesson's notebook under this lesson's name: it
    holds check cells, none of them this lesson's, and no cell holds one of this lesson's check
    cells (its title is named). None otherwise. Exercise ids repeat from lesson to lesson, so
    such a notebook's solutions would run in this lesson's cells and fail there."""
    ours, theirs = set(_checks(lesson)), _checks(submitted)
    code = {HIDDEN.sub("", c["source"]).strip() for c in submitted.cells
            if isinstance(c.get("source"), str)}
    if not ours or not theirs or ours & code:
        return None
    title = next((line.lstrip("# ").strip() for c in submitted.cells
                  if c.get("cell_type") == "markdown" and isinstance(c.get("source"), str)
                  for line in c["source"].splitlines() if line.startswith("#")), "no title")
    return (f"the submission holds none of this lesson's check cells, but {len(theirs)} other "
            f"one(s): another lesson's notebook under this name? Its title: {title[:80]!r}")


def assemble(submitted, lesson):
    """The notebook that is graded: the lesson's cells, outputs cleared, with the code of the
    submission's solution cells (the first code cell carrying each solution's grade_id, or
    where no cell carries it, the cell just before the lesson's check cell) in place of the
    lesson's. Returns it and the solution ids the submission has no cell for."""
    theirs = {}
    for cell in submitted.cells:
        meta = nbgrader_meta(cell)
        gid = meta.get("grade_id") if meta.get("solution") else None
        if cell.get("cell_type") == "code" and isinstance(gid, str) and gid not in theirs \
                and isinstance(cell.get("source"), str):
            theirs[gid] = cell.source
    theirs = {**_by_position(submitted, lesson), **theirs}
    nb = copy.deepcopy(lesson)
    missing = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        cell.outputs, cell.execution_count = [], None
        gid = nbgrader_meta(cell).get("grade_id") if nbgrader_meta(cell).get("solution") else None
        if gid is not None and gid not in theirs:
            missing.append(gid)
            cell.source = stub(cell.source, [c.source for c in lesson.cells[i + 1:]
                                             if c.cell_type == "code"])
        cell.source = HIDDEN.sub("", cell.source)
        if gid is not None and gid in theirs:
            cell.source = theirs[gid]
    nb.metadata.pop("widgets", None)
    return nb, missing


def only_needed(nb, graded) -> tuple[dict, str]:
    """Cut the assembled notebook down to what its exercises need (``slicing``): every solution
    and check cell, and of the other cells the statements they depend on. Returns what it
    changed (cell index: its whole source, or None for a cell that is skipped) and a line for the
    report; the notebook is unchanged when the analysis cannot decide."""
    code = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    targets = [k for k, i in enumerate(code)
               if i in graded or nbgrader_meta(nb.cells[i]).get("solution")]
    run = slicing.to_run([nb.cells[i].source for i in code], targets)
    if run is None:
        return {}, "the whole lesson (what the exercises need could not be decided)"
    cut = {}
    for i, source in zip(code, run, strict=True):
        if source != nb.cells[i].source:
            cut[i] = nb.cells[i].source if source is not None else None
            nb.cells[i].source = source if source is not None else nb.cells[i].source
    skipped = sum(source is None for source in run)
    return cut, (f"what the exercises need: {len(code) - skipped} of {len(code)} code cells "
                 f"({sum(s is not None for s in cut.values())} of them in part)")
