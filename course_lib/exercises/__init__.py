"""Exercises: one module of checks per lesson (``lesson02`` ... ``lesson09``), shared checks in
``common``, and the grader that runs students' notebooks (``grading``; its commands run as
``python -m course_lib.exercises``).

A check says what is wrong -- which rank, which entry, what it should be -- instead of a bare
assert, and raises :class:`~course_lib.exercises.common.ExerciseFailed`.
"""

from course_lib.exercises.common import ExerciseFailed, check_gradient, check_rank_results

__all__ = ["ExerciseFailed", "check_gradient", "check_rank_results"]
