"""Which edition of the course a kernel runs: the instructor's or the student's.

Lecture: none (the homework machinery). ``release`` writes the student edition as a folder with
``notebooks/``, ``course_lib/`` (the library without the answers) and ``data/``, and marks its
library with the file ``EDITION``. A kernel started in that edition's ``notebooks/`` must import
that library; a JupyterLab started by hand, without the edition first on ``PYTHONPATH``, would
import the instructor's (answers and all) and run the lessons against the wrong checks.
"""

from __future__ import annotations

import os
from pathlib import Path

MARKER = "EDITION"  # the file, in the student edition's course_lib/, that names it


class WrongEdition(ImportError):
    """A student edition's notebook imported a course_lib that is not the edition's."""


def edition_library(cwd: Path | None = None) -> Path | None:
    """The student edition's library beside the folder ``cwd`` (a kernel's working folder,
    ``<edition>/notebooks``), or None where ``cwd`` is not in a student edition."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    library = cwd.parent / "course_lib"
    return library if (library / MARKER).is_file() else None


def check_edition(imported: Path | None = None, cwd: Path | None = None) -> None:
    """Raise :class:`WrongEdition` when ``cwd`` is a student edition's ``notebooks/`` and the
    ``course_lib`` imported (``imported``, its folder; this one by default) is not that
    edition's."""
    imported = Path(__file__).parent if imported is None else Path(imported)
    try:
        library = edition_library(cwd)
    except OSError:  # no working folder (deleted under us): nothing to compare
        return
    if library is None or os.path.samefile(library, imported):
        return
    raise WrongEdition(
        f"this notebook is in the student edition {library.parent}, but the kernel imported "
        f"course_lib from {imported}: open it with `python -m course_lib.exercises student` "
        f"(or start JupyterLab with PYTHONPATH={library.parent})")
