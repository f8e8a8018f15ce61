"""Homework for a whole class: grade a roster, in parallel or in shards, and write the gradebook.

Lecture: none (the homework machinery; ``submissions.grade_one`` grades one file, ``roster``
finds a class's files). Each student's reports go to ``out/<student>/`` (``.student`` there
holds their name as the submissions give it); ``out/gradebook.csv`` has a row per student (a
student folder without a file too) and a column per exercise and per lesson submitted by
anyone, with totals and what went wrong; ``out/gradebook-moodle.csv`` is the same totals in the
shape Moodle's grade import takes (``username``: the name, a column per lesson);
``out/exercises.csv`` says, per exercise, how the class did and the most common reasons points
were lost. A submission that tampers, crashes the grader or times out is recorded as such and
grading goes on. A file whose bytes and lesson are unchanged since its report is not graded
again; ``shard=(i, n)`` grades the students whose names' digests are i modulo n, so that a job
system's array can split a class, and :func:`write_gradebook` merges the reports in ``out``.
"""

from __future__ import annotations

import collections
import csv
import functools
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import nbformat

from course_lib.exercises import editions, roster
from course_lib.exercises.editions import exercises
from course_lib.exercises.grading import PAST_LIMIT
from course_lib.exercises.submissions import grade_one, not_graded, sha256_of

NAME = ".student"  # in a student's reports folder: their name as the submissions give it
STRAY = ("beside the student folders, not in one: move it into its student's folder and grade "
         "again")


def _unchanged(entry: roster.Entry, source: Path, out: Path) -> bool:
    """Whether ``entry`` has a report from a run with the same submission and lesson bytes."""
    if entry.path is None:
        return True  # nothing submitted: nothing to grade
    report = out / entry.student / f"{roster.report_stem(entry.path.name)}.json"
    lesson = Path(source) / entry.path.name
    if entry.path.is_symlink() or not (report.is_file() and entry.path.is_file()
                                       and lesson.is_file()):
        return False
    try:
        old = json.loads(report.read_text()).get("sha256", {})
    except (ValueError, AttributeError):
        return False
    return old == {"submission": sha256_of(entry.path), "lesson": sha256_of(lesson)}


def _grade_student(entries: list, source: Path, out: Path, limits: dict) -> list[dict]:
    """One student's files, one after another: only this job writes into their folder (the
    tamper check watches it)."""
    return [dict(not_graded(e.path, out / e.student, STRAY) if e.stray else
                 grade_one(e.path, source, out / e.student, **limits), student=e.student)
            for e in entries]


def grade_class(submissions: Path, source: Path, out: Path, *, jobs: int = 1,
                shard: tuple[int, int] = (0, 1), **limits) -> list[dict]:
    """Grade every file of the roster ``submissions`` (any :mod:`roster` layout) against the
    lessons in ``source``, ``jobs`` students at a time, the students of this ``shard``
    (:func:`shard_of`); write each student's reports and then the gradebook of every report in
    ``out``. Returns the reports made now."""
    index, count = shard
    if not (isinstance(count, int) and count >= 1 and isinstance(index, int)
            and 0 <= index < count):
        raise ValueError(f"shard must be i/n with 0 <= i < n, got {index}/{count}")
    if not (isinstance(jobs, int) and jobs >= 1):
        raise ValueError(f"jobs must be a whole number of at least 1, got {jobs!r}")
    out = Path(out)
    editions.lessons_in(source)  # before any file is unpacked or graded
    roster.check_out(submissions, out, source)
    by_student = collections.defaultdict(list)
    zipped = Path(submissions).is_file() and roster.layout(submissions) == "canvas zip"
    root = unpack_folder(submissions, out) if zipped else Path(submissions)
    for entry in roster.entries(submissions, root):
        by_student[entry.student].append(entry)
    mine = [s for s in sorted(by_student) if shard_of(s, count) == index]
    out.mkdir(parents=True, exist_ok=True)  # an empty shard too: the merge finds the folder
    forget_removed(out, by_student, mine, root)
    for student in mine:  # who each folder is, for the gradebook, with or without a file
        (out / student).mkdir(parents=True, exist_ok=True)
        (out / student / NAME).write_text(by_student[student][0].name or student,
                                          encoding="utf-8", errors="surrogateescape")
    todo = {s: [e for e in by_student[s] if not _unchanged(e, source, out)] for s in mine}
    todo = {s: files for s, files in todo.items() if files}
    files = sum(e.path is not None for s in mine for e in by_student[s])
    print(f"{sum(not by_student[s][0].stray for s in mine)} students, {files} files in this shard; "
          f"{files - sum(map(len, todo.values()))} unchanged since their reports; grading "
          f"{len(todo)} students, {jobs} at a time")
    reports = []
    if jobs == 1:
        done = (_grade_student(e, source, out, limits) for e in todo.values())
    else:
        spawn = multiprocessing.get_context("spawn")  # no fork of a process that holds threads
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=spawn)
        done = pool.map(functools.partial(_grade_student, source=source, out=out,
                                          limits=limits), todo.values())
    try:
        for i, (student, made) in enumerate(zip(todo, done, strict=True), 1):
            reports += made
            print(f"[{i}/{len(todo)}] {student}: {len(made)} files", file=sys.stderr)
    finally:
        if jobs != 1:
            pool.shutdown(cancel_futures=True)
    if any(out.glob(f"*/{NAME}")):
        write_gradebook(out, source)
    else:
        print(f"no students in this shard and no reports in {out} yet: no gradebook written")
    return reports


def unpack_folder(archive: Path, out: Path) -> Path:
    """Where a zip of submissions is unpacked: a folder of its own under ``out/unpacked`` (its
    name and a digest of its path), so that two assignments' zips, both "submissions.zip",
    never replace each other's files, and a zip downloaded again replaces its own."""
    digest = hashlib.sha256(os.fsencode(os.path.abspath(archive))).hexdigest()[:8]
    return out / "unpacked" / f"{roster.safe_name(Path(archive).stem)}-{digest}"


def forget_removed(out: Path, by_student: dict, mine: list[str], root: Path) -> None:
    """Delete the reports in ``out`` of files under ``root`` (these submissions) that it no
    longer holds, so that the gradebook follows it: a file of a student in ``mine`` removed or
    renamed, a stray file moved away. Reports of other submissions (another assignment graded
    into the same ``out``) stay; a student folder gone from ``root`` keeps its row, warned."""
    kinds = (".json", ".txt", ".error.txt", ".executed.ipynb", ".TAMPERED.txt")
    for student in mine:
        stems = {roster.report_stem(e.path.name) for e in by_student[student] if e.path}
        kept = {f"{stem}{kind}" for stem in stems for kind in kinds}  # "x.TAMPERED.ipynb"'s
        for report in (out / student).glob("*.json"):  # .txt is x's evidence: it stays
            stem = report.name.removesuffix(".json")
            if stem not in stems and _is_report(report, root):
                for kind in kinds:
                    if f"{stem}{kind}" not in kept:
                        (out / student / f"{stem}{kind}").unlink(missing_ok=True)
                print(f"{student}/{stem}: no longer submitted: its reports are removed")
    for folder in sorted(p.parent for p in out.glob(f"*/{NAME}")):
        if folder.name in by_student or not any(_is_report(r, root) for r in folder.glob("*.json")):
            continue
        if _is_stray(folder):
            shutil.rmtree(folder, ignore_errors=True)
            print(f"{folder.name}: the stray file is no longer there: its row is removed")
        else:
            print(f"warning: {folder} holds the reports of a student no longer in these "
                  f"submissions: their row stays in the gradebook until it is deleted",
                  file=sys.stderr)


def _is_report(path: Path, root: Path) -> bool:
    """Whether ``path`` is a report of a file under ``root`` (as the path was given)."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not (isinstance(report, dict) and isinstance(report.get("submission"), str)
            and "status" in report):
        return False
    file, folder = os.path.abspath(report["submission"]), os.path.abspath(root)
    return file.startswith(folder.rstrip(os.sep) + os.sep)


def shard_of(student: str, count: int) -> int:
    """Which of ``count`` shards grades ``student``: from a digest of the folder's name, so that
    a student added or removed between two shards' starts moves no one else."""
    return int(hashlib.sha256(os.fsencode(student)).hexdigest(), 16) % count


def _is_stray(folder: Path) -> bool:
    try:  # another shard may have removed it meanwhile
        name = (folder / NAME).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return False
    return name.endswith(roster.STRAY_SUFFIX) and roster.student_folder(name) == folder.name


def columns(source: Path) -> dict[str, dict[str, float]]:
    """The gradebook's columns: each lesson in ``source``, its exercises' grade ids and points."""
    return {p.stem: {e["grade_id"]: e["points"] for e in exercises(nbformat.read(p, as_version=4))}
            for p in sorted(Path(source).glob("*.ipynb"))}


def _reports(out: Path) -> dict[str, dict[str, dict]]:
    """Every report under ``out``: student -> lesson -> report (a student folder with no
    report: none)."""
    found: dict = collections.defaultdict(dict)
    for path in Path(out).glob(f"*/{NAME}"):
        found[path.parent.name]  # noqa: B018 - listed, with no report
    for path in sorted(Path(out).glob("*/*.json")):
        try:
            report = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(report, dict) and "status" in report:
            file = Path(str(report.get("submission")))  # a lesson's by its stem, else whole
            found[path.parent.name][file.stem if file.suffix == ".ipynb" else file.name] = report
    return found


def write_gradebook(out: Path, source: Path) -> Path:
    """Write ``gradebook.csv``, ``gradebook-moodle.csv`` and ``exercises.csv`` into ``out``
    from every student's reports there. Returns the gradebook's path."""
    if not Path(out).is_dir():
        raise FileNotFoundError(f"{out}: no such folder of reports")
    editions.lessons_in(source)  # a mistyped --source would zero every student
    out, lessons, by_student = Path(out), columns(source), _reports(out)
    if not by_student:
        raise ValueError(f"{out} holds no student's reports (folders with a {NAME} file): "
                         f"grade a class into it first")
    submitted = {lesson for reports in by_student.values() for lesson, report in reports.items()
                 if report.get("status") == "graded"}
    lessons = {k: v for k, v in lessons.items() if k in submitted} or lessons  # this homework's
    head = ["student", "name"] + [f"{lesson}:{gid}" for lesson, ids in lessons.items()
                                  for gid in ids] + [*lessons, "total", "points", "notes"]
    rows, moodle, lost = [], [], collections.defaultdict(list)
    for student in sorted(by_student):
        name = out / student / NAME  # trusted only where it gives this folder
        name = name.read_text("utf-8", "surrogateescape") if name.is_file() else student
        name = name if roster.student_folder(name) == student else student
        row, notes, total = {"student": student, "name": name}, [], 0.0
        points = sum(sum(ids.values()) for ids in lessons.values())  # what every student can get
        for lesson, ids in lessons.items():
            report = by_student[student].get(lesson)
            if report is None:
                notes.append(f"{lesson}: missing")
                continue
            scores = {e["grade_id"]: e for e in report.get("exercises", [])}
            for gid in ids:
                if gid in scores:
                    row[f"{lesson}:{gid}"] = f"{scores[gid]['score']:g}"
                    if scores[gid]["score"] < scores[gid]["points"]:
                        lost[lesson, gid].append(scores[gid]["feedback"])
            row[lesson] = f"{report.get('score', 0):g}"
            total += report.get("score", 0)
            if report.get("status") != "graded":
                notes.append(f"{lesson}: {report.get('status')}: {report.get('error', '')}")
            elif any(e["feedback"].startswith(PAST_LIMIT) for e in scores.values()):
                notes.append(f"{lesson}: timed out (the exercises after the limit did not run)")
        notes += [f"{Path(r['submission']).name}: {r.get('status')}: {r.get('error', '')}"
                  for name, r in by_student[student].items() if name not in lessons]
        row.update(total=f"{total:g}", points=f"{points:g}", notes="; ".join(notes))
        rows.append(row)
        if not name.endswith(roster.STRAY_SUFFIX):  # a file beside the student folders: no one's
            moodle.append({"username": name, "total": row["total"],
                           **{lesson: row.get(lesson, "") for lesson in lessons}})
    path = out / "gradebook.csv"
    _write(path, head, rows)
    _write(out / "gradebook-moodle.csv", ["username", *lessons, "total"], moodle)
    _write(out / "exercises.csv", ["lesson", "exercise", "graded", "mean", "lost points",
                                   "most common reasons"],
           [_exercise_row(lesson, gid, rows, lost[lesson, gid])
            for lesson, ids in lessons.items() for gid in ids])
    return path


def _exercise_row(lesson: str, gid: str, rows: list[dict], lost: list[str]) -> dict:
    scores = [float(r[f"{lesson}:{gid}"]) for r in rows if f"{lesson}:{gid}" in r]
    reasons = collections.Counter(map(_reason, lost)).most_common(3)
    return {"lesson": lesson, "exercise": gid, "graded": len(scores),
            "mean": f"{statistics.mean(scores):.2f}" if scores else "",
            "lost points": len(lost),
            "most common reasons": "; ".join(f"{r} ({n})" for r, n in reasons)}


def _reason(feedback: str) -> str:
    """A lost point's reason, for counting: its first clause, each number written N (a drawn
    value differs from student to student), at most 80 characters, cut between words."""
    text = re.sub(r"\b\d[\d,.]*", "N", feedback.split(" (")[0]).strip()
    return text if len(text) <= 80 else text[:80].rsplit(" ", 1)[0] + " ..."


def inert(value):
    """A cell a spreadsheet shows as text: one that starts with =, +, -, @ or a tab (a formula,
    in Excel, LibreOffice or Google Sheets: a name or feedback a student wrote could run one)
    gets a leading apostrophe; line breaks become spaces. Numbers stay."""
    if not isinstance(value, str):
        return value
    value = " ".join(value.splitlines())
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t") else value


def _write(path: Path, head: list[str], rows: list[dict]) -> None:
    # UTF-8 on every locale; a kernel's text that is not valid UTF-8 is replaced
    with open(path, "w", newline="", encoding="utf-8", errors="replace") as f:
        writer = csv.DictWriter(f, fieldnames=head, restval="")
        writer.writeheader()
        writer.writerows({k: inert(v) for k, v in row.items()} for row in rows)
