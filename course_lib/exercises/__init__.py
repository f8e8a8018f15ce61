"""Exercises: one module of checks per lesson (``lesson00`` ... ``lesson09``), shared checks in
``common``, the two editions of the course (``editions``: the student's has no answers), and the
grader that runs students' notebooks in a sandbox and judges their checks' data outside it
(``grading``, ``sandbox``, ``kernels``, ``submissions``; its commands run as
``python -m course_lib.exercises``).

A check says what is wrong -- which rank, which entry, what it should be -- instead of a bare
assert, and raises :class:`~course_lib.exercises.common.ExerciseFailed`.
"""

from course_lib.exercises.common import ExerciseFailed, check_gradient, check_rank_results

__all__ = ["ExerciseFailed", "check_gradient", "check_rank_results"]
