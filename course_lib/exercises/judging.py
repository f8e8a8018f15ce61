"""Judging a check cell's data outside the student's kernel, with the instructor's library.

Lecture: none (the homework machinery). A check cell's checks send their data as plain JSON in
a display message (``common.checked``) that the grader takes out of the kernel's messages; here
the grader finds the judges those checks registered and runs them on that data: "correct", or
why not.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import signal
import threading
import time
from pathlib import Path

from course_lib.exercises import common
from course_lib.exercises.kernels import HIDDEN_FAILED, MAX_DATA_BYTES, TOO_MUCH


def judge_names(lesson_path: Path, lesson, check_cell: str) -> list[str]:
    """The names of the judges a check cell's checks register, looked up in the instructor's
    library (imported here, outside the sandbox): the lesson modules its number and its cells
    name, then the shared checks."""
    text = lesson_path.name + "\n" + "\n".join(c.source for c in lesson.cells)
    numbers = dict.fromkeys(re.findall(r"^(\d+[a-z]?)", lesson_path.name) +
                            re.findall(r"course_lib\.exercises\.lesson(\d+[a-z]?)\b", text))
    modules = []
    for number in numbers:
        with contextlib.suppress(ImportError):
            modules.append(importlib.import_module(f"course_lib.exercises.lesson{number}"))
    modules.append(common)
    names = []
    for call in re.findall(r"\b(check_\w+)\s*\(", check_cell):
        check = next((getattr(m, call) for m in modules if hasattr(m, call)), None)
        if getattr(check, "judge_name", None) and check.judge_name not in names:
            names.append(check.judge_name)
    if not names:
        raise ValueError(f"{lesson_path.name}: a check cell calls no check the grader can judge "
                         f"outside the kernel (one made by common.checked)")
    return names


JUDGE_SECONDS = 60  # a judge's time on one check cell's data: the lessons' take well under 1 s


class JudgeTimeout(BaseException):
    """A judge ran past :data:`JUDGE_SECONDS` (a BaseException: no judge's ``except Exception``
    swallows it)."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Stop what runs inside with :class:`JudgeTimeout` after ``seconds`` (a timer signal: in the
    main thread, where the grader judges; elsewhere no limit). A timer already running is put
    back afterwards, less the time spent inside."""
    if threading.current_thread() is not threading.main_thread() or \
            not hasattr(signal, "setitimer"):
        yield
        return

    def stop(signum, frame):
        raise JudgeTimeout

    (left, interval), began = signal.getitimer(signal.ITIMER_REAL), time.monotonic()
    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if left > 0:  # the timer that was running before, what is left of it
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, left - (time.monotonic() - began)),
                             interval)


def judge_data(records, names: list[str]) -> str:
    """Judge the data a check cell sent, here: 'correct', or why not (a hidden case: only that
    one failed; no answer: what the check said, "not solved yet" or what the code raised).
    ``records``: the cell's data messages as the grader took them out ({"name", "data"} each);
    every one for a check of this cell is judged, and all must pass. Judging all of them may take
    :data:`JUDGE_SECONDS`: data that takes longer (far more than the lesson's run makes) is not
    judged."""
    try:
        with time_limit(JUDGE_SECONDS):
            return _judge_all(records, names)
    except JudgeTimeout:
        return (f"the check's data took more than {JUDGE_SECONDS} s to judge (far more than the "
                f"lesson's run makes): not judged")


def _judge_all(records, names: list[str]) -> str:
    if TOO_MUCH in records:
        return f"the check's data is larger than {MAX_DATA_BYTES // 10**6} MB: not judged"
    seen = set()
    for record in records:
        name = record.get("name") if isinstance(record, dict) else None
        if name not in names:
            continue
        try:
            data = record.get("data")
            if isinstance(data, dict) and data.keys() & {common.NOT_SOLVED, common.FAILED}:
                said = str(data.get(common.NOT_SOLVED) or data.get(common.FAILED))[:300]
                return ("not solved yet: " if common.NOT_SOLVED in data else "") + said
            verdict = common.JUDGES[name](common.from_plain(data))
        except common.HiddenTestFailed:
            return HIDDEN_FAILED
        except common.ExerciseFailed as wrong:
            return f"ExerciseFailed: {str(wrong)[:300]}"
        except Exception as error:  # noqa: BLE001 - data shaped wrong: the answer is wrong
            return f"the check's data could not be judged ({type(error).__name__})"
        if not isinstance(verdict, str):
            return "the check's data could not be judged"
        seen.add(name)
    if missing := [n for n in names if n not in seen]:
        return f"the check cell recorded no answer for {', '.join(missing)}"
    return "correct"
