"""Practice draws: the student edition judges an answer that depends on the run's drawn values.

Lecture: all of them (the homework's checks).

Some exercises draw their numbers for each run (a network's widths, a partition's seed), so that
an answer copied from someone else's run fails in the grader's. The reference answer is computed
by the instructor's library, which the student edition leaves out. So, outside the grader, such an
exercise draws one of ``PRACTICE_DRAWS`` fixed **practice draws** (:func:`common.drawn`), and
``practice.json`` beside this module holds, for each, salted sha256 digests of the answers the
check accepts -- never the answers. The student edition's check compares the digest of the
student's answer with them: "correct for this run's values" or "wrong". An exercise that draws
nothing but depends on measured constants (lesson 3's crossing) is judged the same way on the
part of the answer the measurements leave fixed. The grader draws its own values from the whole
range and judges them with the instructor's library, as before: a practice answer typed in, or
recovered from its digest, is worth nothing there.

A number with a tolerance is compared by its **bin**: the answer divided by half the tolerance,
rounded down. The table holds the right answer's bin and its two neighbours, so the student
edition accepts only answers within the tolerance (and may call one within a hair of it wrong,
which the grader would accept).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from course_lib.exercises.cases import digest
from course_lib.exercises.common import PRACTICE_DRAWS, ExerciseFailed, practice_rng, to_plain

TABLE = Path(__file__).with_name("practice.json")
EXERCISES: dict = {}  # name -> (cases, answers): filled as the lesson modules register theirs


def register(name: str, answers, draw=None, constants=(), cases=None) -> None:
    """Exercise ``name`` is judged on practice cases in the student edition: each practice draw
    of ``draw`` followed by the lesson's ``constants`` the answer also depends on (a list, or a
    function that returns one), or the plain ``cases`` of an exercise that draws nothing.
    ``answers(case)``: {part: [accepted values]}, by the instructor's library (never called in
    the student edition, which lacks it)."""
    def listed():
        if cases is not None:
            return cases
        fixed = constants() if callable(constants) else constants
        return [[*drawn, *fixed] for drawn in draws(name, draw)]

    EXERCISES[name] = (listed, answers)


def practised(draw):
    """Mark ``draw`` (an exercise's draw function) so that :func:`common.drawn` picks one of its
    practice draws outside a graded run."""
    draw.practice = True
    return draw


def draws(name: str, draw) -> list:
    """The practice draws of exercise ``name``, in order, as plain data."""
    return [to_plain(draw(practice_rng(name, k))) for k in range(PRACTICE_DRAWS)]


def bin_of(value: float, tolerance: float) -> int:
    """The bin of ``value``: the number of half-tolerances it holds, rounded down."""
    return math.floor(value / (tolerance / 2))


def near(value: float, tolerance: float) -> list[int]:
    """The bins an answer within ``tolerance`` of ``value`` may fall in (it and its two
    neighbours: every answer in them is within ``tolerance``)."""
    middle = bin_of(value, tolerance)
    return [middle - 1, middle, middle + 1]


def key(case) -> str:
    return json.dumps(to_plain(case))


def salted(name: str, case, part: str, value) -> str:
    """The digest the table holds for ``value`` as ``part`` of ``name``'s answer for ``case``
    (salted by all three, so that equal answers of different cases do not look alike)."""
    return digest([name, key(case), part, to_plain(value)])[:20]


def table() -> dict:
    """Every registered exercise's digests, computed with the instructor's library."""
    return {name: {key(case): {part: sorted(salted(name, case, part, v) for v in accepted)
                               for part, accepted in answers(case).items()}
                   for case in cases()}
            for name, (cases, answers) in sorted(EXERCISES.items())}


def write() -> Path:
    """Write :data:`TABLE` from the instructor's library (after an exercise changes)."""
    import importlib

    for path in sorted(Path(__file__).parent.glob("lesson[0-9]*.py")):  # each registers its own
        importlib.import_module(f"course_lib.exercises.{path.stem}")
    TABLE.write_text(json.dumps(table(), indent=1, sort_keys=True) + "\n")
    return TABLE


def judge(name: str, case, parts: dict, shown: dict | None = None) -> str:
    """The student edition's verdict on ``parts`` ({part: value, compared as the table's: a
    whole number, or a bin}) for ``case``: "correct ..." when every part's digest is in the
    table, ExerciseFailed naming the first part that is not (with ``shown[part]``, the
    student's own value, where a bin was compared), "recorded ..." when the case is not one of
    the practice cases."""
    stored = json.loads(TABLE.read_text()).get(name, {}).get(key(case))
    if stored is None:
        return ("recorded: the grader judges it (these are not the values of one of this "
                "exercise's practice draws, which this edition can judge)")
    for part, value in parts.items():
        if salted(name, case, part, value) not in stored[part]:
            given = (shown or {}).get(part, value)
            raise ExerciseFailed(f"{part}: {given!r} is not right for this run's values (this "
                                 f"edition holds no reference to say more: the grader does)")
    return ("correct for this run's values (the grader runs your code again on values of its "
            "own)")
