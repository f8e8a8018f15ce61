"""Exercises: one module of checks per lesson (``lesson00`` ... ``lesson12``), shared checks in
``common``, what a check cell shows (``verdicts``), the two editions of the course
(``editions``: the student's has no answers), and the grader that runs students' notebooks in a
sandbox and judges their checks' data outside it (``grading``, ``judging``, ``sandbox``,
``kernels``, ``submissions``; its commands run as ``python -m course_lib.exercises``).

A check says what is wrong -- which rank, which entry, what it should be -- instead of a bare
assert. In a notebook it shows one box -- "correct", "recorded" (only the grader can judge it),
"not solved yet" or "wrong": why, then the traceback folded, or :func:`last_traceback` -- and
elsewhere it raises :class:`~course_lib.exercises.common.ExerciseFailed`.
"""

from course_lib.exercises.common import ExerciseFailed, check_gradient, check_rank_results
from course_lib.exercises.verdicts import last_traceback

__all__ = ["ExerciseFailed", "check_gradient", "check_rank_results", "last_traceback"]
