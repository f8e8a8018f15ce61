"""Benchmark: how long grading takes, per lesson and for a class.

Lecture: none (the homework machinery). For each lesson, the instructor's notebook graded in the
sandbox twice: sliced (only what the exercises need, the default) and whole (every cell), with
the seconds of each and whether the verdicts agree; then a class of ``--students`` copies of one
lesson graded with ``--jobs 1`` and ``--jobs 2``: submissions per hour. Prints, asserts nothing:

    python -m course_lib.benchmarks.grading [--lessons 03 06] [--students 4] [--class-lesson 03]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from course_lib.exercises import gradebook
from course_lib.exercises.grading import grade
from course_lib.runtime.torchrun import positive

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def per_lesson(lessons: list[Path], cell_timeout: float = 300) -> list[dict]:
    """Each lesson's instructor notebook graded sliced and whole: seconds, scores, and whether
    every exercise got the same verdict."""
    rows = []
    for lesson in lessons:
        runs = {}
        for whole in (False, True):
            start = time.perf_counter()
            report = grade(lesson, lesson, cell_timeout=cell_timeout, whole=whole)
            runs[whole] = (time.perf_counter() - start, report)
        (sliced, a), (full, b) = runs[False], runs[True]
        same = [e["feedback"] for e in a["exercises"]] == [e["feedback"] for e in b["exercises"]]
        rows.append(dict(lesson=lesson.stem, sliced=sliced, whole=full, same=same,
                         score=f"{a['score']:g}/{a['points']:g}", ran=a["ran"]))
    return rows


def class_rate(lesson: Path, students: int, jobs: int, cell_timeout: float = 300) -> float:
    """Submissions per hour: ``students`` copies of ``lesson`` graded ``jobs`` at a time."""
    with tempfile.TemporaryDirectory(prefix="course_lib_class_") as tmp:
        tmp = Path(tmp)
        for i in range(students):
            (tmp / "in" / f"student{i}").mkdir(parents=True)
            shutil.copy(lesson, tmp / "in" / f"student{i}" / lesson.name)
        source = tmp / "source"
        source.mkdir()
        shutil.copy(lesson, source / lesson.name)
        start = time.perf_counter()
        gradebook.grade_class(tmp / "in", source, tmp / "out", jobs=jobs,
                              cell_timeout=cell_timeout)
        return students / (time.perf_counter() - start) * 3600


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lessons", nargs="+", default=None,
                        help="lesson numbers, as 06 or 06b (default: every lesson)")
    parser.add_argument("--students", type=positive(int), default=4)
    parser.add_argument("--class-lesson", default="03")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS)
    args = parser.parse_args(argv)
    every = sorted(args.notebooks.glob("[0-9]*.ipynb"))
    known = [p.name.split("_")[0] for p in every]
    for asked in [*(args.lessons or []), args.class_lesson]:
        if asked not in known:
            parser.error(f"no lesson {asked} in {args.notebooks} (lessons: {', '.join(known)})")
    lessons = [p for p in every if args.lessons is None or p.name.split("_")[0] in args.lessons]
    rows = per_lesson(lessons)
    print(f"{'lesson':32s} {'sliced':>8s} {'whole':>8s} {'same verdicts':>14s}  ran (sliced)")
    for r in rows:
        print(f"{r['lesson']:32s} {r['sliced']:7.1f}s {r['whole']:7.1f}s {str(r['same']):>14s}  "
              f"{r['score']}, {r['ran']}")
    if rows:
        sliced = sorted(r["sliced"] for r in rows)
        print(f"median per lesson: sliced {sliced[len(sliced) // 2]:.1f} s, whole "
              f"{sorted(r['whole'] for r in rows)[len(rows) // 2]:.1f} s")
    lesson = every[known.index(args.class_lesson)]
    rates = {}
    if args.students > 0:
        for jobs in (1, 2):
            rates[jobs] = class_rate(lesson, args.students, jobs)
            print(f"a class of {args.students} x {lesson.stem}, --jobs {jobs}: "
                  f"{rates[jobs]:.0f} submissions per hour")
    return dict(rows=rows, rates=rates)


if __name__ == "__main__":
    main()
