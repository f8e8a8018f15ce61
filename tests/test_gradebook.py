"""Homework for a whole class (course_lib.exercises: roster, gradebook, submissions.grade_one):
the layouts a class comes in, a gradebook checked cell by cell, one bad submission never stopping
the class, parallel and sharded runs giving the same gradebook, and regrading only what changed.
"""

import csv
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from test_grading import WRONG, _tiny_lesson, short_limit

from course_lib.exercises import editions, gradebook, roster, submissions
from course_lib.exercises.submissions import grade_all, renamed_lesson

HEAD = ["student", "name", "tiny:exercise-1", "tiny:exercise-2", "tiny2:exercise-1",
        "tiny2:exercise-2", "tiny", "tiny2", "total", "points", "notes"]


def _class(tmp_path) -> tuple[Path, Path]:
    """Two lessons and four students: alice right everywhere, bob the untouched student
    edition, carol a notebook that leaves a file beside the lessons (tampering: graded without
    the sandbox here) and a right one, dave a notebook that is not JSON, a notes file and a
    right one."""
    lessons, roster_ = tmp_path / "lessons", tmp_path / "submissions"
    lessons.mkdir()
    for name in ("tiny", "tiny2"):
        _tiny_lesson(lessons / f"{name}.ipynb")
    editions.release(lessons, tmp_path / "student")
    for student in ("alice", "bob", "carol", "dave"):
        (roster_ / student).mkdir(parents=True)
        for name in ("tiny", "tiny2"):
            shutil.copy(lessons / f"{name}.ipynb", roster_ / student / f"{name}.ipynb")
    for name in ("tiny", "tiny2"):
        shutil.copy(tmp_path / "student" / "notebooks" / f"{name}.ipynb",
                    roster_ / "bob" / f"{name}.ipynb")
    nb = nbformat.read(lessons / "tiny.ipynb", as_version=4)
    nb.cells[4].source = WRONG + f"open({str(lessons / 'stray.txt')!r}, 'w').write('x')\n"
    nbformat.write(nb, roster_ / "carol" / "tiny.ipynb")
    (roster_ / "dave" / "tiny.ipynb").write_text("{ not json")
    (roster_ / "dave" / "notes.txt").write_text("hello")
    return lessons, roster_


def _one_lesson(tmp_path, name: str = "tiny") -> tuple[Path, Path]:
    """The tiny lesson ``name`` and a class whose alice handed it in right."""
    lessons, submissions = tmp_path / "lessons", tmp_path / "class"
    lessons.mkdir()
    _tiny_lesson(lessons / f"{name}.ipynb")
    (submissions / "alice").mkdir(parents=True)
    shutil.copy(lessons / f"{name}.ipynb", submissions / "alice" / f"{name}.ipynb")  # right
    return lessons, submissions


def _lost_both(out: Path, student: str, feedback: str, lesson_folder: Path) -> None:
    """A report of ``student``'s tiny.ipynb that lost both exercises' points, for ``feedback``."""
    (out / student).mkdir(parents=True)
    report = dict(submission=str(lesson_folder / student / "tiny.ipynb"), status="graded",
                  score=0, points=2, exercises=[
                      dict(grade_id=g, score=0, points=1, feedback=feedback)
                      for g in ("exercise-1", "exercise-2")])
    (out / student / "tiny.json").write_text(json.dumps(report))


def _rows(out: Path) -> list[dict]:
    with open(out / "gradebook.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == HEAD
        return list(reader)


def _scores(rows):
    return [[r[h] for h in HEAD[:-1]] for r in rows]


EXPECTED = [["alice", "alice", "1", "1", "1", "1", "2", "2", "4", "4"],
            ["bob", "bob", "0", "0", "0", "0", "0", "0", "0", "4"],
            ["carol", "carol", "", "", "1", "1", "0", "2", "2", "4"],
            ["dave", "dave", "", "", "1", "1", "0", "2", "2", "4"]]


def test_a_class_gives_its_gradebook_cell_by_cell_and_one_bad_submission_stops_nothing(
        tmp_path):
    lessons, submissions = _class(tmp_path)
    out = tmp_path / "reports"
    reports = gradebook.grade_class(submissions, lessons, out, cell_timeout=60, sandboxed=False)
    assert len(reports) == 9  # 4 students x 2 lessons and dave's notes file
    rows = _rows(out)
    assert _scores(rows) == EXPECTED
    notes = {r["student"]: r["notes"] for r in rows}
    assert notes["alice"] == notes["bob"] == ""
    assert notes["carol"].startswith("tiny: tampered: changed 1 file(s)")
    assert (out / "carol" / "tiny.TAMPERED.txt").read_text().strip() == \
        str(lessons / "stray.txt")  # the evidence, kept
    assert "tiny: not graded: not a valid notebook" in notes["dave"]
    assert "notes.txt: not graded: not a notebook" in notes["dave"]
    moodle = list(csv.DictReader(open(out / "gradebook-moodle.csv", newline="")))
    assert [list(r.values()) for r in moodle] == [[r[1], r[6], r[7], r[8]] for r in EXPECTED]
    per_exercise = {(r["lesson"], r["exercise"]): r for r in
                    csv.DictReader(open(out / "exercises.csv", newline=""))}
    assert per_exercise["tiny", "exercise-2"]["graded"] == "2"  # alice's and bob's
    assert per_exercise["tiny", "exercise-2"]["mean"] == "0.50"
    assert per_exercise["tiny", "exercise-2"]["most common reasons"].startswith("not solved yet")
    assert per_exercise["tiny2", "exercise-1"]["mean"] == "0.75"  # bob's 0 of four

    # a second run grades nothing; a changed notebook is graded again
    (lessons / "stray.txt").unlink()
    again = gradebook.grade_class(submissions, lessons, out, cell_timeout=60, sandboxed=False)
    assert [(r["student"], r["status"]) for r in again] == [("dave", "not graded")] * 2
    shutil.copy(lessons / "tiny.ipynb", submissions / "bob" / "tiny.ipynb")  # bob resubmits
    redone = gradebook.grade_class(submissions, lessons, out, cell_timeout=60, sandboxed=False)
    assert [(r["student"], Path(r["submission"]).name) for r in redone
            if r["status"] == "graded"] == [("bob", "tiny.ipynb")]
    assert _rows(out)[1]["tiny"] == "2"


def test_two_jobs_and_two_shards_give_the_serial_gradebook(tmp_path):
    lessons, submissions = _class(tmp_path)
    (submissions / "carol" / "tiny.ipynb").unlink()  # no tampering: the runs must agree exactly
    serial, sharded = tmp_path / "serial", tmp_path / "sharded"
    gradebook.grade_class(submissions, lessons, serial, cell_timeout=60, sandboxed=False)
    for i in (0, 1):  # each half of the class by two jobs at once, then the halves merged
        gradebook.grade_class(submissions, lessons, sharded, shard=(i, 2), jobs=2,
                              cell_timeout=60, sandboxed=False)
    gradebook.write_gradebook(sharded, lessons)  # the merge: whatever reports are there
    assert _rows(serial) == _rows(sharded)
    assert _rows(serial)[2]["notes"] == "tiny: missing"  # carol's removed notebook
    with pytest.raises(ValueError, match="shard must be i/n"):
        gradebook.grade_class(submissions, lessons, serial, shard=(2, 2))


def test_names_that_look_alike_an_empty_folder_and_a_stray_notebook_each_get_their_row(
        tmp_path):
    lessons, submissions = tmp_path / "lessons", tmp_path / "class"
    lessons.mkdir()
    for name in ("tiny", "tiny2"):
        _tiny_lesson(lessons / f"{name}.ipynb")
    editions.release(lessons, tmp_path / "student")
    for name in ("Anna Lee", "Anna_Lee", "李明"):
        (submissions / name).mkdir(parents=True)
    shutil.copy(lessons / "tiny.ipynb", submissions / "Anna Lee" / "tiny.ipynb")  # right
    shutil.copy(tmp_path / "student" / "notebooks" / "tiny.ipynb",
                submissions / "Anna_Lee" / "tiny.ipynb")  # untouched; 李明 submitted nothing
    shutil.copy(lessons / "tiny2.ipynb", submissions / "tiny2.ipynb")  # uploaded to the wrong place
    (submissions / "Anna Lee" / ".ipynb_checkpoints").mkdir()  # what Jupyter leaves: not hers
    shutil.copy(lessons / "tiny.ipynb", submissions / "Anna Lee" / ".ipynb_checkpoints" / "t.ipynb")
    assert roster.layout(submissions) == "students"  # not one student: a class and a stray file
    found = roster.entries(submissions, tmp_path / "u")
    assert len({e.student for e in found}) == 4 and [e.name for e in found] == [
        "Anna Lee", "Anna_Lee", "tiny2 (stray)", "李明"]
    assert found[-1].path is None and found[1].student == "Anna_Lee" == found[1].name
    out = tmp_path / "reports"
    gradebook.grade_class(submissions, lessons, out, cell_timeout=60, sandboxed=False)
    with open(out / "gradebook.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = {r["name"]: r for r in reader}
    assert "tiny2" not in reader.fieldnames  # no one's graded lesson: not this homework
    assert {n: (r["total"], r["points"]) for n, r in rows.items()} == {
        "Anna Lee": ("2", "2"), "Anna_Lee": ("0", "2"), "tiny2 (stray)": ("0", "2"),
        "李明": ("0", "2")}
    assert rows["李明"]["notes"] == "tiny: missing" and rows["李明"]["student"] == "李明"
    assert "tiny2.ipynb: not graded: beside the student folders" in rows["tiny2 (stray)"]["notes"]
    moodle = list(csv.DictReader(open(out / "gradebook-moodle.csv", newline="")))
    assert sorted(r["username"] for r in moodle) == sorted(  # the names, as given; a stray
        n for n in rows if n != "tiny2 (stray)")  # file is no one's: not in the LMS's file
    # a name file that does not give its folder (a submission wrote it) is not believed
    (out / "Anna_Lee" / gradebook.NAME).write_text("Anna Lee")
    gradebook.write_gradebook(out, lessons)
    with open(out / "gradebook.csv", newline="") as f:
        assert sorted(r["name"] for r in csv.DictReader(f)) == sorted(rows)


def test_which_layout_a_folder_is_in_and_what_a_student_folder_is_called(tmp_path):
    one = tmp_path / "alice"
    (one / ".ipynb_checkpoints").mkdir(parents=True)  # Jupyter's, beside her own notebook
    (one / ".ipynb_checkpoints" / "tiny-checkpoint.ipynb").write_text("{}")
    (one / "tiny.ipynb").write_text("{}")
    assert roster.layout(one) == "one student" == roster.layout(one / "tiny.ipynb")
    assert roster.entries(one, tmp_path / "u") == [roster.Entry("alice", one / "tiny.ipynb")]
    assert roster.entries(one / "tiny.ipynb", tmp_path / "u") == [
        roster.Entry("alice", one / "tiny.ipynb")]  # one notebook, graded as alice's
    tree = tmp_path / "submitted"  # nbgrader's, with a stray notebook and an empty folder
    (tree / "bob" / "week1").mkdir(parents=True)
    (tree / "bob" / "week1" / "tiny.ipynb").write_text("{}")
    (tree / "carol").mkdir()
    (tree / "tiny.ipynb").write_text("{}")
    assert roster.layout(tree) == "nbgrader"
    assert [(e.name, e.stray, e.path is None) for e in roster.entries(tree, tmp_path / "u")] == [
        ("bob", False, False), ("carol", False, True), ("tiny (stray)", True, False)]
    empty = tmp_path / "before anyone uploaded"  # empty student folders and one stray notebook
    (empty / "dave").mkdir(parents=True)
    (empty / "tiny.ipynb").write_text("{}")
    assert roster.layout(empty) == "students"
    names = ["..", ".x", "a b", "gradebook.csv", "unpacked", "x-0123abcd", "李明", "Anna_Lee"]
    folders = [roster.student_folder(n) for n in names]
    assert len(set(folders)) == len(names) and folders[-2:] == ["李明", "Anna_Lee"]
    assert all("/" not in f and not f.startswith(".") and f not in roster.RESERVED
               and f != "x-0123abcd" for f in folders)


def test_the_layouts_a_class_comes_in(tmp_path, capsys):
    one = tmp_path / "alice"
    one.mkdir()
    (one / "tiny.ipynb").write_text("{}")
    assert roster.layout(one) == "one student"
    assert roster.entries(one, tmp_path / "u") == [roster.Entry("alice", one / "tiny.ipynb")]
    students = tmp_path / "submissions"
    (students / "bob").mkdir(parents=True)
    shutil.copytree(one, students / "alice")
    (students / "bob" / "tiny.ipynb").write_text("{}")
    assert roster.layout(students) == "students"
    assert [e.student for e in roster.entries(students, tmp_path / "u")] == ["alice", "bob"]
    tree = tmp_path / "submitted"  # nbgrader's: <student>/<assignment>/<notebook>
    (tree / "carol" / "week1").mkdir(parents=True)
    (tree / "carol" / "week1" / "tiny.ipynb").write_text("{}")
    assert roster.layout(tree) == "nbgrader"
    assert roster.entries(tree, tmp_path / "u") == [
        roster.Entry("carol", tree / "carol" / "week1" / "tiny.ipynb")]
    archive = tmp_path / "submissions.zip"  # Canvas: name[_LATE]_user_submission_file
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("doejane_1234_5678_tiny.ipynb", "{}")
        z.writestr("doejane_LATE_1234_5690_tiny-1.ipynb", '{"late": 1}')  # her resubmission
        z.writestr("roedan_77_80_tiny.ipynb", "{}")
        z.writestr("../../roedan_77_81_tiny2.ipynb", "{}")  # a path: only its base name counts
        z.writestr("roedan_77_82_../../evil.ipynb", "{}")  # no Canvas name once the path goes
        z.writestr("readme.txt", "not a submission")
        z.writestr("garcíajosé_5_6_tiny.ipynb", "{}")  # a name with an accent: still hers
    assert roster.layout(archive) == "canvas zip"
    found = roster.entries(archive, tmp_path / "unpacked")
    assert [(e.student, e.path.name) for e in found] == [
        ("doejane_1234", "tiny.ipynb"), ("garcíajosé_5", "tiny.ipynb"), ("roedan_77", "tiny.ipynb"),
        ("roedan_77", "tiny2.ipynb")]
    said = capsys.readouterr().err  # what was passed over is printed, not dropped in silence
    assert "passed over 2 member(s)" in said and "readme.txt" in said and "evil" in said
    assert found[0].path.read_text() == '{"late": 1}'  # the latest submission of the file
    assert all(tmp_path / "unpacked" in e.path.parents for e in found)
    os.utime(found[0].path, ns=(10**9, 10**9))  # a second shard unpacking the same zip
    assert roster.entries(archive, tmp_path / "unpacked") == found
    assert found[0].path.stat().st_mtime_ns == 10**9  # found it unpacked: nothing rewritten
    assert not list((tmp_path / "unpacked").rglob("*.part"))  # written whole, then renamed
    with pytest.raises(FileNotFoundError):
        roster.entries(tmp_path / "nobody", tmp_path / "u")


def test_the_command_line_grades_a_class_and_merges_shards(tmp_path):
    lessons, submissions = _class(tmp_path)
    shutil.rmtree(submissions / "carol")
    shutil.rmtree(submissions / "dave")
    run = [sys.executable, "-m", "course_lib.exercises"]
    out = tmp_path / "reports"
    for shard in ("0/2", "1/2"):
        done = subprocess.run([*run, "grade", str(submissions), "--source", str(lessons),
                               "--out", str(out), "--shard", shard, "--no-sandbox",
                               "--cell-timeout", "60"], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    merged = subprocess.run([*run, "gradebook", str(out), "--source", str(lessons)],
                            capture_output=True, text=True, timeout=120)
    assert merged.returncode == 0 and "gradebook.csv" in merged.stdout
    assert _scores(_rows(out)) == EXPECTED[:2]
    bad = subprocess.run([*run, "grade", str(submissions), "--source", str(lessons), "--out",
                          str(out), "--shard", "two"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--shard must be i/n" in bad.stderr


def test_a_submission_past_the_notebooks_limit_is_noted_and_the_class_goes_on(tmp_path):
    lessons, submissions = _class(tmp_path)
    for student in ("bob", "carol", "dave"):
        shutil.rmtree(submissions / student)
    (submissions / "erin").mkdir()
    nb = nbformat.read(lessons / "tiny.ipynb", as_version=4)
    limit = short_limit()  # what honest work needs here, at least 6 s
    nb.cells[2].source = f"import time\ntime.sleep({3 * limit:.0f})\nk = 7"  # passes the limit
    nbformat.write(nb, submissions / "erin" / "tiny.ipynb")
    out = tmp_path / "reports"
    gradebook.grade_class(submissions, lessons, out, cell_timeout=4 * limit, timeout=limit,
                          sandboxed=False)
    rows = {r["student"]: r for r in _rows(out)}
    assert rows["erin"]["notes"].startswith("tiny: timed out")
    assert rows["erin"]["tiny:exercise-2"] == "0" and rows["alice"]["total"] == "4"


def test_a_grader_that_fails_is_recorded_as_failed_not_as_tampering(tmp_path, monkeypatch):
    # the grader's own error file lands in the reports' folder, which the tampering check
    # watches; a kernel that dies at start (as one did under load in CI) is the grader's failure
    from course_lib.exercises import submissions

    lessons, submissions_ = _class(tmp_path)

    def dies(*args, **kwargs):
        raise RuntimeError("Kernel died before replying to kernel_info")

    monkeypatch.setattr(submissions, "grade", dies)
    report = submissions.grade_one(submissions_ / "alice" / "tiny.ipynb", lessons,
                                   tmp_path / "out", sandboxed=False)
    assert report["status"] == "grader failed", report
    assert "Kernel died" in report["error"]
    assert not list((tmp_path / "out").glob("*.TAMPERED.txt"))
    assert "Kernel died" in (tmp_path / "out" / "tiny.error.txt").read_text()


def test_cells_a_spreadsheet_would_run_as_formulas_are_written_as_text(tmp_path):
    assert gradebook.inert('=HYPERLINK("https://example.invalid/","why")&') == \
        '\'=HYPERLINK("https://example.invalid/","why")&'
    assert [gradebook.inert(v) for v in ("+1", "-2+3", "@SUM(A1)", "\tx")] == \
        ["'+1", "'-2+3", "'@SUM(A1)", "'\tx"]
    assert gradebook.inert("wrong\nsecond line") == "wrong second line"
    assert gradebook.inert("Anna Lee") == "Anna Lee" and gradebook.inert(2.5) == 2.5


def test_a_file_named_like_a_lesson_keeps_its_own_report_and_a_rerun_gives_the_same_gradebook(
        tmp_path):
    # "tiny x.ipynb" and "tiny_x.ipynb" wrote their reports to one path: the refused file's
    # report replaced the lesson's, and a second run showed the lesson as missing
    lessons, submissions = _one_lesson(tmp_path, "tiny_x")
    shutil.copy(lessons / "tiny_x.ipynb", submissions / "alice" / "tiny x.ipynb")  # no lesson
    shutil.copy(lessons / "tiny_x.ipynb", submissions / "alice" / "tiny~x.ipynb")  # no lesson
    assert len({roster.report_stem(p.name) for p in (submissions / "alice").iterdir()}) == 3
    out = tmp_path / "reports"
    books = []
    for _ in range(2):
        gradebook.grade_class(submissions, lessons, out, cell_timeout=60, sandboxed=False)
        with open(out / "gradebook.csv", newline="") as f:
            books.append([(r["tiny_x"], r["total"], r["notes"]) for r in csv.DictReader(f)])
    assert books[0] == books[1] and books[0][0][:2] == ("2", "2"), books
    assert "tiny x.ipynb: not graded" in books[0][0][2] and "missing" not in books[0][0][2]


def test_a_timed_out_note_comes_from_the_grader_not_from_a_students_message(tmp_path):
    lessons, out = tmp_path / "lessons", tmp_path / "reports"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny.ipynb")
    for student, feedback in (("ann", "your code raised ValueError: past my 5 s limit"),
                              ("ben", "not run: the notebook passed its 300 s limit")):
        _lost_both(out, student, feedback, tmp_path)
    gradebook.write_gradebook(out, lessons)
    notes = {r["student"]: r["notes"] for r in csv.DictReader(open(out / "gradebook.csv"))}
    assert notes == {"ann": "",
                     "ben": "tiny: timed out (the exercises after the limit did not run)"}


def test_the_gradebook_follows_the_roster_and_another_file_never_replaces_a_notebooks_grade(
        tmp_path):
    # alice's PDF export beside her notebook gave the notebook's report name: the PDF's "not
    # graded" replaced her full marks in the gradebook and the LMS file, on every rerun
    lessons, submissions = _one_lesson(tmp_path, "tiny")
    for other in ("tiny.pdf", "tiny.txt", "tiny.py"):
        (submissions / "alice" / other).write_text("an export")
    (submissions / "bob").mkdir()
    shutil.copy(lessons / "tiny.ipynb", submissions / "bob" / "Copy of tiny.ipynb")
    shutil.copy(lessons / "tiny.ipynb", submissions / "tiny.ipynb")  # a stray notebook
    assert len({roster.report_stem(p.name) for p in (submissions / "alice").iterdir()}) == 4
    out = tmp_path / "reports"

    def book():
        gradebook.grade_class(submissions, lessons, out, cell_timeout=60, sandboxed=False)
        moodle = {r["username"]: r["tiny"] for r in csv.DictReader(open(
            out / "gradebook-moodle.csv", newline=""))}
        return {r["name"]: (r["tiny"], r["notes"]) for r in csv.DictReader(open(
            out / "gradebook.csv", newline=""))}, moodle

    for _ in range(2):  # the rerun grades no notebook again and gives the same gradebook
        rows, moodle = book()
        assert rows["alice"][0] == "2" and moodle == {"alice": "2", "bob": ""}, (rows, moodle)
        assert "tiny.pdf: not graded: not a notebook" in rows["alice"][1]
        assert "rename it to tiny.ipynb" in rows["bob"][1] and "tiny (stray)" in rows
    (submissions / "alice" / "tiny.pdf").unlink()  # removed: its note goes
    (submissions / "bob" / "Copy of tiny.ipynb").rename(submissions / "bob" / "tiny.ipynb")
    (submissions / "tiny.ipynb").unlink()  # the stray moved away: its row goes
    rows, moodle = book()
    assert rows == {"alice": ("2", "tiny.py: not graded: not a notebook (.ipynb); "
                              "tiny.txt: not graded: not a notebook (.ipynb)"),
                    "bob": ("2", "")}, rows
    (submissions / "bob" / "tiny.ipynb").unlink()  # bob's notebook is gone: so is its grade
    rows, _ = book()
    assert rows["bob"] == ("", "tiny: missing")
    with pytest.raises(ValueError, match="inside the submissions"):  # its reports: graded next
        gradebook.grade_class(submissions, lessons, submissions / "reports")


def test_what_a_class_folder_holds_is_read_per_student(tmp_path):
    tree = tmp_path / "submitted"  # nbgrader's tree, one student also has a notebook at the top
    for student in ("alice", "bob"):
        (tree / student / "hw1").mkdir(parents=True)
        (tree / student / "hw1" / "tiny.ipynb").write_text("{}")
        (tree / student / "hw1" / "timestamp.txt").write_text("2026-12-01 10:00:00")  # nbgrader's
    (tree / "bob" / "tiny2.ipynb").write_text("{}")
    found = [(e.student, e.path.relative_to(tree).as_posix())
             for e in roster.entries(tree, tmp_path / "u")]
    assert found == [("alice", "alice/hw1/tiny.ipynb"), ("bob", "bob/hw1"),
                     ("bob", "bob/tiny2.ipynb")]
    archive = tmp_path / "canvas.zip"  # Canvas writes "late" in small letters too
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("doejane_late_12_34_tiny.ipynb", "{}")
    assert [e.student for e in roster.entries(archive, tmp_path / "unpacked")] == ["doejane_12"]


def test_a_renamed_lesson_gets_a_hint_and_one_students_folder_skips_hidden_files(tmp_path,
                                                                                 monkeypatch):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny_x.ipynb")
    for name in ("Copy of tiny_x.ipynb", "tiny_x (1).ipynb", "tiny_x__1_.ipynb", "Tiny_X.ipynb",
                 "tiny_x-2.ipynb"):
        assert renamed_lesson(name, lessons) == "tiny_x.ipynb", name
    assert renamed_lesson("tiny_x.pdf", lessons) is None
    assert renamed_lesson("tiny_y.ipynb", lessons) is None
    one = tmp_path / "alice"
    one.mkdir()
    (one / ".DS_Store").write_text("x")
    (one / "doe_12_34_tiny_x.ipynb").write_text("{}")  # unpacked from a Canvas zip by hand
    out = tmp_path / "reports"
    reports = grade_all(one, lessons, out)
    assert [r["error"][:40] for r in reports] == ["a file of an unpacked Canvas download: g"]
    monkeypatch.chdir(tmp_path)  # the same folder, named another way: its own reports again
    assert len(grade_all(Path("alice"), lessons, out)) == 1
    with pytest.raises(ValueError, match="inside the submissions"):
        grade_all(one, lessons, one / "reports")


def test_an_empty_shard_and_an_empty_folder_of_reports(tmp_path, capsys):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny.ipynb")
    (tmp_path / "class" / "alice").mkdir(parents=True)
    out = tmp_path / "reports"  # not made yet: the first shard to run may have no one
    assert gradebook.grade_class(tmp_path / "class", lessons, out, shard=(1, 2)) == []
    assert "no gradebook written" in capsys.readouterr().out and out.is_dir()
    with pytest.raises(ValueError, match="holds no student's reports"):
        gradebook.write_gradebook(out, lessons)


def test_the_class_summary_counts_a_reason_once_whatever_numbers_it_names(tmp_path):
    lessons, out = tmp_path / "lessons", tmp_path / "reports"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny.ipynb")
    for student, count in (("ann", "3,134,336"), ("ben", "1,024,380.5")):
        _lost_both(out, student, f"your backward count {count} is not the formula's {count}9 "
                   + "x" * 90, tmp_path)
        (out / student / gradebook.NAME).write_text(student)
    gradebook.write_gradebook(out, lessons)
    rows = list(csv.DictReader(open(out / "exercises.csv", newline="")))
    reason = rows[0]["most common reasons"]
    assert reason.startswith("your backward count N is not the formula's N ") and \
        reason.endswith(" ... (2)") and len(reason) <= 90, reason


def test_what_a_student_names_or_links_never_costs_another_file_its_report(tmp_path):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny.ipynb")
    # a link to alice's file is not alice's file: her report is not replaced through it
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "notes.txt").write_text("hers")
    (tmp_path / "bob").mkdir()
    (tmp_path / "bob" / "notes.txt").symlink_to(tmp_path / "alice" / "notes.txt")
    grade_all(tmp_path / "alice", lessons, tmp_path / "one")
    with pytest.raises(ValueError, match="report of another submission"):
        grade_all(tmp_path / "bob", lessons, tmp_path / "one")
    # a decoy "tiny.TAMPERED.ipynb" removed later takes tiny's evidence with it
    out, carol = tmp_path / "reports", tmp_path / "class" / "carol"
    carol.mkdir(parents=True)
    shutil.copy(lessons / "tiny.ipynb", carol / "tiny.ipynb")
    (out / "carol").mkdir(parents=True)
    for stem, status in (("tiny", "tampered"), ("tiny.TAMPERED", "graded")):
        (out / "carol" / f"{stem}.json").write_text(json.dumps(
            dict(submission=str(carol / f"{stem}.ipynb"), status=status)))
        (out / "carol" / f"{stem}.txt").write_text(status)
    (out / "carol" / "config.json").write_text("{}")  # not a report: not the grader's to delete
    gradebook.forget_removed(out, {"carol": [roster.Entry("carol", carol / "tiny.ipynb")]},
                             ["carol"], tmp_path / "class")
    assert sorted(p.name for p in (out / "carol").iterdir()) == [
        "config.json", "tiny.TAMPERED.txt", "tiny.json", "tiny.txt"]
    # a notebook replaced by a link to the same bytes is graded again (a link: not graded)
    (out / "carol" / "tiny.TAMPERED.txt").unlink()
    (out / "carol" / "tiny.json").write_text(json.dumps(dict(
        submission=str(carol / "tiny.ipynb"), status="graded", score=2, points=2, exercises=[],
        sha256={"submission": submissions.sha256_of(carol / "tiny.ipynb"),
                "lesson": submissions.sha256_of(lessons / "tiny.ipynb")})))
    shutil.copy(carol / "tiny.ipynb", tmp_path / "copy.ipynb")
    (carol / "tiny.ipynb").unlink()
    (carol / "tiny.ipynb").symlink_to(tmp_path / "copy.ipynb")
    gradebook.grade_class(tmp_path / "class", lessons, out)
    assert json.loads((out / "carol" / "tiny.json").read_text())["status"] == "not graded"


def test_a_reports_folder_never_holds_the_class_or_the_lessons(tmp_path):
    lessons, roster_ = tmp_path / "lessons", tmp_path / "class"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny.ipynb")
    (roster_ / "alice").mkdir(parents=True)
    for out in (tmp_path, roster_, roster_ / "alice" / "reports"):
        with pytest.raises(ValueError, match="--out"):
            gradebook.grade_class(roster_, lessons, out)
    shutil.copy(lessons / "tiny.ipynb", roster_ / "alice" / "tiny.ipynb")
    with pytest.raises(ValueError, match="inside the submissions"):  # one notebook's folder too
        grade_all(roster_ / "alice" / "tiny.ipynb", lessons, roster_ / "alice")


def test_odd_names_a_second_zip_and_shards_that_stay_put(tmp_path):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny.ipynb")
    class_ = tmp_path / "class"  # a name that is not UTF-8 (a zip from another system)
    (class_ / "bob").mkdir(parents=True)
    open(os.fsencode(class_ / "bob") + b"/\xdcbung.ipynb", "w").write("{}")
    gradebook.grade_class(class_, lessons, tmp_path / "reports")
    notes = [r["notes"] for r in csv.DictReader(open(tmp_path / "reports" / "gradebook.csv"))]
    assert len(notes) == 1 and "bung.ipynb: not graded: no lesson of that name" in notes[0]
    tree = tmp_path / "twice"  # the same lesson in two of a student's folders: neither is taken
    for version in ("v1", "v2"):
        (tree / "dave" / version).mkdir(parents=True)
        (tree / "dave" / version / "tiny.ipynb").write_text("{}")
    assert [e.path.name for e in roster.entries(tree, tmp_path / "u")] == ["v1", "v2"]
    unpacked = tmp_path / "unpacked"  # a newer zip: what it no longer holds is not graded
    for members in (["doejane_12_34_tiny.ipynb", "smithjon_13_35_tiny.ipynb"],
                    ["doejane_12_40_tiny.pdf", "roedan_77_80_tiny.ipynb"]):
        with zipfile.ZipFile(tmp_path / "canvas.zip", "w") as z:
            for member in members:
                z.writestr(member, "{}")
        found = roster.entries(tmp_path / "canvas.zip", unpacked)
    assert [e.student for e in found] == ["roedan_77"]
    assert sorted(p.name for p in unpacked.iterdir()) == ["roedan_77"]
    shards = tmp_path / "shards"  # a student more, sorted first, moves no one to another shard
    for name in [f"s{i}" for i in range(8)]:
        (shards / name).mkdir(parents=True)

    def who(out):  # which students each of two shards took (empty folders: nothing to grade)
        taken = {}
        for i in (0, 1):
            gradebook.grade_class(shards, lessons, out, shard=(i, 2))
            for p in out.glob(f"*/{gradebook.NAME}"):
                taken.setdefault(p.parent.name, i)
        return taken
    before = who(tmp_path / "r1")
    assert len(before) == 8 and set(before.values()) == {0, 1}
    (shards / "a0").mkdir()
    after = who(tmp_path / "r2")
    assert {n: after[n] for n in before} == before and "a0" in after


def test_two_assignments_and_a_zip_share_a_reports_folder(tmp_path):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny.ipynb")
    out = tmp_path / "reports"
    for week, note in (("hw1", "notes.txt"), ("hw2", "other.txt")):
        (tmp_path / week / "alice").mkdir(parents=True)
        (tmp_path / week / "alice" / note).write_text("x")
        gradebook.grade_class(tmp_path / week, lessons, out)
    assert sorted(p.name.split("-")[0] for p in (out / "alice").glob("*.json")) == [
        "notes.txt", "other.txt"]  # week 2 did not delete week 1's reports
    for week in ("hw1", "hw2"):  # Canvas names every download submissions.zip
        with zipfile.ZipFile(tmp_path / week / "submissions.zip", "w") as z:
            z.writestr(f"doejane_12_3{week[-1]}_{week}.ipynb", "{}")
        gradebook.grade_class(tmp_path / week / "submissions.zip", lessons,
                              tmp_path / week / "reports")  # a zip's folder may hold them
        gradebook.grade_class(tmp_path / week / "submissions.zip", lessons, out)
    assert sorted(p.name for p in (out / "doejane_12").glob("*.json")) == [
        "hw1.json", "hw2.json"]
    tree = tmp_path / "submitted"  # nbgrader's assignments often share a helper file
    for week, lesson in (("hw1", "tiny"), ("hw2", "tiny2")):
        (tree / "bob" / week).mkdir(parents=True)
        (tree / "bob" / week / f"{lesson}.ipynb").write_text("{}")
        (tree / "bob" / week / "utils.py").write_text("")
    assert [e.path.name for e in roster.entries(tree, tmp_path / "u")] == [
        "tiny.ipynb", "utils.py", "tiny2.ipynb", "utils.py"]
    with pytest.raises(ValueError, match="inside the lessons"):
        gradebook.grade_class(tmp_path / "hw1", lessons, lessons)
