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
import re
from pathlib import Path

import nbformat

import course_lib
from course_lib.exercises.grading import grade, summary


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
        lessons = ", ".join(sorted(p.name for p in Path(source).glob("*.ipynb")))
        return f"no lesson of that name to grade it against (lessons: {lessons})"
    return None


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
    if not submissions.exists():
        raise FileNotFoundError(f"{submissions}: no such file or folder of submissions")
    paths = [submissions] if not submissions.is_dir() else sorted(submissions.iterdir())
    if not paths:
        raise ValueError(f"{submissions} is empty: nothing to grade")
    out.mkdir(parents=True, exist_ok=True)
    for path in paths:  # before any grading: never a report over another submission's
        old = out / f"{_safe_stem(path)}.json"
        theirs = None
        if old.is_file() and not old.is_symlink():
            with contextlib.suppress(ValueError, AttributeError):  # not a report: not ours
                theirs = json.loads(old.read_text()).get("submission")
        if theirs not in (None, str(path)):
            raise ValueError(f"{old} is the report of another submission ({theirs}): give "
                             f"each student's folder an --out of its own (e.g. --out "
                             f"{out / 'STUDENT'}), or remove {old} to regrade")
    reports = []
    for path in paths:
        why = _refusal(path, source) or _unreadable(path)
        if why is not None:
            report = dict(submission=path.name, error=why, exercises=[], score=0, points=0)
            (out / f"{_safe_stem(path)}.error.txt").write_text(f"{path.name}: {why}\n")
            print(f"{path.name}: NOT GRADED: {why}")
        else:
            watched = (Path(source), Path(course_lib.__file__).parent, out)
            before = fingerprint(*watched)
            executed = out / f"{_safe_stem(path)}.executed.ipynb"
            report = grade(path, Path(source) / path.name, keep=executed, **limits)
            changed = [p for p in changes(before, fingerprint(*watched)) if p != str(executed)]
            if changed:
                evidence = out / f"{_safe_stem(path)}.TAMPERED.txt"
                evidence.write_text("\n".join(changed) + "\n")
                raise Tampered(f"grading {path.name} changed {len(changed)} file(s) the grader "
                               f"relies on, e.g. {changed[0]}: grading stopped. Restore them "
                               f"(listed in {evidence}) and grade untrusted work in a sandbox")
            (out / f"{_safe_stem(path)}.json").write_text(json.dumps(report, indent=2))
            (out / f"{_safe_stem(path)}.txt").write_text(summary(report) + "\n")
            print(summary(report))
        reports.append(report)
    return reports


def _safe_stem(path: Path) -> str:
    """A report's name from a submission's: letters, digits, '-', '_' and '.' only."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", path.stem).lstrip(".") or "unnamed"
