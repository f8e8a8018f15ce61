"""The instructor's commands: ``python -m course_lib.exercises mark | release | grade ...``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

from course_lib.exercises import grading, submissions


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.exercises",
                                     description=grading.__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("mark", help="add nbgrader metadata to the lessons' exercises")
    m.add_argument("notebooks", type=Path)
    r = sub.add_parser("release", help="write the student versions")
    r.add_argument("notebooks", type=Path)
    r.add_argument("target", type=Path)
    g = sub.add_parser("grade", help="grade a submitted notebook or a folder of them")
    g.add_argument("submissions", type=Path)
    g.add_argument("--source", type=Path, default=Path("notebooks"))
    g.add_argument("--out", type=Path, default=Path("reports"))
    g.add_argument("--cell-timeout", type=float, default=120)
    g.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    if args.command == "mark":
        for path in sorted(args.notebooks.glob("*.ipynb")):
            nb = nbformat.read(path, as_version=4)
            nbformat.write(grading.mark(nb), path)
            print(f"{path}: {len(grading.exercises(nb))} graded exercises")
    elif args.command == "release":
        for path in grading.release(args.notebooks, args.target):
            print(f"wrote {path}")
    else:
        submissions.grade_all(args.submissions, args.source, args.out,
                          cell_timeout=args.cell_timeout, timeout=args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
