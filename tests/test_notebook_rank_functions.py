"""Every rank function a lesson defines takes ``group=None`` and passes it on.

A rank function is one a notebook hands to ``launch`` (``launch(fn, ...)``) or to an exercise's
check that runs it on ranks (``RANK_CHECKS``), or one such a function calls by name. Run as it is,
it uses all the ranks; a caller can give it a smaller group, so each must use ``group`` (not the
default group) for what it asks of the ranks. Found by reading each lesson's code cells (``ast``),
not by running them.
"""

import ast
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# the exercises' checks that launch the student's function on ranks (check_gather: an autograd
# Function, whose forward is the rank function)
RANK_CHECKS = {"check_mean_and_max", "check_doubling_all_reduce", "check_weighted_average",
               "check_push_sum", "check_overlapped", "check_zero1", "check_ef_sign",
               "check_gather"}


def definitions(path) -> tuple[dict, set]:
    """A lesson's top-level functions by name (a class by its ``forward``: an autograd Function),
    and the names it passes to ``launch`` or a check in ``RANK_CHECKS``."""
    functions, launched = {}, set()
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        tree = ast.parse("\n".join(lines))
        functions |= {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        functions |= {n.name: forward for n in tree.body if isinstance(n, ast.ClassDef)
                      for forward in n.body
                      if isinstance(forward, ast.FunctionDef) and forward.name == "forward"}
        launched |= {n.args[0].id for n in ast.walk(tree)
                     if isinstance(n, ast.Call)
                     and getattr(n.func, "id", None) in {"launch"} | RANK_CHECKS
                     and n.args and isinstance(n.args[0], ast.Name)}
    return functions, launched


def rank_functions(functions: dict, launched: set) -> set:
    """The launched functions and those of the lesson's functions they call, transitively."""
    found, todo = set(), [name for name in launched if name in functions]
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += [n.func.id for n in ast.walk(functions[name])
                     if isinstance(n, ast.Call) and getattr(n.func, "id", None) in functions]
    return found


def takes_and_uses_group(fn: ast.FunctionDef) -> bool:
    """``group`` is a parameter with the default None, and the body reads it."""
    args = fn.args.args + fn.args.kwonlyargs
    positional = [a.arg for a in fn.args.args]
    defaults = dict(zip(positional[len(positional) - len(fn.args.defaults):], fn.args.defaults,
                        strict=True))
    defaults |= {a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True)
                 if d is not None}
    default = defaults.get("group")
    return ("group" in [a.arg for a in args] and isinstance(default, ast.Constant)
            and default.value is None
            and any(isinstance(n, ast.Name) and n.id == "group" for n in ast.walk(fn)))


def test_the_check_finds_a_rank_function_without_a_group():
    tree = ast.parse("def helper(x):\n    return dist.get_rank()\n\n"
                     "def run(x, group=None):\n    return helper(x), dist.get_rank(group)\n\n"
                     "def good(group=None):\n    return dist.get_rank(group)\n\n"
                     "launch(run, 2)\nlaunch(good, 2)\n")
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert rank_functions(functions, {"run", "good"}) == {"run", "helper", "good"}
    assert [takes_and_uses_group(functions[n]) for n in ("helper", "run", "good")] == \
        [False, True, True]
    unused = ast.parse("def run(group=None):\n    return dist.get_rank()\n").body[0]
    assert not takes_and_uses_group(unused)


def test_the_rank_checks_are_the_exercises_own():
    import importlib
    import pkgutil

    from course_lib import exercises

    names = {name for info in pkgutil.iter_modules(exercises.__path__)
             if info.name.startswith("lesson")
             for name in dir(importlib.import_module(f"course_lib.exercises.{info.name}"))}
    assert RANK_CHECKS <= names, sorted(RANK_CHECKS - names)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_rank_function_takes_a_group_and_passes_it_on(path):
    functions, launched = definitions(path)
    missing = sorted(name for name in rank_functions(functions, launched)
                     if not takes_and_uses_group(functions[name]))
    assert not missing, f"rank functions without group=None, or not using it: {missing}"
