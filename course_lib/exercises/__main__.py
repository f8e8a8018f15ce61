"""The course's homework commands: ``python -m course_lib.exercises student | mark | release |
grade ...``."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

import nbformat

from course_lib.exercises import editions, gradebook, grading, roster, sandbox, submissions


def lab_command(target: Path, lab_args=()) -> tuple[list[str], dict]:
    """The command that opens the student edition in ``target`` in JupyterLab, and the
    environment it needs (the edition's library first on the path); every path absolute. As
    root (a container, a hosted service) JupyterLab refuses to start without ``--allow-root``:
    it is added, with a line saying so."""
    target = Path(target).resolve()
    lab_args = list(lab_args)
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in lab_args:
        print("running as root (a container or a hosted notebook service?): adding --allow-root, "
              "which JupyterLab needs to start as root")
        lab_args.append("--allow-root")
    command = [sys.executable, "-m", "jupyter", "lab", str(target / "notebooks"), *lab_args]
    return command, {**os.environ, "PYTHONPATH": str(target)}


def edition_imported(target: Path, env: dict) -> Path:
    """The course_lib a kernel started like JupyterLab's (``env``, in the edition's notebooks)
    imports; raises :class:`SystemExit` with what to do unless it is the edition's."""
    target = Path(target).resolve()
    done = subprocess.run([sys.executable, "-c", "import course_lib; print(course_lib.__file__)"],
                          cwd=target / "notebooks", env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    found = Path(done.stdout.strip() or ".").resolve().parent
    if done.returncode != 0 or found != target / "course_lib":
        raise SystemExit(f"the student edition's kernel would not import its own course_lib "
                         f"({done.stderr.strip().splitlines()[-1:] or found}): delete "
                         f"{target} and run this command again to write it afresh")
    return found


def open_student_edition(target: Path, notebooks: Path, *, start: bool = True,
                         lab_args=()) -> list[str]:
    """Write the student edition into ``target`` (unless it is there: a student's work is never
    overwritten), check that its kernel imports the edition's library, print the command that
    opens it in JupyterLab, and run it when ``start``. Returns the command; raises
    :class:`SystemExit` (non-zero) when JupyterLab exits with an error, or does not start."""
    target = Path(target).resolve()
    if not (target / "notebooks").is_dir():
        for path in editions.release(notebooks, target):
            print(f"wrote {path}")
    command, env = lab_command(target, lab_args)
    edition_imported(target, env)
    print("to open it again: PYTHONPATH=" + shlex.quote(str(target)) + " " + shlex.join(command))
    if start:
        try:
            done = subprocess.run(command, env=env, check=False)
        except KeyboardInterrupt:  # the student stopped JupyterLab: that is a normal end
            return command
        if done.returncode != 0:
            raise SystemExit(f"JupyterLab did not start or stopped with an error (exit code "
                             f"{done.returncode}); its message is above. Options after "
                             f"`student` go to JupyterLab (e.g. --port 8890, --no-browser)")
    return command


def split_student_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``student``'s own arguments (the folder, ``--notebooks``, ``--no-start``, ``--help``)
    and the rest, which go to JupyterLab unchanged (``--port 8890``, ``--no-browser`` ...)."""
    ours, lab, i, positional = [argv[0]], [], 1, False
    while i < len(argv):
        arg = argv[i]
        if arg in ("--no-start", "-h", "--help") or arg.startswith("--notebooks="):
            ours.append(arg)
        elif arg == "--notebooks" and i + 1 < len(argv):
            ours += argv[i:i + 2]
            i += 1
        elif not arg.startswith("-") and not positional and not lab:
            ours.append(arg)
            positional = True
        else:
            lab.append(arg)
        i += 1
    return ours, lab


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.exercises",
                                     description=grading.__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("student", help="write the student edition (once) and open it; options "
                                       "it does not know go to JupyterLab (--port, --no-browser)")
    s.add_argument("target", type=Path, nargs="?", default=Path("student"))
    s.add_argument("--notebooks", type=Path, default=Path("notebooks"))
    s.add_argument("--no-start", action="store_true", help="only write it and print the command")
    m = sub.add_parser("mark", help="add nbgrader metadata to the lessons' exercises")
    m.add_argument("notebooks", type=Path)
    r = sub.add_parser("release", help="write the student edition (notebooks, library, data)")
    r.add_argument("notebooks", type=Path)
    r.add_argument("target", type=Path)
    g = sub.add_parser("grade", help="grade a submitted notebook or a folder of them")
    g.add_argument("submissions", type=Path, help="a notebook, one student's folder, a class's "
                   "folder of student folders, an nbgrader submitted/ tree or a Canvas zip")
    g.add_argument("--source", type=Path, default=Path("notebooks"),
                   help="the instructor's lessons to grade against (default: notebooks)")
    g.add_argument("--out", type=Path, default=Path("reports"),
                   help="where reports and the gradebook go (default: reports)")
    g.add_argument("--cell-timeout", type=float, default=120, help="seconds a cell may run")
    g.add_argument("--timeout", type=float, default=900, help="seconds a notebook may run")
    g.add_argument("--whole", action="store_true",
                   help="run every cell of the lesson, not only what the exercises need")
    g.add_argument("--no-sandbox", action="store_true",
                   help="run submissions without the sandbox: ONLY for trusted notebooks")
    g.add_argument("--jobs", type=int, default=1, help="a class: grade this many at a time")
    g.add_argument("--shard", default="0/1", help="a class: grade the i-th of n slices (i/n)")
    b = sub.add_parser("gradebook", help="write a class's gradebook from the reports in a folder")
    b.add_argument("out", type=Path, help="the folder of reports that grade wrote")
    b.add_argument("--source", type=Path, default=Path("notebooks"),
                   help="the instructor's lessons (default: notebooks)")
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, lab_args = split_student_args(argv) if argv[:1] == ["student"] else (argv, [])
    args = parser.parse_args(ours)
    if args.command == "grade":  # checked in either mode: a class or one student's folder
        index, _, count = args.shard.partition("/")
        if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
            g.error(f"--shard must be i/n with 0 <= i < n (e.g. 0/4), got {args.shard!r}")
        for name, value in (("--jobs", args.jobs), ("--cell-timeout", args.cell_timeout),
                            ("--timeout", args.timeout)):
            if not value > 0:
                g.error(f"{name} must be above 0, got {value:g}")
    try:
        run(args, lab_args)
    except (sandbox.SandboxUnavailable, FileNotFoundError, ValueError) as why:
        said = "not graded" if args.command == "grade" else f"{args.command}: not done"
        print(f"{said}: {why}", file=sys.stderr)  # what to do, no traceback
        return 2
    return 0


def run(args, lab_args) -> None:
    """Carry out the parsed command."""
    if args.command == "student":
        open_student_edition(args.target, args.notebooks, start=not args.no_start,
                             lab_args=lab_args)
    elif args.command == "mark":
        for path in editions.lessons_in(args.notebooks):
            nb = nbformat.read(path, as_version=4)
            nbformat.write(editions.mark(nb), path)
            print(f"{path}: {len(editions.exercises(nb))} graded exercises")
    elif args.command == "release":
        for path in editions.release(args.notebooks, args.target):
            print(f"wrote {path}")
    elif args.command == "gradebook":
        print(f"wrote {gradebook.write_gradebook(args.out, args.source)}")
    elif args.submissions.exists() and roster.layout(args.submissions) != "one student":
        index, _, count = args.shard.partition("/")
        gradebook.grade_class(args.submissions, args.source, args.out, jobs=args.jobs,
                              shard=(int(index), int(count)), cell_timeout=args.cell_timeout,
                              timeout=args.timeout, sandboxed=not args.no_sandbox,
                              whole=args.whole)
        print(f"gradebook: {args.out / 'gradebook.csv'}")
    else:
        submissions.grade_all(args.submissions, args.source, args.out,
                              cell_timeout=args.cell_timeout, timeout=args.timeout,
                              sandboxed=not args.no_sandbox, whole=args.whole)


if __name__ == "__main__":
    sys.exit(main())
