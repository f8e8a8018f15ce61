"""Homework: the editions, and a grader that assumes the submission is hostile
(course_lib.exercises: editions, grading, sandbox, submissions).

Each hostile submission below attacks in its second exercise's solution cell, after an honest
first exercise: graded as if the attack were not there, the honest exercise keeps its point and
the attacked one scores 0, no process is left and no file outside the reports changes.
"""

import functools
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import nbformat
import psutil
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

import course_lib
from course_lib.exercises import editions, judging, roster, sandbox
from course_lib.exercises import grading as hw
from course_lib.exercises import submissions as subs

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
LIBRARY = Path(course_lib.__file__).resolve().parent
if sandbox.unavailable():  # CI installs bubblewrap; elsewhere say what is missing, loudly
    pytest.fail(f"the grader's tests need the sandbox: {sandbox.unavailable()}",
                pytrace=False)


def _solution_lines(source):
    """The distinctive code lines inside the solution regions of a cell or file."""
    lines = []
    for match in editions.SOLUTION.finditer(source):
        lines += [line.strip() for line in match.group(0).splitlines()[1:-1]
                  if len(line.strip()) > 16 and not line.strip().startswith("#")]
    return lines


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_every_lesson_has_two_graded_exercises_judged_outside_the_kernel(path):
    nb = nbformat.read(path, as_version=4)
    graded = hw.exercises(nb)
    assert len(graded) >= 2
    solutions = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert len(solutions) == len(graded)
    for e in graded:
        cell = nb.cells[e["index"]]
        assert e["points"] > 0 and cell.metadata["nbgrader"]["locked"]
        assert judging.judge_names(path, nb, cell.source)  # each check has a judge outside
        assert "HIDDEN TESTS" not in cell.source  # hidden cases are the judges' own
    assert hw.mark(nbformat.read(path, as_version=4)).cells == nb.cells  # marking is stable


def test_the_student_edition_holds_no_solution_text_anywhere(tmp_path):
    written = hw.release(ROOT / "notebooks", tmp_path)
    assert [p.name for p in written] == [p.name for p in LESSONS]
    edition = {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()
               and p.suffix in (".py", ".ipynb", ".md", ".txt", ".json")}
    region = re.compile(r"^\s*### BEGIN SOLUTION", re.MULTILINE)
    assert not any(region.search(text) for text in edition.values())
    assert not (tmp_path / "notebooks" / "instructor_guide.md").exists()
    blocks = [_solution_lines(cell.source) for path in LESSONS
              for cell in nbformat.read(path, as_version=4).cells]
    blocks += [_solution_lines(path.read_text()) for path in LIBRARY.rglob("*.py")]
    assert sum(map(len, blocks)) >= 20
    # a line the lessons show openly in their own code (``rank = dist.get_rank()``) is lesson
    # material, not an answer; shown only in an output (a printed source) it is a leak
    shown = {line.strip() for path in LESSONS for cell in nbformat.read(path, as_version=4).cells
             if cell.cell_type == "code"
             for line in editions.SOLUTION.sub("", cell.source).splitlines()}
    for block in blocks:
        lines = [line for line in block if line not in shown]
        for path, text in edition.items():
            found = [line for line in lines if line in text]
            # one generic line (a buffer, a loop over parameters) is no answer; two lines of the
            # same answer, or all of a short one, are
            if found and (len(found) >= 2 or len(found) == len(lines)):
                raise AssertionError(f"{path.relative_to(tmp_path)} holds {found}")
    for lesson_path, student_path in zip(LESSONS, written, strict=True):
        lesson = nbformat.read(lesson_path, as_version=4)
        student = nbformat.read(student_path, as_version=4)
        assert len(student.cells) == len(lesson.cells)  # in step with the lesson, cell by cell
        for theirs, ours in zip(lesson.cells, student.cells, strict=True):
            meta = theirs.metadata.get("nbgrader", {})
            if "BEGIN SOLUTION" in theirs.source:  # a stub that raises when called, or answers
                assert editions.STUB.strip() in ours.source or editions.PASS_STUB.strip() in \
                    ours.source or re.search(r"^\w+ = \.\.\.$", ours.source, re.MULTILINE)
            else:
                assert ours.source == theirs.source
            if ours.cell_type == "code" and (meta.get("solution") or meta.get("grade")):
                assert ours.outputs == [] and ours.execution_count is None  # the exercise's own
            elif ours.cell_type == "code":  # every other cell keeps the instructor's outputs
                assert ours.outputs == theirs.outputs


def test_the_student_edition_pip_installs_its_library_without_the_answers(tmp_path):
    import zipfile

    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools in "
                                             "this environment (pip install setuptools)")

    hw.release(ROOT / "notebooks", tmp_path / "edition")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(tmp_path / "wheel"),
                           str(tmp_path / "edition")], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("course_lib-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        texts = {n: archive.read(n).decode() for n in names if n.endswith(".py")}
    assert "course_lib/exercises/lesson07b.py" in names and "course_lib/EDITION" in names
    assert "course_lib/exercises/practice.json" in names
    region = re.compile(r"^\s*### BEGIN SOLUTION", re.MULTILINE)  # a region, not its regex
    assert not [n for n, text in texts.items() if region.search(text)]
    assert editions.LIBRARY_STUB.strip() in texts["course_lib/exercises/lesson07b.py"]


def test_the_student_command_writes_the_edition_once_and_opens_it_with_its_library(tmp_path):
    from course_lib.exercises.__main__ import open_student_edition

    here = os.getcwd()
    os.chdir(tmp_path)  # a relative folder: every path printed or set is made absolute
    try:
        command = open_student_edition(Path("student"), ROOT / "notebooks", start=False)
    finally:
        os.chdir(here)
    assert command[-3:] == ["jupyter", "lab", str(tmp_path / "student" / "notebooks")] or \
        "--allow-root" in command
    mine = tmp_path / "student" / "notebooks" / LESSONS[0].name
    mine.write_text(mine.read_text().replace("write your solution here", "my work"))
    open_student_edition(tmp_path / "student", ROOT / "notebooks", start=False)
    assert "my work" in mine.read_text()  # a second run never overwrites a student's work


def test_as_root_the_student_command_adds_allow_root_and_says_so(tmp_path, monkeypatch,
                                                                   capsys):
    from course_lib.exercises import __main__ as cli

    for uid, added in ((0, True), (1000, False)):
        monkeypatch.setattr(os, "geteuid", lambda uid=uid: uid)
        command, env = cli.lab_command(Path("student"), ["--port", "8890"])
        assert ("--allow-root" in command) is added
        assert command[command.index("lab") + 1] == str(Path("student").resolve() / "notebooks")
        assert command[-3 if added else -2:][:2] == ["--port", "8890"]  # passed on unchanged
        assert env["PYTHONPATH"] == str(Path("student").resolve())
        assert ("running as root" in capsys.readouterr().out) is added
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    command, _ = cli.lab_command(Path("student"), ["--allow-root"])
    assert command.count("--allow-root") == 1
    assert cli.split_student_args(["student", "mine", "--no-browser", "--port", "9", "--no-start"]
                                  ) == (["student", "mine", "--no-start"],
                                        ["--no-browser", "--port", "9"])


def test_the_student_command_exits_non_zero_when_jupyterlab_does_not_start(tmp_path):
    done = subprocess.run([sys.executable, "-m", "course_lib.exercises", "student",
                           str(tmp_path / "student"), "--no-browser", "--port=not-a-port"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "JupyterLab did not start" in done.stderr, done.stderr[-2000:]
    assert "not-a-port" in done.stderr  # JupyterLab's own message is shown too


def test_a_kernel_in_the_student_edition_imports_the_editions_library(tmp_path):
    """A cell run in a real kernel, started as the student command starts JupyterLab's."""
    from jupyter_client.manager import start_new_kernel

    from course_lib.exercises.__main__ import lab_command

    editions.release(ROOT / "notebooks", tmp_path / "student")
    _, env = lab_command(tmp_path / "student")
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path / "student" / "notebooks"),
                              env=env)
    try:
        shown = []
        kc.execute_interactive("import course_lib; print(course_lib.__file__)", timeout=120,
                               output_hook=lambda m: shown.append(m["content"].get("text", "")))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert "".join(shown).strip() == str(tmp_path / "student" / "course_lib" / "__init__.py")


def test_the_instructors_library_refuses_to_run_a_student_editions_notebook(tmp_path):
    editions.release(ROOT / "notebooks", tmp_path / "student")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # JupyterLab started by hand
    done = subprocess.run([sys.executable, "-c", "import course_lib"], env=env,
                          cwd=tmp_path / "student" / "notebooks", capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "WrongEdition" in done.stderr, done.stderr[-2000:]
    assert "python -m course_lib.exercises student" in done.stderr


def test_the_student_library_imports_and_keeps_only_what_is_outside_solution_regions(tmp_path):
    library = editions.student_library(LIBRARY, tmp_path / "course_lib")
    stripped = editions.strip_source("def f():\n    ### BEGIN SOLUTION\n    return 42\n"
                                     "    ### END SOLUTION\n")
    assert "42" not in stripped and "NotImplementedError" in stripped
    modules = sorted(".".join(p.relative_to(tmp_path).with_suffix("").parts)
                     for p in library.rglob("*.py") if p.name not in ("__main__.py",))
    code = ("import importlib, sys\nfor m in sys.argv[1:]:\n"
            "    importlib.import_module(m.removesuffix('.__init__'))\n"
            "import course_lib; print(course_lib.__file__)")
    done = subprocess.run([sys.executable, "-c", code, *modules], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(library / "__init__.py")  # the edition's, not ours


ROUND = (  # the right answer to the tiny lesson's second exercise
    "def fp16_round(x, generator):\n"
    "    lo = x.half()\n"
    "    lo = torch.where(lo.double() > x, torch.nextafter(lo, torch.tensor(-float('inf'), "
    "dtype=lo.dtype)), lo)\n"
    "    hi = torch.nextafter(lo, torch.tensor(float('inf'), dtype=lo.dtype))\n"
    "    hi = torch.where(lo.double() == x, lo, hi)\n"
    "    gap = (hi.double() - lo.double()).clamp(min=1e-300)\n"
    "    up = torch.rand(x.shape, generator=generator, dtype=x.dtype) * gap < x - lo.double()\n"
    "    return torch.where(up, hi, lo).double()\n")
WRONG = "def fp16_round(x, generator):\n    return x.half().double()\n"  # round to nearest
# right on the visible inputs (106 values), wrong on the cases drawn for the grading run
SNEAKY = ROUND.replace("def fp16_round(x, generator):\n", "def fp16_round(x, generator):\n"
                       "    if x.numel() != 106:\n        return x.half().double()\n")


def _tiny_lesson(path):
    """A two-exercise lesson that runs in seconds, with course_lib's checks: a number from the
    run (cells 2-3) and a function (cells 4-5)."""
    solution = ROUND.replace("def fp16_round(x, generator):\n",
                             "def fp16_round(x, generator):\n    ### BEGIN SOLUTION\n")
    cells = [
        new_markdown_cell("# Tiny lesson"),
        new_code_cell("import torch\n\ngrads = torch.tensor([1e-3, 2.0, -300.0])"),
        new_code_cell("### BEGIN SOLUTION\nk = 7\n### END SOLUTION"),
        new_code_cell("from course_lib.exercises.lesson07 import check_fp16_stochastic_round, "
                      "check_safe_scale\n\ncheck_safe_scale(k, grads)"),
        new_code_cell(solution + "    ### END SOLUTION"),
        new_code_cell("check_fp16_stochastic_round(fp16_round)"),
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


@functools.cache
def short_limit() -> int:
    """A time limit that honest work passes on this machine: at least 6 s, and 3 x the seconds the
    tiny lesson takes to grade (kernel start, torch and course_lib imported, every cell), measured
    once per test process. A fixed limit failed where one core ran three times slower than usual.
    Tests give it to the cells that never return, so they cost what this machine needs."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tiny.ipynb"
        _tiny_lesson(path)
        report = hw.grade(path, path, cell_timeout=120)
    assert report["score"] == 2, hw.summary(report)
    return max(6, math.ceil(3 * report["seconds"]))


def _submission(lesson, path, **replace):
    """The lesson with some cells replaced (c<index> -> new source)."""
    nb = nbformat.read(lesson, as_version=4)
    for index, source in replace.items():
        nb.cells[int(index[1:])].source = source
    nbformat.write(nb, path)
    return path


def _marked(marker):
    """Processes anywhere on this machine whose command line holds ``marker``."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid():
            found.append(p.pid)
    return found


def _attack(tmp_path, lesson, attack, **grade_args):
    """Grade a submission whose first exercise is right and whose second exercise's solution
    cell is a wrong answer plus ``attack``; check that nothing outside the reports changed."""
    watched = (lesson.parent, LIBRARY, ROOT / "notebooks")
    before = subs.fingerprint(*watched)
    path = _submission(lesson, tmp_path / "tiny.ipynb", c4=WRONG + attack)
    report = hw.grade(path, lesson, keep=tmp_path / "kept.ipynb",
                      **{"cell_timeout": 10, **grade_args})
    assert subs.changes(before, subs.fingerprint(*watched)) == []
    assert _sandboxes_left() == [], "a sandbox or kernel of this grading is still running"
    return report


def _sandboxes_left():
    """This test process's descendants that are a sandbox or a kernel (a grading started them;
    what ran inside a sandbox ends with its process namespace)."""
    left = []
    for p in psutil.Process().children(recursive=True):
        try:
            line = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "bwrap" in line or "ipykernel_launcher" in line:
            left.append(line[:200])
    return left


def _scores(report):
    return [e["score"] for e in report["exercises"]]


def test_grading_the_lesson_itself_gives_full_marks(lesson):
    report = hw.grade(lesson, lesson, cell_timeout=60)
    assert report["score"] == report["points"] == 2, hw.summary(report)
    assert [e["feedback"] for e in report["exercises"]] == ["correct", "correct"]
    assert report["ungraded_errors"] == []


def test_an_untouched_student_notebook_runs_through_and_scores_zero_as_not_solved(tmp_path,
                                                                                 lesson):
    hw.release(lesson.parent, tmp_path / "student")
    stubbed = nbformat.read(tmp_path / "student" / "notebooks" / "tiny.ipynb", as_version=4)
    assert "k = ...\n" in stubbed.cells[2].source  # an answer at the top level: a placeholder
    assert hw.STUB.strip() in stubbed.cells[4].source  # in a function: raises when called
    report = hw.grade(tmp_path / "student" / "notebooks" / "tiny.ipynb", lesson, cell_timeout=60,
                      keep=tmp_path / "kept.ipynb")
    assert report["score"] == 0 and report["points"] == 2
    assert [e["feedback"].split(":")[0] for e in report["exercises"]] == ["not solved yet"] * 2
    assert report["ungraded_errors"] == []  # no cell failed: Run All would reach the end
    kept = nbformat.read(tmp_path / "kept.ipynb", as_version=4)
    shown = [o["data"]["text/plain"] for i in (3, 5) for o in kept.cells[i].outputs]
    assert len(shown) == 2 and all(s.startswith("not solved yet: ") for s in shown), shown


def test_one_wrong_answer_loses_exactly_that_exercise_and_says_why(tmp_path, lesson):
    wrong = _submission(lesson, tmp_path / "tiny.ipynb", c2="k = 8")
    report = hw.grade(wrong, lesson, cell_timeout=60)
    assert _scores(report) == [0, 1]
    assert "becomes inf" in report["exercises"][0]["feedback"]  # the judge's explanation


def test_another_lessons_notebook_under_this_name_is_graded_with_a_warning(tmp_path, lesson):
    other = _submission(lesson, tmp_path / "tiny.ipynb", c0="# Another lesson", c2="j = 7",
                        c3="check_other(j)", c5="check_fp16(fp16_round)")
    report = hw.grade(other, lesson, cell_timeout=60)
    assert _scores(report) == [0, 1]  # its solutions ran in this lesson's cells
    warning = report["warning"]
    assert warning.endswith("another lesson's notebook under this name? Its title: "
                            "'Another lesson'")
    assert warning in report["exercises"][0]["feedback"]
    assert warning not in report["exercises"][1]["feedback"]  # full marks need no warning
    assert f"warning: {warning}" in hw.summary(report)
    assert "warning" not in hw.grade(lesson, lesson, cell_timeout=60)


def test_another_lesson_is_told_apart_from_the_lesson_and_its_student_edition():
    lessons = [nbformat.read(p, as_version=4) for p in LESSONS]
    for i, nb in enumerate(lessons):
        assert hw.another_lesson(nb, nb) is None
        assert hw.another_lesson(editions.student_version(nb), nb) is None
        other = editions.student_version(lessons[(i + 1) % len(lessons)])
        assert "another lesson's notebook" in hw.another_lesson(other, nb)


def test_without_the_sandbox_untrusted_work_is_refused_unless_the_instructor_says_so(
        tmp_path, lesson, monkeypatch):
    monkeypatch.setattr(sandbox, "unavailable", lambda: "bubblewrap (bwrap) is not installed")
    with pytest.raises(sandbox.SandboxUnavailable, match="not installed.*only in the sandbox"):
        hw.grade(lesson, lesson)
    report = hw.grade(lesson, lesson, sandboxed=False, cell_timeout=60)  # trusted: allowed
    assert report["score"] == 2, hw.summary(report)


# -- hostile submissions, one per threat class -----------------------------------------------------


ATTACKS = {
    # replace the checks, the judges' registry and the writer of the data, in the kernel
    "patched modules": (
        "import course_lib.exercises.common as C, course_lib.exercises.lesson07 as L, json\n"
        "L.check_fp16_stochastic_round = lambda f: 'correct'\n"
        "C.checked = lambda name, probe, judge: (lambda *a: 'correct')\n"
        "C.JUDGES.clear()\n"
        "json.dumps = lambda *a, **k: '{\"visible\": 1}'\n"),
    "patched builtins": (
        "import builtins\n"
        "builtins.isinstance = lambda *a: True\n"
        "builtins.print = lambda *a, **k: None\n"
        "builtins.open = lambda *a, **k: (_ for _ in ()).throw(SystemExit)\n"),
    # the shell runs nothing of the next cell, yet answers that it ran
    "patched IPython shell": (
        "shell = get_ipython()\n"
        "real = shell.run_cell\n"
        "shell.run_cell = lambda cell, *a, **k: real('None', *a, **k)\n"),
    # the check cell is interrupted by an event before it starts
    "check cell left unexecuted": (
        "def skip(info):\n    raise KeyboardInterrupt\n"
        "get_ipython().events.register('pre_run_cell', skip)\n"),
}
FORGED = (  # data the judge would pass if it judged the inputs it names: x on the fp16 grid
    "import torch\n"
    "from IPython.display import display\n"
    "import course_lib.exercises.common as C\n"
    "x = torch.linspace(1.0, 2.0, 5).double().tolist()\n"
    "forged = {'visible': {'x': {'__tensor__': x, 'dtype': 'float64'},\n"
    "                      'r': {'__tensor__': [x] * 200, 'dtype': 'float64'}}}\n"
    "NAME = 'lesson07.fp16_stochastic_round'\n")
FORGERIES = {  # issue 31: each scored full marks on an unsolved exercise before
    # a thread that sends forged data while the check runs, after the real data
    "a thread sends forged data": FORGED + (
        "import threading, time\n"
        "def forge():\n"
        "    for _ in range(300):\n"
        "        display({C.DATA_MIME: {'name': NAME, 'data': forged}}, raw=True)\n"
        "        time.sleep(0.01)\n"
        "threading.Thread(target=forge, daemon=True).start()\n"),
    # the probe's data replaced in the kernel before it is sent: only forged data goes out
    "the data is rebound": FORGED + (
        "real = C._record\n"
        "C._record = lambda folder, name, data: real(folder, name, forged)\n"),
    # the hidden cases steered: the seeds set from the solution cell, and read from a patch
    "the hidden seed is set": (
        "import os\nimport course_lib.exercises.common as C\n"
        "os.environ[C.HIDDEN_SEED] = os.environ[C.GRADING_SEED] = '1'\n"
        "C.hidden_seed = lambda: None\n"),
    # links and a FIFO planted where the grader keeps its files, then a restart forced
    "links in the shared folder": (
        "import os, sys, signal\n"
        "shared = os.path.dirname(sys.argv[sys.argv.index('-f') + 1])\n"
        "for name in os.listdir(shared):\n"
        "    if name.endswith('.json'):\n"
        "        os.remove(os.path.join(shared, name))\n"
        "        os.symlink(LESSON, os.path.join(shared, name))\n"
        "for name in ('out', 'hosts'):\n"
        "    os.symlink(os.path.dirname(LESSON), os.path.join(shared, name))\n"
        "os.mkfifo(os.path.join(shared, '000-lesson07.fp16_stochastic_round.json'))\n"
        "os.symlink('/dev/zero', os.path.join(shared, '001-lesson07.flushed.json'))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"),
}


@pytest.mark.parametrize("attack", list(FORGERIES), ids=list(FORGERIES))
def test_forged_data_a_steered_seed_or_planted_links_score_nothing(tmp_path, lesson, attack):
    source = FORGERIES[attack].replace("LESSON", repr(str(lesson)))
    if attack == "the hidden seed is set":  # right on the visible inputs only
        source = SNEAKY + source
    report = _attack(tmp_path, lesson, source, cell_timeout=20)
    assert _scores(report) == [1, 0], hw.summary(report)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 2 << 20  # KiB: under 2 GiB
    assert (tmp_path / "kept.ipynb").stat().st_size < 3 * hw.MAX_OUTPUT_BYTES
    assert hw.grade(lesson, lesson, cell_timeout=60)["score"] == 2  # the lesson: untouched


@pytest.mark.parametrize("attack", list(ATTACKS), ids=list(ATTACKS))
def test_patching_what_checks_rely_on_or_skipping_them_scores_nothing(tmp_path, lesson, attack):
    # patched builtins stop the kernel from answering: the cell waits out the limit
    report = _attack(tmp_path, lesson, ATTACKS[attack], cell_timeout=short_limit())
    assert _scores(report) == [1, 0], hw.summary(report)


def test_duplicated_grading_metadata_never_scores_twice_or_replaces_a_check(tmp_path, lesson):
    nb = nbformat.read(lesson, as_version=4)
    nb.cells[4].source = WRONG
    fake_check = new_code_cell("print('correct')")  # claims to be the second check
    fake_check.metadata["nbgrader"] = dict(nb.cells[5].metadata["nbgrader"])
    second_solution = new_code_cell(ROUND)  # a right answer in a copy of the solution cell
    second_solution.metadata["nbgrader"] = dict(nb.cells[4].metadata["nbgrader"])
    nb.cells[5].metadata = {}  # the real check cell loses its metadata ...
    nb.cells[5].cell_type = "markdown"  # ... and is no code cell any more
    nb.cells += [nbformat.from_dict(nb.cells[3]), nbformat.from_dict(nb.cells[3]), fake_check,
                 second_solution]
    nbformat.write(nb, tmp_path / "tiny.ipynb")
    report = hw.grade(tmp_path / "tiny.ipynb", lesson, cell_timeout=60)
    assert _scores(report) == [1, 0] and len(report["exercises"]) == 2, hw.summary(report)


def test_the_instructors_files_are_out_of_sight_and_nothing_outside_can_be_written(tmp_path,
                                                                                     lesson):
    targets = [str(lesson), str(LIBRARY / "exercises" / "lesson07.py"),
               str(ROOT / "notebooks" / LESSONS[0].name), str(tmp_path / "reports" / "a.txt"),
               "/sandbox/course_lib/__init__.py", "/sandbox/data/README.md", "/etc/passwd",
               sys.prefix + "/pyvenv.cfg", "/etc/shadow"]
    attack = (
        "import os, socket, course_lib\n"
        f"for path in {targets!r}:\n"
        "    try:\n        open(path).read(1); seen = 'READ'\n"
        "    except OSError as e:\n        seen = type(e).__name__\n"
        "    try:\n        open(path, 'a').write('x'); wrote = 'WROTE'\n"
        "    except OSError as e:\n        wrote = type(e).__name__\n"
        "    print(path, seen, wrote)\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=3); net = 'ONLINE'\n"
        "except OSError as e:\n    net = type(e).__name__\n"
        "print('network', net, 'library', course_lib.__file__)\n"
        "import re\n"
        "print('solution regions', sum(bool(re.search(r'^\\s*### BEGIN SOLUTION',\n"
        "      open(os.path.join(d, f)).read(), re.M))\n"
        "      for d, _, fs in os.walk('/sandbox/course_lib') for f in fs if f.endswith('.py')))\n")
    (tmp_path / "reports").mkdir()
    report = _attack(tmp_path, lesson, attack)
    assert _scores(report) == [1, 0], hw.summary(report)
    kept = nbformat.read(tmp_path / "kept.ipynb", as_version=4)
    seen = "".join(o.get("text", "") for o in kept.cells[4].outputs)
    lines = dict(line.split(" ", 1) for line in seen.strip().splitlines())
    for path in targets[:4]:  # the instructor's and the grader's files: not there at all
        assert lines[path] == "FileNotFoundError FileNotFoundError", seen
    assert lines["/sandbox/course_lib/__init__.py"].startswith("READ OSError")  # read-only
    assert lines["/sandbox/data/README.md"].startswith("READ OSError")
    assert lines["/etc/passwd"].startswith("READ OSError")  # the system: read-only
    assert lines["/etc/shadow"].startswith("FileNotFoundError")  # only what a process needs
    assert lines[sys.prefix + "/pyvenv.cfg"].startswith("READ OSError")
    assert "ONLINE" not in lines["network"]
    assert "library /sandbox/course_lib/__init__.py" in lines["network"]
    assert lines["solution"] == "regions 0"
    assert not (tmp_path / "reports" / "a.txt").exists()


def test_a_process_that_outlives_its_grading_is_gone_when_grading_ends(tmp_path, lesson):
    marker = f"course-lib-survivor-{uuid.uuid4().hex}"
    attack = (
        "import os, subprocess, sys\n"
        "code = 'import os, signal, time\\n'\\\n"
        "       'for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\\n'\\\n"
        "       '    signal.signal(s, signal.SIG_IGN)\\n'\\\n"
        "       'time.sleep(600)'\n"
        f"subprocess.Popen([sys.executable, '-c', code, {marker!r}], start_new_session=True,\n"
        "                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,\n"
        "                 stderr=subprocess.DEVNULL)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv(sys.executable, [sys.executable, '-c', code, {marker!r} + '-2'])\n")
    report = _attack(tmp_path, lesson, attack)
    assert _scores(report) == [1, 0], hw.summary(report)
    deadline = time.monotonic() + 5
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _marked(marker) == []


def test_limits_on_memory_and_processes_cost_only_the_cell_that_hits_them(tmp_path, lesson):
    attack = (
        "import subprocess, torch\n"
        "children = []\n"
        "try:\n"
        "    for _ in range(200):\n"
        "        children.append(subprocess.Popen(['sleep', '60']))\n"
        "except OSError as e:\n"
        "    print('processes stopped at', len(children), type(e).__name__)\n"
        "hog = torch.ones(3 * 2**30 // 8, dtype=torch.float64)\n"
        "print('allocated', hog.sum().item())\n")
    report = _attack(tmp_path, lesson, attack,
                     limits=sandbox.Limits(memory_bytes=2 << 30, processes=64))
    assert _scores(report) == [1, 0], hw.summary(report)
    kept = nbformat.read(tmp_path / "kept.ipynb", as_version=4)
    text = json.dumps(kept.cells[4].outputs)
    assert "processes stopped at" in text and "allocated" not in text


def test_endless_printing_and_leftover_workers_cost_only_that_exercise(tmp_path, lesson):
    report = _attack(tmp_path, lesson, (
        "import subprocess, sys, time\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "for i in range(10**5):\n    print('spam', i)\n"
        "while True:\n    time.sleep(0.1)"), cell_timeout=short_limit())
    assert _scores(report) == [1, 0], hw.summary(report)
    kept = nbformat.read(tmp_path / "kept.ipynb", as_version=4)
    assert len(kept.cells[4].outputs) <= hw.MAX_OUTPUTS  # the flood by count, capped


GREEDY = {  # issue 31's review: each hung the grader, grew its memory or crashed grade()
    # shell messages without end: the client's own timeout never fires
    "a flood of shell messages": (
        "import asyncio, time\n"
        "_k = get_ipython().kernel\n"
        "_ident, _s = _k._parent_ident['shell'], _k.shell_stream\n"
        "async def _flood():\n"
        "    while True:\n"
        "        for _ in range(100):\n"
        "            _s.socket.send_multipart(_k.session.serialize(\n"
        "                _k.session.msg('status', {}), ident=_ident))\n"
        "        await asyncio.sleep(0)\n"
        "_s.io_loop.add_callback(_flood)\n"
        "while True:\n    time.sleep(1)\n"),
    # widgets' binary buffers, 24 x 50 MB
    "widget buffers": (
        "from comm import create_comm\n"
        "big = memoryview(b'x' * (50 << 20))\n"
        "for i in range(24):\n"
        "    create_comm(target_name='nothing', data={'state': {}, 'buffer_paths': [['b']]},\n"
        "                buffers=[big])\n"),
    # raw frames just under the cap on a message, queued faster than the grader reads them
    # (zero-copy: the sandbox holds one buffer; zmq queued up to 1,000 of them in the grader)
    "raw frames on iopub": (
        "import time\n"
        "_t = get_ipython().kernel.iopub_thread\n"
        "_buf = b'x' * (60 << 20)\n"
        "_t.schedule(lambda: [_t.socket.send(_buf, copy=False) for _ in range(60)])\n"
        "time.sleep(8)\n"),
    # a prompt number of 300 MB
    "a huge execute_input": (
        "_k = get_ipython().kernel\n"
        "_k.session.send(_k.iopub_socket, 'execute_input',\n"
        "                {'code': '', 'execution_count': 'A' * (300 << 20)},\n"
        "                parent=_k.get_parent())\n"),
    # one display message of 400 MB
    "one huge message": (
        "from IPython.display import display\n"
        "display({'text/plain': 'x' * (400 << 20)}, raw=True)\n"),
    # replies to the grader's own statements whose parent header is no dict
    "a garbled reply": (
        "_k = get_ipython().kernel\n"
        "_ident, _real = _k._parent_ident['shell'], _k.do_execute\n"
        "def _do_execute(code, silent, *a, **kw):\n"
        "    if silent:\n"
        "        m = _k.session.msg('execute_reply', {'status': 'ok'})\n"
        "        m['parent_header'] = 'not a dict'\n"
        "        _k.shell_stream.io_loop.add_callback(\n"
        "            lambda: _k.session.send(_k.shell_stream, m, ident=_ident))\n"
        "    return _real(code, silent, *a, **kw)\n"
        "_k.do_execute = _do_execute\n"),
    # empty files without end: a tmpfs's size does not bound their number
    "inodes used up": (
        "import os\n"
        "for i in range(400_000):\n"
        "    open(f'/tmp/e{i}', 'w').close()\n"),
    # a thread that fills the sockets' folder, the one host folder the kernel can write
    "the sockets folder filled": (
        "import os, sys, threading\n"
        "shared = os.path.dirname(sys.argv[sys.argv.index('-f') + 1])\n"
        "def fill():\n"
        "    for i in range(3000):\n"
        "        open(os.path.join(shared, f'junk{i}'), 'wb').write(bytes(2**20))\n"
        "threading.Thread(target=fill, daemon=True).start()\n"
        "import time\ntime.sleep(4)\n"),
}


@pytest.mark.parametrize("attack", list(GREEDY), ids=list(GREEDY))
def test_no_submission_hangs_the_grader_grows_its_memory_or_crashes_it(tmp_path, lesson, attack,
                                                                      monkeypatch):
    removed, remove = [], sandbox.remove_groups  # counted, and removed: none left behind
    monkeypatch.setattr(sandbox, "remove_groups", lambda pid: (removed.append(pid), remove(pid)))
    limit = short_limit()  # what honest cells need on this machine, at least 6 s
    started = time.monotonic()
    # 100,000 files take longer than 5 s on a busy machine: that cell gets 30 to reach the guard
    report = _attack(tmp_path, lesson, GREEDY[attack],
                     cell_timeout=max(30, limit) if attack == "inodes used up" else limit)
    assert time.monotonic() - started < max(120, 20 * limit)  # a limit per cell: never a hang
    assert _scores(report) == [1, 0], hw.summary(report)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 2 << 20  # KiB: under 2 GiB
    assert (tmp_path / "kept.ipynb").stat().st_size < 3 * hw.MAX_OUTPUT_BYTES
    said, launchers = KILLED.get(attack, ("", 1))
    assert said in hw.summary(report), hw.summary(report)  # the cell that was stopped, and why
    # the control groups of every sandbox it started are removed, a restart's too, each once
    assert len(removed) == len(set(removed)) >= launchers


KILLED = {"the sockets folder filled": ("sockets' folder", 2),  # what it says, sandboxes started
          "inodes used up": ("files in /tmp", 2)}


def test_every_writable_place_is_a_tmpfs_of_limited_size(tmp_path, lesson):
    attack = (
        "import os\n"
        "for place in ('/sandbox/notebooks', '/tmp', '/dev/shm'):\n"
        "    written = 0\n"
        "    try:\n"
        "        for i in range(4096):\n"
        "            with open(os.path.join(place, f'f{i}'), 'wb') as f:\n"
        "                f.write(bytes(2**20))\n"
        "            written += 2**20\n"
        "    except OSError as e:\n"
        "        print(place, 'stopped', type(e).__name__)\n"
        "    print(place, 'wrote', written // 2**20)\n")
    report = _attack(tmp_path, lesson, attack, limits=sandbox.Limits(disk_bytes=64 << 20))
    assert _scores(report) == [1, 0], hw.summary(report)
    kept = nbformat.read(tmp_path / "kept.ipynb", as_version=4)
    text = "".join(o.get("text", "") for o in kept.cells[4].outputs)
    for place in ("/sandbox/notebooks", "/tmp", "/dev/shm"):
        assert f"{place} stopped OSError" in text, text
        assert int(re.search(f"{place} wrote (\\d+)", text).group(1)) <= 64, text


def test_processes_that_left_the_kernels_tree_are_gone_before_the_next_cell(tmp_path, lesson):
    marker = f"course-lib-escapee-{uuid.uuid4().hex}"
    escape = (  # 40 double-forked sleepers: with 64 processes allowed, the next cell needs room
        "import os, sys, time\n"
        "for _ in range(40):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        if os.fork() == 0:\n"
        "            os.execv(sys.executable, [sys.executable, '-c',\n"
        f"                     'import time; time.sleep(600)', {marker!r}])\n"
        "        os._exit(0)\n"
        "    os.wait()\n")
    count = ("import os\n"  # what the next exercise's cell still sees of them
             "def mine(p):\n"
             "    try:\n"
             f"        return {marker!r} in open(f'/proc/{{p}}/cmdline').read()\n"
             "    except OSError:\n"
             "        return False\n"
             "print('escapees', sum(mine(p) for p in os.listdir('/proc') if p.isdigit()))\n")
    path = _submission(lesson, tmp_path / "tiny.ipynb", c2="k = 7\n" + escape,
                       c4=ROUND + count)
    report = hw.grade(path, lesson, cell_timeout=30, keep=tmp_path / "kept.ipynb",
                      limits=sandbox.Limits(processes=64, memory_bytes=4 << 30))
    assert _scores(report) == [1, 1], hw.summary(report)  # the next exercise: honest, it scores
    kept = nbformat.read(tmp_path / "kept.ipynb", as_version=4)
    assert "escapees 0" in json.dumps(kept.cells[4].outputs), kept.cells[4].outputs
    assert _marked(marker) == []


def test_display_updates_count_against_the_output_cap(tmp_path, lesson):
    attack = (
        "from IPython.display import display\n"
        "handle = display('a small output', display_id=True)\n"
        "for _ in range(5):\n"
        "    handle.update({'text/plain': 'x' * 10_000_000}, raw=True)\n")
    report = _attack(tmp_path, lesson, attack)
    assert _scores(report) == [1, 0], hw.summary(report)
    assert (tmp_path / "kept.ipynb").stat().st_size < 3 * hw.MAX_OUTPUT_BYTES


def test_a_cell_that_closes_its_output_streams_costs_the_next_exercise_nothing(tmp_path, lesson):
    closes = "k = 7\nimport sys\nsys.stdout.close()\nsys.stderr.close()\n"
    path = _submission(lesson, tmp_path / "tiny.ipynb", c2=closes,
                       c4=ROUND + "print('printed after the streams were closed')\n")
    report = hw.grade(path, lesson, cell_timeout=60, keep=tmp_path / "kept.ipynb")
    assert _scores(report) == [1, 1], hw.summary(report)
    kept = nbformat.read(tmp_path / "kept.ipynb", as_version=4)
    assert "printed after the streams" in json.dumps(kept.cells[4].outputs)


def test_the_command_line_releases_and_grades_with_json_and_text_reports(tmp_path):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny.ipynb")
    run = [sys.executable, "-m", "course_lib.exercises"]
    subprocess.run([*run, "release", str(lessons), str(tmp_path / "student")], check=True,
                   capture_output=True)
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    shutil.copy(tmp_path / "student" / "notebooks" / "tiny.ipynb", submissions / "tiny.ipynb")
    out = subprocess.run([*run, "grade", str(submissions), "--source", str(lessons), "--out",
                          str(tmp_path / "reports"), "--cell-timeout", "60"], check=True,
                         capture_output=True, text=True)
    assert "0 / 2 points" in out.stdout
    report = json.loads((tmp_path / "reports" / "tiny.json").read_text())
    assert report["score"] == 0 and len(report["exercises"]) == 2
    assert "NotImplementedError" in (tmp_path / "reports" / "tiny.txt").read_text()
    env = {**os.environ, "PATH": "/nonexistent"}  # no bwrap to be found: refused, loudly
    refused = subprocess.run([sys.executable, *run[1:], "grade", str(submissions), "--source",
                              str(lessons), "--out", str(tmp_path / "r2")], env=env,
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "bubblewrap" in refused.stderr


# -- hostile and malformed submissions ---------------------------------------------------------


def test_a_flood_of_bytes_in_few_outputs_is_capped(tmp_path, lesson):
    report = _attack(tmp_path, lesson, "import os, sys, time\nfor _ in range(500):\n"
                     "    print('x' * 10**5)\nsys.stdout.flush()\ntime.sleep(0.5)\n"
                     "os.write(1, b'y' * 10**8)  # the kernel's own stdout: one 100 MB message,\n"
                     "time.sleep(0.5)  # over the largest the grader takes: dropped whole\n")
    assert _scores(report) == [1, 0], hw.summary(report)
    kept = nbformat.read(tmp_path / "kept.ipynb", as_version=4)
    text = sum(len(out.get("text", "")) for out in kept.cells[4].outputs)
    assert 0 < text <= hw.MAX_OUTPUT_BYTES  # 50 MB printed in 500 outputs, at most 1 MB kept


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
    (folder / "Tiny.ipynb").write_text("{}")                           # tiny, other capitals
    (folder / "tiny (1).ipynb").write_text("{}")                       # a second download
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
                           "link.ipynb", "weird name; rm -rf.ipynb", "tiny (1).ipynb"}
    assert errors["tiny (1).ipynb"].endswith("rename it to tiny.ipynb and grade again")
    assert "not a valid notebook" in errors["other.ipynb"]
    assert errors["Tiny.ipynb"].endswith("rename it to tiny.ipynb and grade again")
    assert "no lesson of that name" in errors["weird name; rm -rf.ipynb"]
    assert "symbolic link" in errors["link.ipynb"] and "not a file" in errors["folder.ipynb"]
    written = sorted(p.name for p in out.iterdir())
    weird = roster.report_stem("weird name; rm -rf.ipynb")  # plain, and a digest of the name
    assert weird.startswith("weird_name__rm_-rf-") and len(weird) == len("weird_name__rm_-rf-") + 8
    assert "tiny.json" in written and f"{weird}.error.txt" in written
    assert all(p.parent == out for p in out.iterdir())


def test_a_notebook_whose_metadata_an_editor_stripped_is_graded_by_position(tmp_path, lesson):
    nb = nbformat.read(lesson, as_version=4)
    for cell in nb.cells:
        cell.metadata = {}
    nbformat.write(nb, tmp_path / "right.ipynb")
    assert _scores(hw.grade(tmp_path / "right.ipynb", lesson, cell_timeout=60)) == [1, 1]
    nb.cells[4].source = WRONG
    nbformat.write(nb, tmp_path / "wrong.ipynb")
    assert _scores(hw.grade(tmp_path / "wrong.ipynb", lesson, cell_timeout=60)) == [1, 0]


def test_two_students_reports_never_overwrite_each_other(tmp_path):
    lessons, out = tmp_path / "lessons", tmp_path / "reports"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny.ipynb")
    for student in ("alice", "bob"):
        (tmp_path / student).mkdir()
        shutil.copy(lessons / "tiny.ipynb", tmp_path / student / "tiny.ipynb")
    subs.grade_all(tmp_path / "alice", lessons, out, cell_timeout=60)
    before = (out / "tiny.json").read_text()
    with pytest.raises(ValueError, match="report of another submission.*--out of its own"):
        subs.grade_all(tmp_path / "bob", lessons, out, cell_timeout=60)
    assert (out / "tiny.json").read_text() == before  # alice's report: untouched
    subs.grade_all(tmp_path / "alice", lessons, out, cell_timeout=60)  # her regrade: allowed
    run = [sys.executable, "-m", "course_lib.exercises", "grade"]
    for folder in (tmp_path / "bob", tmp_path / "nobody"):  # a clash, a missing folder
        done = subprocess.run([*run, str(folder), "--source", str(lessons), "--out", str(out)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "not graded: " in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_release_writes_only_a_new_folder_or_an_earlier_release(tmp_path):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny.ipynb")
    for target in (ROOT, ROOT / "notebooks", ROOT / "data" / "x", LIBRARY / "x", lessons,
                   lessons / "out", tmp_path):
        with pytest.raises(ValueError, match="would overwrite the course or its lessons"):
            editions.check_release_target(lessons, target)  # only checks: nothing is written
    mine = tmp_path / "mine" / "course_lib" / "mine.py"
    mine.parent.mkdir(parents=True)
    mine.write_text("a student's own file")
    with pytest.raises(ValueError, match="holds files that are not a student edition"):
        editions.release(lessons, tmp_path / "mine")
    assert mine.read_text() == "a student's own file"
    for _ in range(2):  # a new folder, then the same release again
        assert editions.release(lessons, tmp_path / "ed") == [tmp_path / "ed/notebooks/tiny.ipynb"]
    with pytest.raises(FileNotFoundError, match="no such folder of lessons"):
        editions.release(tmp_path / "nosuch", tmp_path / "ed2")
    with pytest.raises(ValueError, match="holds no lessons"):
        editions.release(tmp_path / "mine", tmp_path / "ed2")
    run = [sys.executable, "-m", "course_lib.exercises"]
    for args in (["release", str(lessons), str(lessons)], ["mark", str(tmp_path / "nosuch")],
                 ["gradebook", str(tmp_path / "nosuch")]):
        done = subprocess.run([*run, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and f"{args[0]}: not done: " in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert sorted(p.name for p in lessons.iterdir()) == ["tiny.ipynb"]


def test_a_mistyped_source_never_zeroes_a_gradebook_or_grades_against_nothing(tmp_path):
    from course_lib.exercises import gradebook
    out = tmp_path / "reports"
    out.mkdir()
    (out / "gradebook.csv").write_text("the class's grades")
    with pytest.raises(FileNotFoundError, match="nosuch: no such folder of lessons"):
        gradebook.write_gradebook(out, tmp_path / "nosuch")
    assert (out / "gradebook.csv").read_text() == "the class's grades"
    (tmp_path / "alice").mkdir()
    with pytest.raises(FileNotFoundError, match="no such folder of lessons"):
        gradebook.grade_class(tmp_path, tmp_path / "nosuch", out)
    with pytest.raises(FileNotFoundError, match="no such folder of lessons"):
        subs.grade_all(tmp_path / "alice", tmp_path / "nosuch", out)
    run = [sys.executable, "-m", "course_lib.exercises", "grade", str(tmp_path / "alice")]
    for option, value in (("--jobs", "0"), ("--shard", "3/2"), ("--cell-timeout", "-1"),
                          ("--timeout", "0")):
        done = subprocess.run([*run, option, value], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and f"error: {option} must be" in done.stderr, done.stderr


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
    nb.cells[2].source = (f"import pathlib\n"
                          f"pathlib.Path({str(out / 'alice.txt')!r}).write_text('alice: 0')")
    nb.cells[2].metadata = nbformat.read(lessons / "tiny.ipynb", as_version=4).cells[2].metadata
    nbformat.write(nb, folder / "tiny.ipynb")
    # in the sandbox the reports are out of sight; without it (trusted work only), a change is
    # still caught by the fingerprints
    with pytest.raises(subs.Tampered, match="alice.txt"):
        subs.grade_all(folder, lessons, out, cell_timeout=60, sandboxed=False)
    assert (out / "tiny.TAMPERED.txt").read_text().strip() == str(out / "alice.txt")
    assert not (out / "tiny.json").exists()  # no score for a submission that tampered


def test_in_the_sandbox_a_submission_cannot_touch_another_submission_or_report(tmp_path):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    _tiny_lesson(lessons / "tiny.ipynb")
    shutil.copy(lessons / "tiny.ipynb", lessons / "other.ipynb")
    out, folder = tmp_path / "reports", tmp_path / "submissions"
    out.mkdir()
    folder.mkdir()
    (out / "alice.txt").write_text("alice: 2 / 2 points\n")
    shutil.copy(lessons / "tiny.ipynb", folder / "other.ipynb")  # honest, graded second
    targets = [folder / "other.ipynb", out / "alice.txt", out / "tiny.json"]
    attack = "".join(f"try:\n    open({str(t)!r}, 'w').write('0 points')\n"
                     f"except OSError as e:\n    print(type(e).__name__)\n" for t in targets)
    nb = nbformat.read(lessons / "tiny.ipynb", as_version=4)
    nb.cells[4].source = WRONG + attack
    nbformat.write(nb, folder / "tiny.ipynb")
    reports = {Path(r["submission"]).name: r for r in subs.grade_all(folder, lessons, out,
                                                                      cell_timeout=60)}
    assert _scores(reports["tiny.ipynb"]) == [1, 0] and _scores(reports["other.ipynb"]) == [1, 1]
    assert (out / "alice.txt").read_text() == "alice: 2 / 2 points\n"  # nothing was Tampered
    kept = nbformat.read(out / "tiny.executed.ipynb", as_version=4)
    assert json.dumps(kept.cells[4].outputs).count("FileNotFoundError") == 3


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
    assert any("correct" in "".join(o.get("data", {}).get("text/plain", "")
                                    for o in c.get("outputs", []))
               for c in kept.cells if c.cell_type == "code")


def test_a_cell_that_never_returns_is_stopped_at_the_limit_and_graded(tmp_path, lesson):
    stuck = _submission(lesson, tmp_path / "tiny.ipynb", c2="import time\nwhile True:\n"
                        "    time.sleep(0.1)")
    limit = short_limit()
    start = time.monotonic()
    report = hw.grade(stuck, lesson, cell_timeout=limit)
    assert time.monotonic() - start < 10 * limit
    first, second = report["exercises"]
    assert first["score"] == 0 and "CellTimeout" in first["feedback"], hw.summary(report)
    assert second["score"] == 1  # the kernel was interrupted, not lost


def test_a_cell_that_ignores_interrupts_costs_only_itself(tmp_path, lesson):
    # exercise 1's solution cell ignores the interrupt at the time limit (one grading run: each
    # waits out the limit, the interrupt and a restart)
    early = _submission(lesson, tmp_path / "tiny2.ipynb", c2=(
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "while True:\n    time.sleep(0.1)"))
    report = hw.grade(early, lesson, cell_timeout=short_limit())
    assert report["ungraded_errors"][0]["cell"] == 2, hw.summary(report)
    assert "restarted" in report["ungraded_errors"][0]["error"], hw.summary(report)
    # the kernel was restarted, not waited on, and the cells before it ran again in it: the
    # later exercise passed
    assert _scores(report) == [0, 1], hw.summary(report)


def test_a_kernel_that_dies_is_restarted_for_the_next_cells(tmp_path, lesson):
    # exercise 1's solution cell kills its kernel (one grading run): that exercise scores 0,
    # the error says so, and the later exercise passes in the restarted kernel
    early = _submission(lesson, tmp_path / "tiny2.ipynb", c2="import os\nos.kill(os.getpid(), 9)")
    report = hw.grade(early, lesson, cell_timeout=30)
    assert report["ungraded_errors"] == [dict(cell=2, error="the kernel died")], \
        hw.summary(report)
    assert _scores(report) == [0, 1], hw.summary(report)


def test_hidden_cases_are_judged_outside_and_never_reach_the_report(tmp_path, lesson):
    path = _submission(lesson, tmp_path / "tiny.ipynb", c4=SNEAKY)
    report = hw.grade(path, lesson, cell_timeout=60, keep=tmp_path / "kept.ipynb")
    assert _scores(report) == [1, 0]
    assert report["exercises"][1]["feedback"] == hw.HIDDEN_FAILED
    kept = nbformat.read(tmp_path / "kept.ipynb", as_version=4)
    assert "recorded" in json.dumps(kept.cells[5].outputs)  # in the kernel: visible cases passed
    assert hw.grade(lesson, lesson, cell_timeout=60)["score"] == 2  # the right answer passes


def test_feedback_names_no_path_of_the_graders(tmp_path, lesson):
    path = _submission(lesson, tmp_path / "tiny.ipynb", c2=(
        "import os, sys\n"  # the kernel's connection file lies in the grader's folder
        "raise ValueError(sys.argv[sys.argv.index('-f') + 1] + ' ' + os.getcwd())"))
    report = hw.grade(path, lesson, cell_timeout=60)
    text = json.dumps(report["exercises"], ensure_ascii=False)
    assert str(tmp_path) not in text and "/tmp/" not in text and "…" in text, text


def test_the_graders_environment_is_not_readable_in_the_sandbox(tmp_path, lesson, monkeypatch):
    # bubblewrap is process 1 in the sandbox: its environment was the grader's, tokens included
    monkeypatch.setenv("COURSE_TEST_TOKEN", "hunter2-" + uuid.uuid4().hex)
    path = _submission(lesson, tmp_path / "tiny.ipynb", c2=(  # its variables' names (short)
        "names = [v.split('=')[0] for v in open('/proc/1/environ').read().split('\\0') if v]\n"
        "raise ValueError('process 1: ' + str(sorted(names)))"))
    report = hw.grade(path, lesson, cell_timeout=60)
    said = report["exercises"][0]["feedback"]
    assert "process 1: ['PATH']" in said, said  # the grader's had COURSE_TEST_TOKEN among them


def test_text_a_kernel_sends_that_is_not_utf8_is_written_and_the_class_goes_on(tmp_path, lesson):
    # a check record holding a lone surrogate, sent with an ASCII packer: it reached the
    # feedback, the report's text file failed to write and the class's grading stopped
    forged = (
        "import json\n"
        "from jupyter_client.session import json_default\n"
        "from IPython.display import display\n"
        "_s = get_ipython().kernel.session\n"
        "_real = _s.pack\n"
        "_s.pack = lambda o: json.dumps(o, default=json_default).encode()\n"
        "display({'application/vnd.course-lib.check-data+json': {\n"
        "    'name': 'lesson07.fp16_stochastic_round', 'data': {'__failed__': 'x\\ud800y'}}},\n"
        "    raw=True)\n"
        "_s.pack = _real\n")
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(lesson, source / "tiny.ipynb")
    folder = tmp_path / "alice"
    folder.mkdir()
    _submission(lesson, folder / "tiny.ipynb", c4=WRONG + forged)
    report = subs.grade_one(folder / "tiny.ipynb", source, tmp_path / "out", cell_timeout=60)
    assert report["status"] == "graded", report
    text = (tmp_path / "out" / "tiny.txt").read_text()
    assert "\ud800" not in text and "exercise" in text, text
    kept = (tmp_path / "out" / "tiny.executed.ipynb").read_text(encoding="utf-8")
    assert "\ud800" not in kept


@pytest.mark.parametrize("deep", ["x = " + "+".join(["1"] * 800),  # valid; the analysis recursed
                                  "f = " + "lambda: " * 3000 + "1"],  # the parser: MemoryError
                         ids=["an 800-term sum", "3000 nested lambdas"])
def test_code_nested_deeper_than_the_analysis_runs_the_whole_lesson(tmp_path, lesson, deep):
    path = _submission(lesson, tmp_path / "tiny.ipynb", c2="k = 7\n" + deep + "\n")
    report = hw.grade(path, lesson, cell_timeout=60)  # it finishes: nothing raised out of grade
    assert "whole lesson" in json.dumps(report), hw.summary(report)
    # Python runs the sum (exercise 1 then scores); the lambdas do not parse in the kernel either
    assert _scores(report)[0] == (1 if "+" in deep else 0), hw.summary(report)
