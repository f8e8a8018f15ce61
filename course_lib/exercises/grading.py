"""Homework: grade a submitted notebook, assuming it is hostile.

Lecture: none (the homework machinery). The commands (``python -m course_lib.exercises``)::

    python -m course_lib.exercises mark notebooks               # authoring (idempotent)
    python -m course_lib.exercises release notebooks student    # the student edition
    python -m course_lib.exercises grade submissions --source notebooks --out reports

What is graded is the lesson itself -- the instructor's cells, in the instructor's order -- with
the student's code in its solution cells and nowhere else: a submission can't remove, reorder,
copy or weaken a check cell, whatever it does to the file. It runs in a fresh kernel in the
sandbox (``sandbox``: the student edition only, no network but loopback, limits on memory,
processes and bytes, and a process tree that ends with it), with a time limit per cell and for
the whole notebook. Each check sends its data as JSON in a display message, which the grader
takes out of the kernel's messages and judges here, outside the kernel, with the instructor's
library, on cases it draws itself for this run (the hidden tests: their seed reaches the kernel
only when the check cell runs). An exercise scores only if its check cell ran to completion and
every judgement passed. A cell that raises, hangs, prints without end or kills its kernel costs
its own exercise at most.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from unittest import mock

import nbformat
from jupyter_core.utils import run_sync

from course_lib.exercises import common, judging, sandbox
from course_lib.exercises.assembling import (  # noqa: F401 - here too
    another_lesson,
    assemble,
    only_needed,
)
from course_lib.exercises.editions import (  # noqa: F401 - the authoring API, here too
    HIDDEN,
    STUB,
    exercises,
    mark,
    nbgrader_meta,
    release,
    stub,
    student_library,
    student_version,
)
from course_lib.exercises.guard import Guard, remove_tree
from course_lib.exercises.kernels import (  # noqa: F401 - the limits, here too
    HIDDEN_FAILED,
    MAX_OUTPUT_BYTES,
    MAX_OUTPUTS,
    RESTORE_STREAMS,
    kill_children,
    notebook_client,
    pid_of_kernel,
    replay,
    responsive,
    restart_kernel,
    run_quietly,
    sandboxed_manager,
)


def printable(text: str) -> str:
    """``text`` as UTF-8 can write it: a kernel's bytes or a file name that are not valid UTF-8
    (a zip made on another system) gets a replacement character instead of stopping the class."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _first_line(error) -> str:
    ename, evalue = getattr(error, "ename", type(error).__name__), getattr(error, "evalue", "")
    return f"{ename}: {evalue}".strip().splitlines()[0][:300] if (ename or evalue) else str(error)


def grade(submission, source, *, cell_timeout: float = 120, timeout: float = 900,
          keep: Path | None = None, sandboxed: bool = True,
          limits: sandbox.Limits | None = None, whole: bool = False) -> dict:
    """Run a submitted notebook as its lesson ``source`` with the student's solutions, and score
    each exercise. By default only what the exercises need runs (:func:`only_needed`: the same
    verdicts, in a fraction of the time); ``whole=True`` runs every cell of the lesson.
    ``sandboxed=False`` runs the kernel as the grader's user with the full library: only for
    trusted work (the instructor's own notebooks). Returns a report: the points per exercise with
    why any were lost, the total, what ran and the seconds taken."""
    source = Path(source)
    if sandboxed and (why := sandbox.unavailable()):
        raise sandbox.SandboxUnavailable(f"{why}. Untrusted work is graded only in the sandbox; "
                                         f"pass sandboxed=False (--no-sandbox) only for trusted "
                                         f"notebooks")
    lesson = nbformat.read(source, as_version=4)
    graded = {e["index"]: e for e in exercises(lesson)}
    judges = {i: judging.judge_names(source, lesson, lesson.cells[i].source) for i in graded}
    submitted = nbformat.read(submission, as_version=4)
    nb, missing = assemble(submitted, lesson)
    wrong = another_lesson(submitted, lesson)
    cut, ran = ({}, "the whole lesson") if whole else only_needed(nb, graded)
    skip = {i for i, original in cut.items() if original is None}
    results = {e["grade_id"]: dict(grade_id=e["grade_id"], points=e["points"], score=0.0,
                                   feedback="not run") for e in graded.values()}
    with tempfile.TemporaryDirectory(prefix="course_lib_grading_") as tmp:
        tmp = Path(tmp)
        shared = tmp / "shared"  # the kernel's sockets: all the kernel can write of the host's
        shared.mkdir()
        env = {common.GRADED: "1", common.GRADING_SEED: str(secrets.randbelow(10**9))}
        if sandboxed:
            library = student_library(Path(common.__file__).parents[1], tmp / "course_lib")
            data = Path(common.__file__).resolve().parents[2] / "data"
            if data.is_dir():  # a copy: the sandbox's mount table then names no instructor path
                data = Path(shutil.copytree(data, tmp / "data", symlinks=True))
            km = sandboxed_manager(shared, library=library, env=env, hosts=sandbox.hosts(tmp),
                                   limits=limits or sandbox.Limits(),
                                   data=data if data.is_dir() else None)
            start_args = {}
        else:
            from jupyter_client.manager import AsyncKernelManager

            # Unix sockets, as in the sandbox: graders running side by side (--jobs) never
            # race for the same TCP port
            km = AsyncKernelManager(kernel_name="python3", transport="ipc",
                                    ip=str(shared / "kernel"),
                                    connection_file=str(shared / "kernel.json"))
            start_args = dict(cwd=str(source.parent), env={**os.environ, **env})
        client = notebook_client(nb, km, cell_timeout)
        client.shared, client.launchers = (shared if sandboxed else None), set()
        guard = Guard(client, client.shared)
        guard.start()
        start = time.monotonic()
        try:
            failed = _run(client, nb, graded, judges, results, start, timeout,
                          start_args, env[common.GRADING_SEED], skip, guard)
        finally:  # the client does not own a kernel manager it was given: end the kernel
            guard.done.set()
            launcher = getattr(getattr(km.provisioner, "process", None), "pid", None)
            with contextlib.suppress(Exception):
                run_sync(km.shutdown_kernel)(now=True)
            for pid in client.launchers | {launcher} - {None}:  # each restart's too
                sandbox.remove_groups(pid)
            remove_tree(shared)  # what the kernel wrote, before the folder's own cleanup
        for gid in missing:
            results[gid.removesuffix("-solution")]["feedback"] += \
                " (the submission has no solution cell for it: the lesson's stub ran)"
        for result in results.values():
            if wrong and result["score"] < result["points"]:
                result["feedback"] += f" ({wrong})"
        seconds = round(time.monotonic() - start, 1)
        text = json.dumps([[r["feedback"] for r in results.values()], [f["error"] for f in
                                                                     failed]], ensure_ascii=False)
        text = printable(text)  # what a kernel sent may not be UTF-8
        for private in (str(tmp), str(source.resolve().parent), str(Path.home())):
            text = text.replace(private, "…")  # feedback names no path of the grader's
        feedback, errors = json.loads(text)
        for result, line in zip(results.values(), feedback, strict=True):
            result["feedback"] = line
        for f, line in zip(failed, errors, strict=True):
            f["error"] = line
    if keep is not None:  # the executed notebook, outputs capped, for audit
        for i, original in cut.items():  # a cell run in part or not at all says so
            nb.cells[i].metadata["course_lib"] = {"ran": "skipped" if original is None
                                                  else "in part: " + nb.cells[i].source}
            nb.cells[i].source = original if original is not None else nb.cells[i].source
        Path(keep).write_text(nbformat.writes(nb), encoding="utf-8", errors="replace")
    return dict(submission=str(submission), lesson=source.name, exercises=list(results.values()),
                ungraded_errors=failed, score=sum(r["score"] for r in results.values()),
                points=sum(r["points"] for r in results.values()), seconds=seconds, ran=ran,
                **({"warning": wrong} if wrong else {}))


PAST_LIMIT = "not run: the notebook passed its"  # an exercise's feedback after the limit
MAX_REPLAYS = 2  # restarts after which earlier cells are run again; later ones start bare


def _run(client, nb, graded, judges, results, start, timeout, start_args,
         seed, skip, guard) -> list[dict]:
    """Execute the cells in order (but those in ``skip``), judging each check cell's data as
    soon as it has run. Just before a check cell, the kernel gets the seed of its hidden cases
    (new for each, not known before); after every cell its output streams are made whole again.
    Returns the ungraded cells that failed (index and first line of the error).

    A cell that kills its kernel, ignores the interrupt or garbles the kernel's messages gets a
    real restart; the cells before it that ran are run again in the new kernel (on copies: the
    kept notebook shows their first run), so later exercises are graded as if it had not run."""
    from nbclient.exceptions import CellExecutionError, DeadKernelError

    earlier = None  # the last failure of an ungraded cell since the previous graded one
    failed, ran, replays = [], [], 0
    with client.setup_kernel(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             **start_args):
        kernel_pid = pid_of_kernel(client)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or i in skip:
                continue
            gid = graded[i]["grade_id"] if i in graded else None
            if time.monotonic() - start > timeout:
                if gid:
                    results[gid]["feedback"] = f"{PAST_LIMIT} {timeout} s limit"
                continue
            client.check_data.pop(i, None)  # only what this cell sends counts for it
            hidden = str(secrets.randbelow(10**9))
            if gid:
                run_quietly(client, f"import os as _o\n_o.environ[{common.HIDDEN_SEED!r}] = "
                                    f"{hidden!r}\ndel _o")
            why, restart = None, False
            guard.kernel_pid = kernel_pid if client.shared is not None else None
            guard.reason, guard.deadline = None, time.monotonic() + client.timeout + 15
            try:
                client.execute_cell(cell, i)
            except CellExecutionError as error:
                why = _first_line(error)
                if getattr(error, "ename", "") == "CellTimeout" and not responsive(client):
                    why += " (it ignored the interrupt: the kernel was restarted)"
                    restart = True  # only a new kernel frees the next cells
            except DeadKernelError:
                why, restart = "the kernel died", True
            except Exception as error:  # noqa: BLE001 - a kernel whose replies make no sense
                why = f"the kernel stopped answering properly ({type(error).__name__})"
                restart = True
            finally:
                guard.deadline = None
                if kernel_pid:
                    kill_children(kernel_pid)  # workers a cell left behind, escaped ones too
            if guard.reason is not None:  # the guard killed it: say why, not "it died"
                why, restart = guard.reason, True
            if not restart:
                run_quietly(client, RESTORE_STREAMS)
            if restart:
                try:
                    kernel_pid = restart_kernel(client)
                except Exception as error:  # noqa: BLE001 - no kernel to grade the rest in
                    why += f"; no new kernel could be started ({type(error).__name__})"
                    for j in (j for j in graded if j >= i):
                        results[graded[j]["grade_id"]]["feedback"] = "not run: " + why
                    failed.append(dict(cell=i, error=why))
                    break
                if replays < MAX_REPLAYS:
                    replays += 1
                    guard.kernel_pid = pid_of_kernel(client) if client.shared is not None else None
                    if stopped := replay(client, nb, ran, start + timeout, guard):
                        why += f"; earlier cells were run again only in part: {stopped}"
                else:
                    why += "; later cells ran in a new kernel, without what earlier cells made"
                kernel_pid = pid_of_kernel(client)
            if why is not None:
                if gid:
                    before = f" (an earlier cell failed: {earlier})" if earlier else ""
                    results[gid]["feedback"] = why + before
                    earlier = None
                else:
                    earlier = f"cell {i}: {why}"
                    failed.append(dict(cell=i, error=why))
                continue
            ran.append(i)
            if gid:  # the judges draw again what the run drew: with this run's seeds
                with mock.patch.dict(os.environ, {common.GRADING_SEED: seed,
                                                  common.HIDDEN_SEED: hidden}):
                    verdict = judging.judge_data(client.check_data.pop(i, []), judges[i])
                results[gid]["feedback"] = verdict
                if verdict == "correct":
                    results[gid]["score"] = float(results[gid]["points"])
                earlier = None
    return failed


def summary(report: dict) -> str:
    """A report people read: one line per exercise."""
    lines = [f"{report['submission']}: {report['score']:g} / {report['points']:g} points "
             f"({report['seconds']} s)" + (f"; ran {report['ran']}" if "ran" in report else "")]
    if report.get("warning"):
        lines.append(f"  warning: {report['warning']}")
    for r in report["exercises"]:  # one line each, whatever a check's message holds
        lines.append(f"  {r['grade_id']:12s} {r['score']:g}/{r['points']:g}  "
                     f"{' '.join(str(r['feedback']).splitlines())}")
    for f in report.get("ungraded_errors", []):
        lines.append(f"  (cell {f['cell']}, not graded, failed: "
                     f"{' '.join(str(f['error']).splitlines())})")
    return "\n".join(lines)
