"""The course's homework commands: ``python -m course_lib.exercises student | mark | release |
grade ...``."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import nbformat

from course_lib.exercises import editions, grading, sandbox, submissions


def open_student_edition(target: Path, notebooks: Path, *, start: bool = True) -> list[str]:
    """Write the student edition into ``target`` (unless it is there: a student's work is never
    overwritten) and the command that opens it in JupyterLab, with ``target``'s library first on
    the path; run it when ``start``."""
    if not (target / "notebooks").is_dir():
        for path in editions.release(notebooks, target):
            print(f"wrote {path}")
    command = [sys.executable, "-m", "jupyter", "lab", str(target / "notebooks")]
    print(f"PYTHONPATH={target} {' '.join(command)}")
    if start:
        env = {**os.environ, "PYTHONPATH": str(target.resolve())}
        subprocess.run(command, env=env, check=False)
    return command


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.exercises",
                                     description=grading.__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("student", help="write the student edition (once) and open it")
    s.add_argument("target", type=Path, nargs="?", default=Path("student"))
    s.add_argument("--notebooks", type=Path, default=Path("notebooks"))
    s.add_argument("--no-start", action="store_true", help="only write it and print the command")
    m = sub.add_parser("mark", help="add nbgrader metadata to the lessons' exercises")
    m.add_argument("notebooks", type=Path)
    r = sub.add_parser("release", help="write the student edition (notebooks, library, data)")
    r.add_argument("notebooks", type=Path)
    r.add_argument("target", type=Path)
    g = sub.add_parser("grade", help="grade a submitted notebook or a folder of them")
    g.add_argument("submissions", type=Path)
    g.add_argument("--source", type=Path, default=Path("notebooks"))
    g.add_argument("--out", type=Path, default=Path("reports"))
    g.add_argument("--cell-timeout", type=float, default=120)
    g.add_argument("--timeout", type=float, default=900)
    g.add_argument("--no-sandbox", action="store_true",
                   help="run submissions without the sandbox: ONLY for trusted notebooks")
    args = parser.parse_args(argv)
    if args.command == "student":
        open_student_edition(args.target, args.notebooks, start=not args.no_start)
    elif args.command == "mark":
        for path in sorted(args.notebooks.glob("*.ipynb")):
            nb = nbformat.read(path, as_version=4)
            nbformat.write(editions.mark(nb), path)
            print(f"{path}: {len(editions.exercises(nb))} graded exercises")
    elif args.command == "release":
        for path in editions.release(args.notebooks, args.target):
            print(f"wrote {path}")
    else:
        try:
            submissions.grade_all(args.submissions, args.source, args.out,
                                  cell_timeout=args.cell_timeout, timeout=args.timeout,
                                  sandboxed=not args.no_sandbox)
        except sandbox.SandboxUnavailable as why:
            print(f"not graded: {why}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
