"""Layers only look down: the floors every lesson stands on import no lesson module.

The floors: ``runtime/`` (the machinery that runs workers), ``models``, ``data``, ``cost_models``,
``pipeline_schedules`` (the order of a schedule's actions: data the cost model runs), ``training``
(the one step loop), ``report``, ``plots``, ``diagrams``, and what ``import course_lib`` runs
(``commands``, ``edition``). Every import counts, at the top of a module or inside a function.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "course_lib"
FLOORS = ("course_lib", "course_lib.runtime", "course_lib.models", "course_lib.data",
          "course_lib.cost_models", "course_lib.pipeline_schedules", "course_lib.report",
          "course_lib.plots", "course_lib.diagrams", "course_lib.training", "course_lib.commands",
          "course_lib.edition")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def on_a_floor(name: str) -> bool:
    """``course_lib`` itself is a floor only as the package (its ``__init__``), not its
    sub-modules; a sub-package of the floors counts with all its modules."""
    return name == "course_lib" or any(name == f or name.startswith(f + ".")
                                       for f in FLOORS[1:])


def imported(path: Path) -> set[str]:
    """The course_lib modules a file imports (``from course_lib import x`` names course_lib.x
    when x is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("course_lib")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_lib"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (PACKAGE.parent / Path(*sub.split("."))).with_suffix(".py").exists() \
                    or (PACKAGE.parent / Path(*sub.split(".")) / "__init__.py").exists()
                found.add(sub if is_module else node.module)
    return found


FLOOR_FILES = [p for p in sorted(PACKAGE.rglob("*.py")) if on_a_floor(module_name(p))]


@pytest.mark.parametrize("path", FLOOR_FILES, ids=[module_name(p) for p in FLOOR_FILES])
def test_a_floor_imports_only_floors(path):
    above = sorted(name for name in imported(path) if not on_a_floor(name))
    assert above == [], f"{module_name(path)} imports {above}, which stand above it"


def test_the_walk_sees_what_a_lesson_module_imports():
    # the test can fail: a lesson module imports the floors and other lessons
    lesson = imported(PACKAGE / "pipeline.py")
    assert {"course_lib.cost_models", "course_lib.models", "course_lib.pipelining"} <= lesson
    assert not on_a_floor("course_lib.pipeline") and not on_a_floor("course_lib.train_gpt")
    assert on_a_floor("course_lib.runtime.launching") and on_a_floor("course_lib")
    assert "course_lib.runtime.worker" in imported(PACKAGE / "runtime" / "forkserver.py")
    assert len(FLOOR_FILES) >= 15


def test_every_module_is_at_most_300_lines():
    long = {module_name(p): n for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 300}
    assert long == {}, f"modules over 300 lines (split them by role): {long}"
