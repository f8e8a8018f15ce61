"""The two editions of the course: the instructor's (everything) and the student's (no answers).

Lecture: none (the homework machinery). An exercise is a **solution cell** -- the answer between
``### BEGIN SOLUTION`` and ``### END SOLUTION`` -- followed by a **check cell** that calls a
``check_`` function of ``course_lib.exercises.lessonNN``. These are nbgrader's own markers, and
``mark`` writes nbgrader's cell metadata, so the lessons also work as the source of an nbgrader
course. The same markers in ``course_lib``'s Python files fence what the library must not give
away (a reference a hidden test needs, say): ``student_library`` cuts them out.

The student edition is a folder a student can work in: ``notebooks/`` (every solution replaced
by a stub -- see :func:`stub` -- that lets Run All go past it; only the exercises' own cells, the
solution and its check, cleared of outputs, every other cell's figures and results kept),
``course_lib/`` (the library without its solution regions, marked as the edition's:
``course_lib.edition``) and ``data/``. It leaves out everything else, the instructor's guide
included.
"""

from __future__ import annotations

import ast
import copy
import re
import shutil
from pathlib import Path

import nbformat

from course_lib.edition import MARKER as EDITION_MARKER
from course_lib.exercises.python_names import without_magics

SOLUTION = re.compile(r"^([ \t]*)### BEGIN SOLUTION[^\n]*\n.*?^[ \t]*### END SOLUTION[^\n]*(\n|$)",
                      re.MULTILINE | re.DOTALL)
HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS[^\n]*\n.*?^[ \t]*### END HIDDEN TESTS[^\n]*"
                    r"(\n|$)", re.MULTILINE | re.DOTALL)
STUB = 'raise NotImplementedError("write your solution here")\n'
PASS_STUB = "pass  # write your solution here\n"
LIBRARY_STUB = 'raise NotImplementedError("not in the student edition: the grader has it")\n'


def nbgrader_meta(cell) -> dict:
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
                old = nbgrader_meta(test).get("points", points)
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
    return [dict(grade_id=nbgrader_meta(c)["grade_id"], points=nbgrader_meta(c).get("points", 0),
                 index=i) for i, c in enumerate(nb.cells) if nbgrader_meta(c).get("grade")]


def _parse(source: str):
    try:
        return ast.parse(without_magics(source))
    except SyntaxError:
        return None


def _bound_at_top(tree) -> list[str]:
    """Names a module's top level binds (not those bound inside functions or comprehensions)."""
    names: list[str] = []

    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
            return
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp)):
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.append(node.id)
        elif isinstance(node, ast.alias):
            names.append((node.asname or node.name).split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return list(dict.fromkeys(names))


def _reads(tree) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _binds(tree) -> set[str]:
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and
             isinstance(n.ctx, (ast.Store, ast.Del))}
    names |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
    return names | {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef,
                                                                      ast.ClassDef))}


def answer_names(region: str, later: list[str]) -> list[str]:
    """The names a top-level solution region defines that later cells need: those the next
    code cell (its check) reads, and those a later cell reads without binding them itself."""
    tree = _parse(region)
    if tree is None:
        return []
    needed: set[str] = set()
    for number, source in enumerate(later):
        cell = _parse(source)
        if cell is not None:
            needed |= _reads(cell) if number == 0 else _reads(cell) - _binds(cell)
    return [name for name in _bound_at_top(tree) if name in needed]


def _in_function(source: str, line: int) -> bool:
    """Whether ``line`` of ``source`` lies in a function's body (rather than in a class body or
    a loop that runs as soon as the cell does)."""
    tree = _parse(source)
    if tree is None:
        return True
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                          ast.ClassDef))
              and n.lineno <= line <= (n.end_lineno or n.lineno)]
    return bool(scopes) and not isinstance(max(scopes, key=lambda n: n.lineno), ast.ClassDef)


def stub(source: str, later: list[str] = ()) -> str:
    """A solution cell's student edition. A region inside a function becomes a line that
    raises NotImplementedError when the function is called (a check then says "not solved
    yet"); one in a class body becomes ``pass`` (its methods are the answer); one at the top
    level becomes ``name = ...`` for each answer the later cells need, so that Run All goes on
    past it and the check can say "not solved yet"."""
    def replace(match):
        indent = match.group(1)
        if indent and not _in_function(source, source.count("\n", 0, match.start()) + 1):
            return indent + PASS_STUB  # a class body runs when defined: raising would stop it
        names = [] if indent else answer_names(match.group(0), list(later))
        if not names:
            return indent + STUB
        return ("# your answer: replace each ... with the code that computes it\n" +
                "".join(f"{name} = ...\n" for name in names))

    return HIDDEN.sub("", SOLUTION.sub(replace, source))


def is_solution(cell) -> bool:
    return cell.cell_type == "code" and (bool(SOLUTION.search(cell.source)) or
                                         bool(nbgrader_meta(cell).get("solution")))


def student_version(nb):
    """A copy with every solution replaced by its :func:`stub` and hidden tests removed. Every
    cell keeps its outputs (the lesson's figures and results, which a student reads before
    running anything) except the exercises' own: their solution and check cells."""
    out = copy.deepcopy(nb)
    for i, cell in enumerate(out.cells):
        if cell.cell_type != "code":
            continue
        exercise = is_solution(cell) or bool(nbgrader_meta(cell).get("grade"))
        if is_solution(cell):
            later = [c.source for c in nb.cells[i + 1:] if c.cell_type == "code"]
            cell.source = stub(cell.source, later)
            following = next((c for c in out.cells[i + 1:] if c.cell_type == "code"), None)
            if following is not None and "check_" in following.source:
                following.outputs, following.execution_count = [], None  # its check
        cell.source = HIDDEN.sub("", cell.source)
        if exercise:
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


STUDENT_PYPROJECT = """[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "course-lib"
version = "0.1.0"
description = "The course kit's library, student edition: the exercises' answers left out."
requires-python = ">=3.10"
dependencies = {dependencies}

[tool.setuptools.packages.find]
include = ["course_lib*"]

[tool.setuptools.package-data]
"course_lib" = ["EDITION"]
"course_lib.exercises" = ["practice.json"]
"""


def student_pyproject(ours: Path) -> str:
    """A ``pyproject.toml`` that makes the student edition pip-installable, its library without
    the answers (what a hosted notebook's first cell installs: ``course_lib.site``), with the
    dependencies of ``ours``, the course's own."""
    found = re.search(r"^dependencies = (\[.*?\])", Path(ours).read_text(), re.S | re.M)
    return STUDENT_PYPROJECT.format(dependencies=found.group(1) if found else "[]")


def lessons_in(source: Path) -> list[Path]:
    """The lessons (``*.ipynb``) of the folder ``source``; refused, naming it, where it is not a
    folder or holds none (a mistyped ``--source`` must not grade against nothing)."""
    source = Path(source)
    if not source.is_dir():
        raise FileNotFoundError(f"{source}: no such folder of lessons")
    if not (lessons := sorted(source.glob("*.ipynb"))):
        raise ValueError(f"{source} holds no lessons (*.ipynb): give the instructor's notebooks "
                         f"folder")
    return lessons


def check_release_target(source: Path, target: Path) -> Path:
    """``target`` resolved, if a release may write there: never the course's own folders or the
    lessons' folder, and only a new or empty folder or an earlier release (its ``course_lib``
    carries the edition's marker), since a release replaces ``target/course_lib``."""
    import course_lib

    root = Path(course_lib.__file__).resolve().parent.parent
    source, target = Path(source).resolve(), Path(target).resolve()
    mine = [root / part for part in ("notebooks", "course_lib", "data", ".git")] + [source]
    if target == root or root.is_relative_to(target) or source.is_relative_to(target) or any(
            target.is_relative_to(folder) for folder in mine):
        raise ValueError(f"{target} would overwrite the course or its lessons: release into a "
                         f"folder of its own (e.g. student-edition)")
    if target.exists() and not target.is_dir():
        raise ValueError(f"{target} is a file, not a folder")
    earlier = (target / "course_lib" / EDITION_MARKER).is_file()
    if target.is_dir() and any(target.iterdir()) and not earlier:
        raise ValueError(f"{target} holds files that are not a student edition: a release "
                         f"replaces its course_lib, so choose a new or empty folder")
    return target


def release(source: Path, target: Path) -> list[Path]:
    """Write the student edition of the lessons in ``source`` (a ``notebooks`` folder beside
    ``course_lib`` and ``data``) into ``target`` (checked by :func:`check_release_target`):
    ``target/notebooks``, ``target/course_lib``, ``target/data``, and a ``pyproject.toml`` that
    pip installs the edition's library with. Returns the notebooks written."""
    import course_lib

    lessons, target = lessons_in(source), check_release_target(source, target)
    (target / "notebooks").mkdir(parents=True, exist_ok=True)
    written = []
    for path in lessons:
        nb = nbformat.read(path, as_version=4)
        nbformat.write(student_version(nb), target / "notebooks" / path.name)
        written.append(target / "notebooks" / path.name)
    student_library(Path(course_lib.__file__).parent, target / "course_lib")
    (target / "course_lib" / EDITION_MARKER).write_text(
        "the student edition: its kernel must import this course_lib (course_lib/edition.py)\n")
    ours = Path(course_lib.__file__).resolve().parent.parent / "pyproject.toml"
    if ours.is_file():  # pip install <the edition's folder or repository> installs its library
        (target / "pyproject.toml").write_text(student_pyproject(ours))
    data = Path(course_lib.__file__).resolve().parent.parent / "data"
    if data.is_dir():
        shutil.copytree(data, target / "data", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.gz", "*-ubyte", "MNIST", "FashionMNIST"))
    return written
