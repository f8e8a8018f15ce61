"""The two editions of the course: the instructor's (everything) and the student's (no answers).

Lecture: none (the homework machinery). An exercise is a **solution cell** -- the answer between
``### BEGIN SOLUTION`` and ``### END SOLUTION`` -- followed by a **check cell** that calls a
``check_`` function of ``course_lib.exercises.lessonNN``. These are nbgrader's own markers, and
``mark`` writes nbgrader's cell metadata, so the lessons also work as the source of an nbgrader
course. The same markers in ``course_lib``'s Python files fence what the library must not give
away (a reference a hidden test needs, say): ``student_library`` cuts them out.

The student edition is a folder a student can work in: ``notebooks/`` (every solution replaced by
a stub that raises; the outputs before the first exercise kept, the rest cleared),
``course_lib/`` (the library without its solution regions) and ``data/``. It leaves out
everything else, the instructor's guide included.
"""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import nbformat

SOLUTION = re.compile(r"^([ \t]*)### BEGIN SOLUTION[^\n]*\n.*?^[ \t]*### END SOLUTION[^\n]*(\n|$)",
                      re.MULTILINE | re.DOTALL)
HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS[^\n]*\n.*?^[ \t]*### END HIDDEN TESTS[^\n]*"
                    r"(\n|$)", re.MULTILINE | re.DOTALL)
STUB = 'raise NotImplementedError("write your solution here")\n'
LIBRARY_STUB = 'raise NotImplementedError("not in the student edition: the grader has it")\n'


def _meta(cell) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


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


def student_version(nb):
    """A copy with every solution replaced by a stub that raises NotImplementedError and hidden
    tests removed. The lesson's outputs before the first exercise stay (the figures a student
    reads before running anything); from the first solution cell on, all are cleared."""
    out = copy.deepcopy(nb)
    exercising = False
    for cell in out.cells:
        if cell.cell_type != "code":
            continue
        exercising = exercising or bool(SOLUTION.search(cell.source))
        cell.source = SOLUTION.sub(lambda m: m.group(1) + STUB, cell.source)
        cell.source = HIDDEN.sub("", cell.source)
        if exercising:
            cell.outputs, cell.execution_count = [], None
    out.metadata.pop("widgets", None)  # no live widget state: the figures stay as pictures
    return out


def strip_source(text: str) -> str:
    """A library file's student edition: solution regions raise, hidden tests are gone."""
    text = SOLUTION.sub(lambda m: m.group(1) + LIBRARY_STUB, text)
    return HIDDEN.sub("", text)


def student_library(source: Path, target: Path) -> Path:
    """Copy the package ``source`` (``course_lib``) to ``target`` with every Python file
    stripped (:func:`strip_source`); bytecode caches are left out."""
    source, target = Path(source), Path(target)
    if target.exists():
        shutil.rmtree(target)
    for path in sorted(source.rglob("*")):
        if "__pycache__" in path.parts or path.is_dir():
            continue
        dest = target / path.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".py":
            dest.write_text(strip_source(path.read_text()))
        else:
            shutil.copyfile(path, dest)
    return target


def release(source: Path, target: Path) -> list[Path]:
    """Write the student edition of the lessons in ``source`` (a ``notebooks`` folder beside
    ``course_lib`` and ``data``) into ``target``: ``target/notebooks``, ``target/course_lib``,
    ``target/data``. Returns the notebooks written."""
    import course_lib

    source, target = Path(source), Path(target)
    (target / "notebooks").mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(source.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        nbformat.write(student_version(nb), target / "notebooks" / path.name)
        written.append(target / "notebooks" / path.name)
    student_library(Path(course_lib.__file__).parent, target / "course_lib")
    data = Path(course_lib.__file__).resolve().parent.parent / "data"
    if data.is_dir():
        shutil.copytree(data, target / "data", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.gz", "*-ubyte", "MNIST", "FashionMNIST"))
    return written
