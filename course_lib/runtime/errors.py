"""What went wrong on a worker, in words: the errors ``launch`` raises and how they are built.

Lecture: slides part 1 (message passing: a worker that fails or waits forever stops everyone).
Every message names the rank, what happened and what to do.
"""

from __future__ import annotations

import linecache
import os
import pickle
import signal
import time
from pathlib import Path


class WorkerError(RuntimeError):
    """A worker raised, exited non-zero or died from a signal.

    Attributes: ``rank``; ``exc_type`` and ``exc_message`` (when it raised); ``worker_traceback``
    (the worker's traceback text); ``exitcode`` (when it exited); ``signal_name`` (when killed).
    """

    def __init__(self, message, *, rank, exc_type=None, exc_message=None,
                 worker_traceback=None, exitcode=None, signal_name=None):
        super().__init__(message)
        self.rank = rank
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.worker_traceback = worker_traceback
        self.exitcode = exitcode
        self.signal_name = signal_name


class LaunchTimeout(TimeoutError):
    """The workers did not all finish within ``timeout`` seconds; ``ranks``: those whose processes
    were still running (in fn, or done with it and waiting for the others)."""

    def __init__(self, message, *, ranks, timeout, stacks=None):
        super().__init__(message)
        self.ranks = ranks
        self.timeout = timeout
        self.stacks = stacks or {}


def format_worker_traceback(record) -> str:
    """The worker's traceback, with source lines filled in from this process when the worker had
    none (a function defined in a notebook cell: only the kernel knows the cell's text)."""
    lines = ["Traceback (most recent call last):\n"]
    for filename, lineno, name, line in record["frames"]:
        line = line or linecache.getline(filename, lineno).strip()
        lines.append(f'  File "{filename}", line {lineno}, in {name}\n')
        if line:
            lines.append(f"    {line}\n")
    return "".join(lines) + "".join(record["exception_only"])


def _signal_name(returncode):
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


_SIGNAL_HINTS = {
    "SIGSEGV": "a crash in native code (segmentation fault)",
    "SIGKILL": "killed from outside; often the out-of-memory killer: use less memory per worker",
    "SIGABRT": "aborted by native code (a failed C++ check or 'terminate called ...')",
    "SIGBUS": "a memory access error in native code (is /dev/shm full?)",
}


def describe_failure(rank, proc, jobdir):
    """Build the WorkerError for a worker that is not running and did not succeed."""
    error_file = Path(jobdir, f"error-{rank}.pkl")
    if error_file.exists():
        record = pickle.loads(error_file.read_bytes())
        tb = format_worker_traceback(record)
        return record["time"], WorkerError(
            f"rank {rank} raised {record['type']}: {record['message']}\n\n"
            f"Worker traceback (rank {rank}):\n{tb.rstrip()}",
            rank=rank, exc_type=record["type"], exc_message=record["message"],
            worker_traceback=tb, exitcode=proc.returncode)
    now = time.time()
    rc = proc.returncode
    if rc is not None and rc < 0:
        name = _signal_name(rc)
        hint = _SIGNAL_HINTS.get(name, "stopped by a signal")
        return now, WorkerError(f"rank {rank} died from signal {name} ({-rc}): {hint}.",
                                rank=rank, exitcode=rc, signal_name=name)
    what = ("exited with code 0 without returning a result" if rc == 0
            else f"exited with code {rc}")
    return now, WorkerError(
        f"rank {rank} {what}: fn (or code it called) ended the process with sys.exit or "
        f"os._exit before returning. Return from fn instead of exiting.",
        rank=rank, exitcode=rc)


# what a rank says when a peer died under it (gloo, NCCL, sockets): a consequence, not a cause
LOST_PEER = ("Connection closed by peer", "remote worker crashing", "Connection reset by peer",
             "Broken pipe", "remote process exited")


def lost_a_peer(error: WorkerError) -> bool:
    """Whether ``error`` is a rank reporting that a peer went away."""
    return bool(error.exc_message) and any(s in error.exc_message for s in LOST_PEER)


def cause_first(described):
    """(time, WorkerError) pairs ordered so that the likely cause comes first: a rank that died
    or raised on its own before ranks that only lost a peer (a death is timed when it is seen,
    after the peer's report of it), then by time."""
    return sorted(described, key=lambda pair: (lost_a_peer(pair[1]), pair[0]))


def dump_stacks(procs, running, jobdir, wait: float = 5.0):
    """Ask each stuck worker where it is (faulthandler on SIGUSR1) and read the answers, waiting
    up to ``wait`` seconds for them (on a loaded machine a worker may be scheduled late)."""
    if not hasattr(signal, "SIGUSR1"):
        return {}
    for rank in running:
        try:
            os.kill(procs[rank].pid, signal.SIGUSR1)
        except OSError:
            pass

    def read(rank):
        path = Path(jobdir, f"stack-{rank}.txt")
        return path.read_text(errors="replace") if path.exists() else ""

    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not all(
            read(r).strip() or procs[r].poll() is not None for r in running):
        time.sleep(0.1)
    time.sleep(0.2)  # a dump seen begun is given the time to end
    return {rank: _main_thread_stack(text) for rank in running if (text := read(rank)).strip()}


def _main_thread_stack(dump: str) -> str:
    """From a faulthandler dump keep the thread that runs fn, without the launcher's frames."""
    block = dump.split("Current thread", 1)[-1].splitlines()[1:]
    keep = [line for line in block if line.strip() and "course_lib/_worker.py" not in line
            and "<frozen runpy>" not in line]
    return "\n".join(keep) or dump.strip()


def timeout_error(timeout, running, returned, world_size, stacks):
    """The LaunchTimeout for ranks still ``running`` after ``timeout`` s (``returned``: those of
    them that had returned from fn and wait for the others in the launcher's closing wait)."""
    def names(ranks):
        return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))

    in_fn = [r for r in running if r not in returned]
    waiting = [r for r in running if r in returned]
    done = sorted(set(range(world_size)) - set(running))
    state = [f"{names(in_fn)} still in fn"] if in_fn else []
    if waiting:
        state.append(f"{names(waiting)} returned from fn and waited for the others (the "
                     f"launcher's closing wait, not a collective)")
    if done:
        state.append(f"{names(done)} finished")
    where = "".join(f"\n\nWhere rank {r} was (most recent call first):\n{stacks[r]}"
                    for r in in_fn if r in stacks)
    return LaunchTimeout(
        f"launch timed out after {timeout:g} s: {'; '.join(state)}. A rank waiting in a "
        f"collective usually means another rank never called the same collective, or called a "
        f"different one; a rank in an endless loop never returns. If the work is simply long, "
        f"pass a larger timeout=.{where}",
        ranks=list(running), timeout=timeout, stacks=stacks)
