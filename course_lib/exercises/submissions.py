"""Grading a folder of submissions: what is refused and why, tamper evidence, the reports.

Lecture: none (the course's homework machinery; ``grading`` grades one submission). A folder
may hold anything a student or a mistake put there: every file that can't be graded is reported
with its reason and the rest are graded. Before and after each submission the grader takes a
fingerprint (SHA-256) of what it relies on -- the lessons it grades against, ``course_lib`` and
the reports already written -- and stops loudly if a submission changed any of it; it keeps each
executed notebook (outputs capped) beside its report, for audit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path

import nbformat

import course_lib
from course_lib.exercises.editions import lessons_in
from course_lib.exercises.grading import grade, printable, summary
from course_lib.exercises.roster import CANVAS, check_out, report_stem, visible


class Tampered(RuntimeError):
    """A submission changed a file the grader relies on."""


def fingerprint(*roots: Path) -> dict[str, str]:
    """SHA-256 of every file under ``roots`` (bytecode caches left out), by path."""
    prints = {}
    for root in map(Path, roots):
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" not in path.parts:
                prints[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return prints


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The paths added, removed or changed between two fingerprints."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def _refusal(path: Path, source: Path) -> str | None:
    """Why ``path`` can't be graded, or None. Checked before anything is read from it."""
    if path.is_symlink():
        return "a symbolic link: submit the notebook itself"
    if not path.is_file():
        return "not a file (a folder?): submit each lesson's notebook at the top of the folder"
    if path.suffix != ".ipynb":
        return "not a notebook (.ipynb)"
    if not (Path(source) / path.name).is_file():
        copy = renamed_lesson(path.name, source)
        if copy is not None:
            return f"a renamed copy of a lesson's notebook: rename it to {copy} and grade again"
        canvas = CANVAS.match(path.name)
        if canvas and renamed_lesson(canvas["file"], source):
            return ("a file of an unpacked Canvas download: grade the zip itself, whose names "
                    "say whose each file is")
        lessons = ", ".join(sorted(p.name for p in Path(source).glob("*.ipynb")))
        return f"no lesson of that name to grade it against (lessons: {lessons})"
    return None


def renamed_lesson(name: str, source: Path) -> str | None:
    """The lesson in ``source`` a notebook named ``name`` is a renamed copy of, or None: a
    browser's "X (1)", Canvas's "X__1_", a resubmission's "X-1", Google's "Copy of X", or X in
    other capitals."""
    stem = re.sub(r"^(copy of\s+)+", "", Path(name).stem, flags=re.IGNORECASE)
    stem = re.sub(r"(\s*\(\d+\)|__\d+_|-\d+)$", "", stem).lower()
    lessons = {p.stem.lower(): p.name for p in Path(source).glob("*.ipynb")}
    return lessons.get(stem) if Path(name).suffix.lower() == ".ipynb" else None


def _unreadable(path: Path) -> str | None:
    """Why ``path`` is not a valid notebook (invalid JSON, an unknown layout), or None."""
    try:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
    except Exception as error:  # noqa: BLE001 - whatever the reader raises, the file is bad
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        return f"not a valid notebook ({type(error).__name__}: {first})"
    return None


def grade_all(submissions: Path, source: Path, out: Path, **limits) -> list[dict]:
    """Grade every notebook in ``submissions`` (a folder, or one file) against the lesson of
    the same name in ``source``; write ``<name>.json``, ``<name>.txt`` and the executed
    ``<name>.executed.ipynb`` into ``out``. Raises :class:`Tampered`, naming the files, if a
    submission changed the lessons, ``course_lib`` or the reports folder.

    A file that can't be graded -- a symbolic link, a folder, an oddly named file, a notebook
    that isn't valid JSON -- is reported (``<name>.error.txt``, and a report with its reason)
    and the rest are graded. A missing or empty ``submissions`` is an error, not a zero."""
    submissions, out = Path(submissions), Path(out)
    lessons_in(source)  # a mistyped --source would report every file as "no lesson"
    if not submissions.exists():
        raise FileNotFoundError(f"{submissions}: no such file or folder of submissions")
    paths = [submissions] if not submissions.is_dir() else visible(submissions)
    if not paths:
        raise ValueError(f"{submissions} is empty: nothing to grade")
    check_out(submissions, out, source)
    out.mkdir(parents=True, exist_ok=True)
    for path in paths:  # before any grading: never a report over another submission's
        old = out / f"{report_stem(path.name)}.json"
        theirs = None
        if old.is_file() and not old.is_symlink():
            with contextlib.suppress(ValueError, AttributeError):  # not a report: not ours
                theirs = json.loads(old.read_text()).get("submission")
        if theirs is not None and os.path.abspath(theirs) != os.path.abspath(path):
            raise ValueError(f"{old} is the report of another submission ({theirs}): give "
                             f"each student's folder an --out of its own (e.g. --out "
                             f"{out / 'STUDENT'}), or remove {old} to regrade")
    return [grade_one(path, source, out, stop=True, **limits) for path in paths]


def grade_one(path: Path, source: Path, out: Path, *, stop: bool = False, **limits) -> dict:
    """Grade one file against its lesson in ``source`` and write its reports into ``out``.
    Its report's ``status`` says what happened: "graded"; "not graded" (a file that can't be
    graded, with ``error``: the reason); "tampered" (it changed a file the grader relies on:
    raised as :class:`Tampered` when ``stop``, with the evidence kept in either case); "grader
    failed" (the grader itself raised: the error is kept). Its ``sha256`` fingerprints the
    submission and the lesson (a later run with both unchanged need not grade it again)."""
    path, out = Path(path), Path(out)
    name, stem = path.name, report_stem(path.name)
    out.mkdir(parents=True, exist_ok=True)
    why = _refusal(path, source) or _unreadable(path)
    if why is not None:
        return not_graded(path, out, why)
    lesson = Path(source) / name
    hashes = {"submission": sha256_of(path), "lesson": sha256_of(lesson)}
    watched = (Path(source), Path(course_lib.__file__).parent, out)
    before = fingerprint(*watched)
    executed = out / f"{stem}.executed.ipynb"
    try:
        report = dict(grade(path, lesson, keep=executed, **limits), status="graded")
    except Exception as error:  # noqa: BLE001 - one submission never stops a class
        if stop:
            raise
        first = (str(error).strip().splitlines() or [""])[0][:300]
        (out / f"{stem}.error.txt").write_text(f"{name}: the grader failed: "
                                               f"{type(error).__name__}: {first}\n",
                                               encoding="utf-8", errors="replace")
        report = dict(submission=str(path), status="grader failed", exercises=[], score=0,
                      points=0, error=f"{type(error).__name__}: {first}")
    own = {str(executed), str(out / f"{stem}.error.txt")}  # what this grading itself writes
    changed = [p for p in changes(before, fingerprint(*watched)) if p not in own]
    if changed:
        evidence = out / f"{stem}.TAMPERED.txt"
        evidence.write_text("\n".join(changed) + "\n", encoding="utf-8", errors="replace")
        if stop:
            raise Tampered(f"grading {name} changed {len(changed)} file(s) the grader relies "
                           f"on, e.g. {changed[0]}: grading stopped. Restore them (listed in "
                           f"{evidence}) and grade untrusted work in a sandbox")
        report = dict(submission=str(path), status="tampered", exercises=[], score=0,
                      points=report.get("points", 0), error=f"changed {len(changed)} file(s) "
                      f"the grader relies on (listed in {evidence.name})")
    report["sha256"] = hashes
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))  # ASCII: \u escapes
    line = summary(report) if report["status"] == "graded" else \
        f"{name}: {report['status'].upper()}: {report['error']}"
    (out / f"{stem}.txt").write_text(line + "\n", encoding="utf-8", errors="replace")
    print(printable(line))
    return report


def not_graded(path: Path, out: Path, why: str) -> dict:
    """Report ``path`` as not graded, for the reason ``why``, in ``out``; return the report."""
    path, out = Path(path), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{report_stem(path.name)}.error.txt").write_text(f"{path.name}: {why}\n",
                                                             encoding="utf-8", errors="replace")
    print(printable(f"{path.name}: NOT GRADED: {why}"))
    report = dict(submission=str(path), status="not graded", error=why, exercises=[], score=0,
                  points=0)
    (out / f"{report_stem(path.name)}.json").write_text(json.dumps(report, indent=2))
    return report


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file's bytes, in hex."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
