"""A class's submissions, found in the layouts instructors get them in.

Lecture: none (the homework machinery; ``gradebook`` grades what this finds). Four layouts:

* one student's folder: ``submissions/<lesson>.ipynb`` (the student is the folder's name);
* a folder of student folders: ``submissions/<student>/<lesson>.ipynb``;
* nbgrader's tree: ``submitted/<student>/<assignment>/<lesson>.ipynb``;
* Canvas's "Download Submissions" zip: files named ``<name>[_LATE]_<user id>_<submission id>_
  <file name>``, a resubmission's file name ending ``-1``, ``-2`` ... (the student is
  ``<name>_<user id>``). Only regular ``.ipynb`` members are taken, by their base name, each
  under a size limit: a zip can't write outside the folder it is unpacked into; the members
  passed over are printed.

Anything else in the folder (a notes file, a link, a notebook of no lesson, a stray notebook
beside the student folders) is still listed, so that the grader reports it instead of passing
over it in silence; a student folder with nothing in it is listed with no file (``path`` None).
Each student's reports go to a folder of their own (:func:`student_folder`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

MAX_MEMBER_BYTES = 50_000_000  # a notebook in a zip larger than this is not unpacked
CANVAS = re.compile(r"^(?P<name>[^_/]+?)(?:_(?i:late))?_(?P<user>\d+)_(?P<sub>\d+)_(?P<file>.+)$")
STRAY_SUFFIX = " (stray)"  # ends the row name of a file beside the student folders: not a student
NBGRADER_FILES = {"timestamp.txt"}  # nbgrader writes one into each submitted assignment folder


@dataclass(frozen=True)
class Entry:
    """One file to grade: whose it is (``student``: their reports' folder; ``name``: as the
    submissions name them) and where it lies (its name says which lesson; None: nothing)."""

    student: str
    path: Path | None
    name: str = field(default="", compare=False)
    stray: bool = field(default=False, compare=False)  # a file beside the student folders


def safe_name(text: str) -> str:
    """A file's name as a file name: letters, digits, '-', '_' and '.' only."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text).lstrip(".") or "unnamed"


def report_stem(filename: str) -> str:
    """The stem of a submitted file's reports: a notebook's own stem where that is a plain name,
    else the plain name (with its suffix, for a file that is not a notebook) and a digest of the
    whole name, so that two files never share reports ("02 x.ipynb" or "02_x.pdf" beside
    "02_x.ipynb", a lesson's name, overwrote its report with "not graded")."""
    path = Path(filename)
    plain = safe_name(path.stem if path.suffix == ".ipynb" else path.name)
    if path.suffix == ".ipynb" and plain == path.stem and not re.search(r"-[0-9a-f]{8}$", plain):
        return plain
    return f"{plain}-{hashlib.sha256(os.fsencode(filename)).hexdigest()[:8]}"


RESERVED = {"unpacked", "gradebook.csv", "gradebook-moodle.csv", "exercises.csv"}  # in --out


def student_folder(name: str) -> str:
    """The folder of a student's reports: ``name`` where it is a plain folder name (letters of
    any script, digits, '-', '_', '.'; not one of the reports folder's own files), else its plain
    form and a hash of ``name``, so that two students ("Anna Lee", "Anna_Lee") never share one."""
    plain = re.sub(r"[^\w.-]", "_", name).lstrip(".") or "unnamed"
    if plain == name and name not in RESERVED and not re.search(r"-[0-9a-f]{8}$", name):
        return name
    return f"{plain}-{hashlib.sha256(os.fsencode(name)).hexdigest()[:8]}"


def visible(folder: Path) -> list[Path]:
    """What ``folder`` holds, sorted, without hidden names (Jupyter's ``.ipynb_checkpoints``,
    ``.DS_Store``): tools leave them, students do not submit them."""
    return sorted(p for p in Path(folder).iterdir() if not p.name.startswith("."))


def _entry(name: str, path: Path | None) -> Entry:
    return Entry(student_folder(name), path, name)


def layout(path: Path) -> str:
    """Which layout ``path`` is in: "one student", "students", "nbgrader" or "canvas zip"."""
    path = Path(path)
    if path.is_file():
        return "canvas zip" if zipfile.is_zipfile(path) else "one student"
    folders = [p for p in visible(path) if p.is_dir() and not p.is_symlink()]
    # a student's folder holds notebooks or folders of them, or nothing (nothing submitted)
    students = [f for f in folders if not visible(f) or any(
        c.suffix == ".ipynb" or c.is_dir() for c in visible(f))]
    if not folders or (not students and any(p.suffix == ".ipynb" for p in visible(path))):
        return "one student"  # notebooks and no student folder: not a class with a stray file
    held = [f for f in folders if visible(f)]  # nbgrader's: assignment folders, no notebooks
    if held and all(not any(c.suffix == ".ipynb" for c in visible(f)) and
                    any(c.is_dir() for c in visible(f)) for f in held):
        return "nbgrader"
    return "students"


def entries(path: Path, unpack_to: Path) -> list[Entry]:
    """Every file to grade under ``path``, by student (sorted); a zip is unpacked into
    ``unpack_to`` first. A missing or empty ``path`` is an error, not an empty class."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder of submissions")
    if path.is_dir() and not visible(path):
        raise ValueError(f"{path} is empty: nothing to grade")
    kind = layout(path)
    if kind == "canvas zip":
        path, kind = unpack_canvas(path, unpack_to), "students"
    if kind == "one student":
        files = [path] if path.is_file() else visible(path)
        return [_entry(path.parent.name if path.is_file() else path.name, f) for f in files]
    found = []
    for student in visible(path):
        if not student.is_dir() or student.is_symlink():
            stray = f"{student.stem}{STRAY_SUFFIX}"  # a row of its own, never a student's
            found.append(Entry(student_folder(stray), student, stray, True))
            continue
        found += [_entry(student.name, f) for f in submitted(student)] or \
            [_entry(student.name, None)]
    return found


def check_out(submissions: Path, out: Path, source: Path) -> None:
    """Refuse an ``out`` inside a folder of ``submissions`` or in a notebook's own folder (a
    later run would grade the reports as submissions), in the lessons, or holding either (a
    student's reports folder could be one of them). A zip's folder may hold the reports."""
    out, given, lessons = (Path(p).resolve() for p in (out, submissions, source))
    if (given.is_dir() and (out == given or given in out.parents)) or (
            given.is_file() and not zipfile.is_zipfile(given) and out == given.parent):
        raise ValueError(f"--out {out} is inside the submissions {given}: a later run would "
                         f"grade its reports as submissions; write them elsewhere")
    if out == lessons or lessons in out.parents:
        raise ValueError(f"--out {out} is inside the lessons {lessons}: its reports would be "
                         f"taken for lessons; write them elsewhere")
    for inner in ([given] if given.is_dir() else []) + [lessons]:
        if out in inner.parents:
            raise ValueError(f"--out {out} holds {inner}: a student's reports folder could be "
                             f"it; write the reports into a folder of their own")


def submitted(student: Path) -> list[Path]:
    """The files of one student's folder: its own, or, where it holds folders and no notebook
    (nbgrader's ``<assignment>/``), theirs without nbgrader's ``timestamp.txt``. Decided per
    student: one stray notebook does not change how the rest of the class is read."""
    own = visible(student)
    if any(p.suffix == ".ipynb" for p in own) or not any(
            p.is_dir() and not p.is_symlink() for p in own):
        return own
    inner = [f for a in own for f in (
        [g for g in visible(a) if g.name not in NBGRADER_FILES]
        if a.is_dir() and not a.is_symlink() else [a])]
    names = [f.name for f in inner if f.suffix == ".ipynb"]  # a lesson in two folders:
    return inner if len(set(names)) == len(names) else own   # neither is taken


def unpack_canvas(archive: Path, folder: Path) -> Path:
    """Unpack a Canvas submissions zip into ``folder/<name>_<user id>/<file name>``: regular
    ``.ipynb`` members only, by base name, at most :data:`MAX_MEMBER_BYTES` each; the latest
    submission of a file wins (Canvas numbers resubmissions ``-1``, ``-2``). What ``folder``
    holds from an earlier zip and this one lacks is removed (give each zip a folder of its
    own). Returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    latest: dict[Path, tuple[int, zipfile.ZipInfo]] = {}
    skipped = []
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            kind = (info.external_attr >> 16) & 0o170000
            base = Path(info.filename).name
            match = CANVAS.match(base)
            if info.is_dir() or (kind and not stat.S_ISREG(kind)) or not match \
                    or not base.endswith(".ipynb") or info.file_size > MAX_MEMBER_BYTES:
                skipped += [] if info.is_dir() else [info.filename]
                continue
            stem = re.sub(r"-\d+$", "", Path(match["file"]).stem)
            target = folder / student_folder(f"{match['name']}_{match['user']}") / \
                safe_name(stem + ".ipynb")
            order = int(match["sub"])
            if target not in latest or latest[target][0] < order:
                latest[target] = (order, info)
        for old in folder.glob("*/*.ipynb"):  # unpacked from an earlier zip, not in this one
            if old not in latest:
                old.unlink(missing_ok=True)
        kept = {target.parent for target in latest}
        for empty in set(folder.glob("*/")) - kept:
            with contextlib.suppress(OSError):
                empty.rmdir()  # only if empty: a student no longer in the zip
        for target, (_, info) in latest.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as member:
                data = member.read(MAX_MEMBER_BYTES + 1)[:MAX_MEMBER_BYTES]
            if target.is_file() and target.read_bytes() == data:
                continue  # unpacked before (another shard, an earlier run): left as it is
            # written beside it, then renamed: a shard grading this file meanwhile reads it
            # whole, old or new, never half written
            part = target.with_name(f".{target.name}.{os.getpid()}.part")
            part.write_bytes(data)
            os.replace(part, target)
    if skipped:
        print(f"{archive.name}: passed over {len(skipped)} member(s) that are no Canvas "
              f"submission's notebook (name_userid_submissionid_file.ipynb, under "
              f"{MAX_MEMBER_BYTES // 10**6} MB): {', '.join(skipped[:10])}", file=sys.stderr)
    return folder
