"""Homework tooling: nbgrader marks, student versions, grading (course_lib.exercises.grading)."""

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_lib.exercises import grading as hw
from course_lib.exercises import submissions as subs

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _solution_lines(source):
    """The code lines inside the solution regions of a cell."""
    lines = []
    for block in re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", source, re.DOTALL):
        lines += [line.strip() for line in block.splitlines() if line.strip()]
    return lines


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_every_lesson_has_at_least_two_graded_exercises_marked_for_nbgrader(path):
    nb = nbformat.read(path, as_version=4)
    graded = hw.exercises(nb)
    assert len(graded) >= 2
    solutions = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert len(solutions) == len(graded)
    for e in graded:
        cell = nb.cells[e["index"]]
        assert e["points"] > 0 and cell.metadata["nbgrader"]["locked"]
        assert "check_" in cell.source  # a course_lib check explains what is wrong
    assert hw.mark(nbformat.read(path, as_version=4)).cells == nb.cells  # marking is stable


def test_student_versions_contain_no_solution_code_and_no_hidden_tests(tmp_path):
    written = hw.release(ROOT / "notebooks", tmp_path)
    assert [p.name for p in written] == [p.name for p in LESSONS]
    hidden_seen = 0
    for lesson_path, student_path in zip(LESSONS, written, strict=True):
        lesson = nbformat.read(lesson_path, as_version=4)
        student = nbformat.read(student_path, as_version=4)
        assert len(student.cells) == len(lesson.cells)  # in step with the lesson, cell by cell
        for theirs, ours in zip(lesson.cells, student.cells, strict=True):
            hidden_seen += "BEGIN HIDDEN TESTS" in theirs.source
            assert "BEGIN SOLUTION" not in ours.source and "HIDDEN TESTS" not in ours.source
            for line in _solution_lines(theirs.source):
                if len(line) > 12:  # short lines like "return x" also occur elsewhere
                    assert line not in ours.source, f"{student_path.name}: {line!r} leaked"
            if "BEGIN SOLUTION" in theirs.source:
                assert hw.STUB.strip() in ours.source
            elif "BEGIN HIDDEN TESTS" not in theirs.source:
                assert ours.source == theirs.source
            if ours.cell_type == "code":
                assert ours.outputs == [] and ours.execution_count is None
    assert hidden_seen >= 2  # the lessons do have hidden tests to remove


def _tiny_lesson(path):
    """A two-exercise lesson that runs in seconds, with course_lib checks."""
    cells = [
        new_markdown_cell("# Tiny lesson"),
        new_code_cell("import torch"),
        new_code_cell("def aggregate(models, sizes):\n    ### BEGIN SOLUTION\n"
                      "    n = sum(sizes)\n"
                      "    return sum(k / n * w for k, w in zip(sizes, models))\n"
                      "    ### END SOLUTION"),
        new_code_cell("from course_lib.exercises.lesson08 import check_weighted_average\n\n"
                      "print(check_weighted_average(aggregate))"),
        new_code_cell("def staleness_aware(alpha, staleness):\n    ### BEGIN SOLUTION\n"
                      "    return alpha / max(staleness, 1)\n    ### END SOLUTION"),
        new_code_cell("from course_lib.exercises.lesson06 import check_staleness_aware_lr\n\n"
                      "print(check_staleness_aware_lr(staleness_aware))\n"
                      "### BEGIN HIDDEN TESTS\nassert abs(staleness_aware(1.0, 4) - 0.25) < 1e-12\n"
                      "### END HIDDEN TESTS"),
    ]
    nb = hw.mark(new_notebook(cells=cells))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return nb


@pytest.fixture
def lesson(tmp_path):
    """The tiny two-exercise lesson, written to tmp_path/lesson/tiny.ipynb."""
    path = tmp_path / "lesson" / "tiny.ipynb"
    path.parent.mkdir()
    _tiny_lesson(path)
    return path


def _submission(lesson, path, **replace):
    """The lesson with some solution cells replaced (index -> new source)."""
    nb = nbformat.read(lesson, as_version=4)
    for index, source in replace.items():
        nb.cells[int(index[1:])].source = source
    nbformat.write(nb, path)
    return path


def test_grading_the_lesson_itself_gives_full_marks(tmp_path, lesson):
    report = hw.grade(lesson, lesson, cell_timeout=60)
    assert report["score"] == report["points"] == 2
    assert [e["feedback"] for e in report["exercises"]] == ["correct", "correct"]


def test_an_untouched_student_notebook_scores_zero_without_hanging(tmp_path, lesson):
    hw.release(lesson.parent, tmp_path / "student")
    start = time.monotonic()
    report = hw.grade(tmp_path / "student" / "tiny.ipynb", lesson, cell_timeout=60)
    assert report["score"] == 0 and report["points"] == 2
    assert all("NotImplementedError" in e["feedback"] for e in report["exercises"])
    assert time.monotonic() - start < 60


def test_one_wrong_answer_loses_exactly_that_exercise_and_says_why(tmp_path, lesson):
    wrong = _submission(lesson, tmp_path / "tiny.ipynb", c2=(
        "def aggregate(models, sizes):\n    return torch.stack(models).mean(dim=0)"))
    report = hw.grade(wrong, lesson, cell_timeout=60)
    first, second = report["exercises"]
    assert (first["score"], second["score"], report["score"]) == (0, 1, 1)
    assert "plain mean" in first["feedback"]  # the check's explanation reaches the report


def test_a_student_cannot_weaken_the_check_cells(tmp_path, lesson):
    cheat = _submission(lesson, tmp_path / "tiny.ipynb",
                        c4="def staleness_aware(alpha, staleness):\n"
                           "    return alpha / (staleness + 1)",
                        c5="print('correct')")
    report = hw.grade(cheat, lesson, cell_timeout=60)
    assert report["exercises"][1]["score"] == 0  # the instructor's check cell ran, not theirs


def test_a_cell_that_never_returns_is_stopped_at_the_limit_and_graded(tmp_path, lesson):
    stuck = _submission(lesson, tmp_path / "tiny.ipynb", c2="while True:\n    pass")
    start = time.monotonic()
    report = hw.grade(stuck, lesson, cell_timeout=5)
    assert time.monotonic() - start < 45
    first, second = report["exercises"]
    assert first["score"] == 0 and "CellTimeout" in first["feedback"]
    assert second["score"] == 1  # the kernel was interrupted, not lost


def test_endless_printing_and_leftover_workers_cost_nothing_else(tmp_path, lesson):
    noisy = _submission(lesson, tmp_path / "tiny.ipynb", c1=(
        "import subprocess, sys, torch\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "while True:\n    print('spam ' * 20)"))
    report = hw.grade(noisy, lesson, cell_timeout=5)
    assert report["score"] == 2  # the noisy cell is not an exercise
    # and the sleeping process is gone: the conftest fixture fails the test otherwise


def test_the_command_line_releases_and_grades_with_json_and_text_reports(tmp_path):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny.ipynb")
    run = [sys.executable, "-m", "course_lib.exercises"]
    subprocess.run([*run, "release", str(lessons), str(tmp_path / "student")], check=True,
                   capture_output=True)
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    shutil.copy(tmp_path / "student" / "tiny.ipynb", submissions / "tiny.ipynb")
    out = subprocess.run([*run, "grade", str(submissions), "--source", str(lessons), "--out",
                          str(tmp_path / "reports"), "--cell-timeout", "60"], check=True,
                         capture_output=True, text=True)
    assert "0 / 2 points" in out.stdout
    report = json.loads((tmp_path / "reports" / "tiny.json").read_text())
    assert report["score"] == 0 and len(report["exercises"]) == 2
    assert "NotImplementedError" in (tmp_path / "reports" / "tiny.txt").read_text()


def test_grading_a_real_lesson_gives_full_marks():
    # its untouched student version scores 0: tests/test_readme.py runs that, as the README does
    lesson = ROOT / "notebooks" / "01_backprop.ipynb"
    full = hw.grade(lesson, lesson, cell_timeout=300)
    assert full["score"] == full["points"] >= 2, hw.summary(full)


# -- hostile and malformed submissions ---------------------------------------------------------


def test_a_copied_check_cell_never_scores_twice(tmp_path, lesson):
    nb = nbformat.read(lesson, as_version=4)
    nb.cells[2].source = "def aggregate(models, sizes):\n    return models[0]"  # wrong
    # the student copies the second (solved) exercise's check cell, metadata and all, twice,
    # and gives the first exercise's grade_id to a cell that only prints
    nb.cells += [nbformat.from_dict(nb.cells[5]), nbformat.from_dict(nb.cells[5])]
    fake = new_code_cell("print('correct')")
    fake.metadata["nbgrader"] = dict(nb.cells[3].metadata["nbgrader"])
    nb.cells.insert(1, fake)
    nbformat.write(nb, tmp_path / "tiny.ipynb")
    report = hw.grade(tmp_path / "tiny.ipynb", lesson, cell_timeout=60)
    assert [e["score"] for e in report["exercises"]] == [0, 1] and report["score"] == 1
    assert len(report["exercises"]) == 2


def test_a_flood_of_bytes_in_few_outputs_is_capped(tmp_path, lesson):
    flood = _submission(lesson, tmp_path / "tiny.ipynb",
                        c1="import torch\nfor _ in range(500):\n    print('x' * 10**5)")
    nb = nbformat.read(flood, as_version=4)
    client = hw._client(nb, tmp_path, cell_timeout=60)
    with client.setup_kernel():
        client.execute_cell(nb.cells[1], 1)
    kept = sum(len(out.get("text", "")) for out in nb.cells[1].outputs)
    assert 0 < kept <= hw.MAX_OUTPUT_BYTES  # 50 MB printed in 500 outputs, at most 1 MB kept


def test_bad_files_are_reported_and_the_rest_of_the_folder_is_graded(tmp_path):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny.ipynb")
    nb = nbformat.read(lessons / "tiny.ipynb", as_version=4)
    nbformat.write(nb, lessons / "other.ipynb")
    folder = tmp_path / "submissions"
    folder.mkdir()
    shutil.copy(lessons / "tiny.ipynb", folder / "tiny.ipynb")  # the one good submission
    (folder / "other.ipynb").write_text("{ not json")
    (folder / "Tiny.ipynb").write_text("{}")                           # no such lesson
    (folder / "notes.txt").write_text("hello")
    (folder / "folder.ipynb").mkdir()
    (folder / "../secret.ipynb").write_text("{}")
    (folder / "link.ipynb").symlink_to(tmp_path / "secret.ipynb")
    (folder / "weird name; rm -rf.ipynb").write_text(json.dumps({"cells": 5}))
    out = tmp_path / "reports"
    reports = {r["submission"].split("/")[-1]: r
               for r in subs.grade_all(folder, lessons, out, cell_timeout=60)}
    assert reports["tiny.ipynb"]["score"] == 2
    errors = {name: r["error"] for name, r in reports.items() if "error" in r}
    assert set(errors) == {"other.ipynb", "Tiny.ipynb", "notes.txt", "folder.ipynb",
                           "link.ipynb", "weird name; rm -rf.ipynb"}
    assert "not a valid notebook" in errors["other.ipynb"]
    assert "no lesson of that name" in errors["Tiny.ipynb"]
    assert "symbolic link" in errors["link.ipynb"] and "not a file" in errors["folder.ipynb"]
    written = sorted(p.name for p in out.iterdir())
    assert "tiny.json" in written and "weird_name__rm_-rf.error.txt" in written
    assert all(p.parent == out for p in out.iterdir())


def test_a_missing_or_empty_folder_is_an_error_not_a_zero(tmp_path):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny.ipynb")
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        subs.grade_all(tmp_path / "submisions", lessons, tmp_path / "reports")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty: nothing to grade"):
        subs.grade_all(tmp_path / "empty", lessons, tmp_path / "reports")


def test_a_submission_that_rewrites_another_report_stops_grading_loudly(tmp_path):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny.ipynb")
    out = tmp_path / "reports"
    out.mkdir()
    (out / "alice.txt").write_text("alice: 2 / 2 points\n")
    folder = tmp_path / "submissions"
    folder.mkdir()
    nb = nbformat.read(lessons / "tiny.ipynb", as_version=4)
    nb.cells[1].source = (f"import pathlib, torch\n"
                          f"pathlib.Path({str(out / 'alice.txt')!r}).write_text('alice: 0')")
    nbformat.write(nb, folder / "tiny.ipynb")
    with pytest.raises(subs.Tampered, match="alice.txt"):
        subs.grade_all(folder, lessons, out, cell_timeout=60)
    assert (out / "tiny.TAMPERED.txt").read_text().strip() == str(out / "alice.txt")
    assert not (out / "tiny.json").exists()  # no score for a submission that tampered


def test_fingerprints_see_added_changed_and_removed_files_and_keep_the_executed_notebook(
        tmp_path):
    (tmp_path / "a").write_text("1")
    (tmp_path / "b").write_text("2")
    before = subs.fingerprint(tmp_path)
    (tmp_path / "a").write_text("changed")
    (tmp_path / "b").unlink()
    (tmp_path / "c").write_text("new")
    assert subs.changes(before, subs.fingerprint(tmp_path)) == [
        str(tmp_path / n) for n in ("a", "b", "c")]
    assert subs.changes(before, before) == []
    lesson = tmp_path / "lesson" / "tiny.ipynb"
    lesson.parent.mkdir()
    _tiny_lesson(lesson)
    hw.grade(lesson, lesson, cell_timeout=60, keep=tmp_path / "kept.ipynb")
    kept = nbformat.read(tmp_path / "kept.ipynb", as_version=4)
    assert any("correct" in "".join(o.get("text", "") for o in c.get("outputs", []))
               for c in kept.cells if c.cell_type == "code")


def test_a_cell_that_ignores_interrupts_costs_only_itself(tmp_path, lesson):
    stubborn = _submission(lesson, tmp_path / "tiny.ipynb", c1=(
        "import signal, torch\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "while True:\n    pass"))
    start = time.monotonic()
    report = hw.grade(stubborn, lesson, cell_timeout=3)
    assert time.monotonic() - start < 45
    assert report["score"] == 2, hw.summary(report)  # the kernel was restarted, not waited on


def test_a_kernel_that_dies_is_restarted_for_the_next_cells(tmp_path, lesson):
    dying = _submission(lesson, tmp_path / "tiny.ipynb", c1="import os\nos.kill(os.getpid(), 9)")
    report = hw.grade(dying, lesson, cell_timeout=30)
    assert report["score"] == 2, hw.summary(report)
    killer = _submission(lesson, tmp_path / "tiny2.ipynb",
                         c2="import os\nos.kill(os.getpid(), 9)")   # dies in an exercise
    report = hw.grade(killer, lesson, cell_timeout=30)
    assert [e["score"] for e in report["exercises"]] == [0, 1], hw.summary(report)


def test_hidden_tests_run_last_and_their_text_never_reaches_the_report(tmp_path, lesson):
    # passes the visible check; in the hidden test, raises with the hidden test's own source
    leaky = _submission(lesson, tmp_path / "tiny.ipynb", c4=(
        "import inspect\n"
        "def staleness_aware(alpha, staleness):\n"
        "    caller = ''.join(inspect.stack()[1].code_context or [])\n"
        "    if 'assert' in caller:\n"
        "        raise ValueError('leaked: ' + caller)\n"
        "    return alpha / max(staleness, 1)"))
    report = hw.grade(leaky, lesson, cell_timeout=60, keep=tmp_path / "kept.ipynb")
    first, second = report["exercises"]
    assert first["score"] == 1 and second["score"] == 0
    assert second["feedback"] == hw.HIDDEN_FAILED
    assert "assert" not in json.dumps(report) and "0.25" not in json.dumps(report)
    kept = nbformat.read(tmp_path / "kept.ipynb", as_version=4)
    assert "BEGIN HIDDEN TESTS" in kept.cells[-1].source  # last, after every student cell
    honest = hw.grade(lesson, lesson, cell_timeout=60)
    assert honest["score"] == 2  # the lesson's own answers pass the hidden tests
