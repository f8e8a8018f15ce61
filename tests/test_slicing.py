"""The def-use analysis (``def_use``, ``python_names``) and what the grader runs of a lesson
(``slicing``; ``grading.only_needed``): each exercise gets what it depends on, nothing it does
not, and the same verdict as the whole lesson."""

import ast
from pathlib import Path

import nbformat

from course_lib.exercises import def_use, grading, python_names, slicing

ROOT = Path(__file__).resolve().parents[1]


def test_a_cell_binds_reads_and_changes_what_python_says():
    cell = def_use.analyse("import torch\nx = torch.zeros(3)\nmodel.train()\nhistory[0] = y\n"
                           "print(z)", frozenset({"torch"}))
    assert cell.binds == {"torch", "x"}
    assert cell.reads >= {"model", "history", "y", "z"} and "x" not in cell.reads
    assert cell.changes == {"model", "history"}  # torch is a module; print changes nothing
    assert not cell.effects and not cell.opaque


def test_python_scopes_a_function_and_a_comprehension_keep_their_names():
    cell = def_use.analyse("def f(a):\n    b = a + g\n    return b\nsquares = [i * i for i in k]")
    assert cell.binds == {"f", "squares"} and cell.late == {"g"}
    assert cell.reads == {"k"}  # not i (the comprehension's), not a or b (f's)
    assert python_names.local_names(ast.parse("def f(a, *r):\n    b = 1").body[0]) == {"a", "r",
                                                                                       "b"}


def test_a_name_bound_before_it_is_read_in_the_same_piece_is_its_own():
    cell = def_use.analyse("fig, ax = plt.subplots()\nax.plot(w)\nfor q in qs:\n    v = q\nv.x()")
    assert "ax" not in cell.reads | cell.changes
    assert "v" in cell.changes  # the loop may not have run: v may be an earlier cell's
    assert def_use.analyse("del old").reads == {"old"}  # it must exist to be deleted


def test_seeds_files_magics_are_effects_and_globals_is_opaque():
    modules = frozenset({"torch", "os"})
    assert def_use.analyse("torch.manual_seed(0)", modules).effects
    assert def_use.analyse("os.environ['A'] = '1'", modules).effects
    assert def_use.analyse("%matplotlib inline\nx = 1").effects
    assert def_use.analyse("open('f', 'w').write('x')").effects
    for unreadable in ("globals()['x'] = 1", "from m import *", "print(_)", "x = (", "exec(s)",
                       "def f():\n    global x\n    x = 1"):
        assert def_use.analyse(unreadable).opaque, unreadable


def test_numbers_and_strings_are_never_changed_by_being_passed():
    cells = slicing.lesson(["BETA, LR = 0.9, 1e-3", "f(BETA)", "opts = {}", "f(opts)",
                            "print(BETA, opts)"])
    assert slicing.needed(cells, [4]) == {0, 2, 3, 4}  # f may change opts, not BETA


def test_a_call_changes_what_the_function_changes():
    cells = slicing.lesson(["log = []", "def step():\n    log.append(1)", "step()", "x = 2",
                            "print(log)"])
    assert slicing.needed(cells, [4]) == {0, 1, 2, 4}


def test_a_functions_names_are_read_where_it_may_be_called():
    cells = slicing.lesson(["g = 1", "def f():\n    return g", "g = 2", "sweep = 3", "f()"])
    # f may be called from cell 1 on: g as cell 0 or cell 2 binds it; never the sweep (3)
    assert slicing.needed(cells, [4]) == {0, 1, 2, 4}
    assert slicing.needed(cells, []) == set()


def test_a_function_handed_to_launch_runs_in_the_workers_and_changes_nothing_here():
    sources = ["from course_lib import launch", "B = pad['b']", "def work():\n    f(B)",
               "runs = launch(work, 2)", "print(B)"]
    assert slicing.runs_elsewhere(sources) == {"launch"}
    assert slicing.needed(slicing.lesson(sources), [4]) == {1, 4}
    assert def_use.analyse("launch(work, 2)", elsewhere=frozenset({"launch"})).shipped == {"work"}
    mine = sources + ["def launch(fn, n):\n    return fn()"]  # a launch of the student's own
    assert slicing.runs_elsewhere(mine) == frozenset()
    assert 3 in slicing.needed(slicing.lesson(mine), [4])  # work may change B here
    assert 3 in slicing.needed(slicing.lesson(["launch = run_here"] + sources[1:]), [4])


def test_cells_with_effects_before_the_last_exercise_always_run():
    cells = slicing.lesson(["import torch", "torch.manual_seed(0)", "y = 1", "print(2)"])
    assert slicing.needed(cells, [3]) == {0, 1, 3}  # the seed (and the torch it reads)
    assert slicing.needed(slicing.lesson(["x = 1", "exec('y = 2')", "print(y)"]), [2]) is None


def test_statements_split_a_cell_and_keep_decorators_and_one_line_pairs():
    source = "import a\n@dec\ndef f():\n    pass\nx = 1; y = 2\n"
    assert slicing.statements(source) == ["import a", "@dec\ndef f():\n    pass", "x = 1; y = 2"]
    assert slicing.statements("%time x = 1") == ["%time x = 1"]
    assert slicing.imported(["import numpy as np\nfrom a.b import c", "x = ("]) == {"np", "c"}
    assert python_names.without_magics("%time\nx = 1\n!ls") == "x = 1"
    assert python_names.has_magics("x = 1\n  !ls") and not python_names.has_magics("x = 1")


def test_to_run_keeps_a_constant_and_leaves_the_sweep_out():
    sources = ["import time\nK = 3\nresults = [time.sleep(1) for _ in range(9)]",
               "plot(results)", "### BEGIN SOLUTION\nanswer = K * 2\n### END SOLUTION",
               "check(answer)"]
    run = slicing.to_run(sources, [2, 3])
    assert run == ["K = 3", None, sources[2], sources[3]]
    assert slicing.to_run(sources[:2] + ["globals()['answer'] = 1", sources[3]], [2, 3]) is None


def _tiny(tmp_path):
    """A lesson: a sweep no exercise needs, data both exercises read, two exercises."""
    nb = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell
    check = "from course_lib.exercises.lesson07 import check_safe_scale\n"
    nb.cells = [code("import time\nimport torch\ngrads = torch.tensor([1e-3, 2.0, -300.0])\n"
                     "swept = [time.sleep(0.05) for _ in range(4)]"),
                code("### BEGIN SOLUTION\ndef safe(g):\n    return 7\n### END SOLUTION"),
                code(check + "check_safe_scale(safe(grads), grads)"),
                code("### BEGIN SOLUTION\nk = safe(grads)\n### END SOLUTION"),
                code(check + "check_safe_scale(k, grads)")]
    from course_lib.exercises import editions
    editions.mark(nb)
    path = tmp_path / "tiny.ipynb"
    nbformat.write(nb, path)
    return path


def test_only_what_is_needed_gives_the_whole_lessons_verdicts(tmp_path):
    lesson = _tiny(tmp_path)
    for answer, scores in (("k = safe(grads)", [1, 1]), ("k = 3", [1, 0]),
                           ("k = globals()['safe'](grads)", [1, 1])):
        nb = nbformat.read(lesson, as_version=4)
        nb.cells[3].source = answer
        submission = tmp_path / "submitted.ipynb"
        nbformat.write(nb, submission)
        sliced = grading.grade(submission, lesson, cell_timeout=60, keep=tmp_path / "kept.ipynb")
        assert [e["score"] for e in sliced["exercises"]] == scores, grading.summary(sliced)
        if "globals" in answer:  # the analysis can't read it: the whole lesson ran
            assert sliced["ran"].startswith("the whole lesson (what the exercises need could")
            continue
        whole = grading.grade(submission, lesson, cell_timeout=60, whole=True)
        assert [e["score"] for e in whole["exercises"]] == scores, grading.summary(whole)
        assert whole["ran"] == "the whole lesson"
        assert sliced["ran"] == "what the exercises need: 5 of 5 code cells (1 of them in part)"
        kept = nbformat.read(tmp_path / "kept.ipynb", as_version=4)
        assert kept.cells[0].metadata["course_lib"]["ran"] == \
            "in part: import torch\ngrads = torch.tensor([1e-3, 2.0, -300.0])"
        assert kept.cells[0].source == nb.cells[0].source  # the audit copy shows the lesson's


def test_only_needed_cuts_the_notebook_and_says_what_it_left_out():
    nb = nbformat.read(ROOT / "notebooks" / "06_sync_async_sgd.ipynb", as_version=4)
    graded = {e["index"] for e in grading.exercises(nb)}
    code = sum(c.cell_type == "code" for c in nb.cells)
    cut, line = grading.only_needed(nb, graded)
    assert line.startswith("what the exercises need:") and f"of {code} code cells" in line
    assert any(v is None for v in cut.values()) and not set(cut) & graded


def test_for_every_lesson_the_analysis_decides_and_keeps_each_exercise_whole():
    lessons = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert len(lessons) >= 10
    for path in lessons:
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        targets = [k for k, c in enumerate(code) if grading.nbgrader_meta(c).get("grade")
                   or grading.nbgrader_meta(c).get("solution")]
        run = slicing.to_run([c.source for c in code], targets)
        assert run is not None, path.name
        assert all(run[k] == code[k].source for k in targets), path.name
        assert sum(r is None for r in run) >= 1, path.name  # something is left out
