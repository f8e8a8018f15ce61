"""Every lesson, as CI runs it: the untouched student edition runs to its last cell (Run All,
every cell, in the grader's sandbox) and gets 0; the instructor's notebook, graded as
submissions are (only what the exercises need: ``slicing``), gets full marks with no cell
failing.

This is where CI executes the notebooks, top to bottom, each in a fresh kernel (nbclient, the
engine nbval uses): the student edition's Run All runs every cell of the lesson, the exercises'
solution cells as their stubs; the instructor's solutions run in the graded run. One class per
lesson: with the README's ``--dist=loadscope`` the lessons spread over both workers.
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
        # the analysis decided for this lesson: the graded run left cells out
        assert report["ran"].startswith("what the exercises need"), report["ran"]

    def test_the_untouched_student_edition_runs_to_its_last_cell_and_scores_zero(
            self, tmp_path, record_property):
        """Run All on the student edition: no cell fails (a stub never stops the lesson), every
        cell runs, each check shows its "not solved yet" box, and the grader gives 0."""
        editions.release(self.lesson.parent, tmp_path)
        student = tmp_path / "notebooks" / self.lesson.name
        kept = tmp_path / "executed.ipynb"
        report = grading.grade(student, self.lesson, cell_timeout=300, keep=kept, whole=True)
        record_property("notebook_seconds", report["seconds"])
        assert report["score"] == 0 and report["points"] >= 2, grading.summary(report)
        assert report["ungraded_errors"] == [], grading.summary(report)
        for exercise in report["exercises"]:  # each scores 0 because it is not solved yet
            assert exercise["feedback"].startswith("not solved yet"), grading.summary(report)
        ran = nbformat.read(kept, as_version=4)
        code = [c for c in ran.cells if c.cell_type == "code"]
        assert all(c.execution_count for c in code), "a cell did not run"
        errors = [o for c in code for o in c.outputs if o.output_type == "error"]
        assert errors == [], errors[0]["ename"] + ": " + errors[0]["evalue"]
        for cell in (c for c in code if c.metadata.get("nbgrader", {}).get("grade")):
            shown = "".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs)
            assert "not solved yet" in shown, cell.source


for _path in LESSONS:
    _name = "TestLesson" + _path.stem.split("_")[0]
    globals()[_name] = type(_name, (LessonGrades,), {"lesson": _path})


def test_every_lesson_has_its_class():
    classes = [globals()["TestLesson" + p.stem.split("_")[0]] for p in LESSONS]
    assert [c.lesson for c in classes] == LESSONS and len(LESSONS) >= 10
