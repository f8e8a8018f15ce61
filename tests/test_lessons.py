"""Every lesson, as CI runs it: the instructor's notebook graded in the sandbox gets full marks
with no cell failing, and the untouched student edition gets 0, failing only in the exercises.

This is where CI executes the notebooks, top to bottom, each in a fresh kernel (nbclient, the
engine nbval uses) -- inside the grader's sandbox. One class per lesson: with the README's
``--dist=loadscope`` the lessons spread over both workers.
"""

from pathlib import Path

import nbformat

from course_lib.exercises import editions, grading

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))


class LessonGrades:
    lesson: Path

    def test_the_instructors_notebook_gets_full_marks_with_no_cell_failing(self,
                                                                           record_property):
        report = grading.grade(self.lesson, self.lesson, cell_timeout=300)
        record_property("notebook_seconds", report["seconds"])  # conftest prints it
        assert report["ungraded_errors"] == [], grading.summary(report)
        assert report["score"] == report["points"] >= 2, grading.summary(report)

    def test_the_untouched_student_edition_gets_zero_failing_only_in_its_exercises(
            self, tmp_path, record_property):
        editions.release(self.lesson.parent, tmp_path)
        student = tmp_path / "notebooks" / self.lesson.name
        report = grading.grade(student, self.lesson, cell_timeout=300)
        record_property("notebook_seconds", report["seconds"])
        assert report["score"] == 0 and report["points"] >= 2, grading.summary(report)
        nb = nbformat.read(self.lesson, as_version=4)
        solutions = {i for i, c in enumerate(nb.cells)
                     if c.metadata.get("nbgrader", {}).get("solution")}
        assert {f["cell"] for f in report["ungraded_errors"]} <= solutions, \
            grading.summary(report)
        for exercise in report["exercises"]:  # each fails on the stub, not on something else
            assert "NotImplementedError" in exercise["feedback"] or \
                "NameError" in exercise["feedback"], grading.summary(report)


for _path in LESSONS:
    _name = "TestLesson" + _path.stem.split("_")[0]
    globals()[_name] = type(_name, (LessonGrades,), {"lesson": _path})


def test_every_lesson_has_its_class():
    classes = [globals()["TestLesson" + p.stem.split("_")[0]] for p in LESSONS]
    assert [c.lesson for c in classes] == LESSONS and len(LESSONS) >= 10
