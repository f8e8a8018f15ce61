"""Launch real torch.distributed workers from a notebook cell.

Lecture: "Parallel computing for machine learning", slides part 1 (message passing between
processes). Every lesson that says "workers run in parallel" starts them here.

``launch(fn, world_size)`` starts ``world_size`` fresh Python interpreters (never a fork of
this process; on Linux, children of a fork server that has only imported torch), joins them
into one process group and returns what each rank's ``fn`` returned. It is written
against the ways notebook launchers fail elsewhere:

* ``fn`` travels by value (cloudpickle), so a function defined in a notebook cell works and the
  workers never re-import ``__main__``;
* the rendezvous store is created here, on loopback, on a port the kernel picks: nothing to
  collide with when a cell is re-run or two launches overlap;
* every rank computes with the same threads at any world size: 1 and p ranks time alike;
* worker output is printed in the calling cell, each line prefixed with its rank;
* this process watches every worker: the first failure, a timeout or Ctrl-C stops them all, and
  the error says which rank, what happened and what to do.
"""

from __future__ import annotations

import datetime
import os
import pickle
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
import warnings
from collections import ChainMap
from io import BytesIO
from pathlib import Path

import cloudpickle
import torch.distributed as dist

from course_lib.runtime import forkserver
from course_lib.runtime.devices import (
    choose_backend,
    loopback_interface,
    usable_cores,
    worker_threads,
)
from course_lib.runtime.errors import cause_first, describe_failure, dump_stacks, timeout_error

LOOPBACK = "127.0.0.1"
_POLL_S = 0.02  # how often the supervisor looks at the workers
_GRACE_S = 0.3  # after a first failure, how long to wait for the root cause to surface
_COLLECTIVE_MARGIN_S = 60.0  # how much longer a rank's collective waits than launch's timeout


# -- checks and packing, before any process starts -----------------------------------------

def _check_arguments(fn, world_size, args, kwargs, timeout):
    if not callable(fn):
        raise TypeError(f"fn must be callable (a function to run on every rank), got "
                        f"{type(fn).__name__}: {fn!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int (the number of worker processes), "
                         f"got {world_size!r}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of positional arguments, got {type(args).__name__}"
                        f" (for one argument write args=(x,))")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise TypeError(f"kwargs must be a dict with str keys, got {kwargs!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout < float("inf")):
        raise ValueError(f"timeout must be positive and finite (seconds) or None, got {timeout!r}")


def _code_with_filename(code_args, filename):
    return types.CodeType(*code_args).replace(co_filename=filename)


def _reduce_code_keeping_filename(code):
    ctor, code_args = cloudpickle.Pickler.dispatch_table[types.CodeType](code)
    if ctor is not types.CodeType:  # pragma: no cover - a cloudpickle we do not know
        return ctor, code_args
    return _code_with_filename, (code_args, code.co_filename)


class _JobPickler(cloudpickle.Pickler):
    """cloudpickle, keeping the file name of code sent by value: a worker's traceback then points
    at the notebook cell, and the launcher can show the cell's source line."""

    dispatch_table = ChainMap({types.CodeType: _reduce_code_keeping_filename},
                              cloudpickle.Pickler.dispatch_table)


def _dumps(obj) -> bytes:
    buffer = BytesIO()
    _JobPickler(buffer).dump(obj)
    return buffer.getvalue()


def _pickle_job(fn, args, kwargs) -> bytes:
    """Pickle (fn, args, kwargs) by value; on failure, name the piece that can't travel."""
    try:
        return _dumps((fn, tuple(args), kwargs))
    except Exception:  # find the culprit below
        pass
    pieces = [("fn", fn)] + [(f"args[{i}]", a) for i, a in enumerate(args)]
    pieces += [(f"kwargs[{k!r}]", v) for k, v in kwargs.items()]
    for name, value in pieces:
        try:
            _dumps(value)
        except Exception as err:
            raise TypeError(
                f"{name} ({type(value).__name__}) can't be sent to the workers: "
                f"{type(err).__name__}: {err}. Everything passed to launch is pickled and copied "
                f"into each worker process; pass plain data (numbers, tensors, lists, dicts) and "
                f"create locks, open files, sockets or process groups inside fn.") from err
    raise TypeError("the job (fn, args, kwargs) can't be pickled for the workers")


# -- the workers ---------------------------------------------------------------------------------

def _base_env():
    """This process's environment, for a Python that must import this very course_lib
    (installed or not) and write its output unbuffered."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    package_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    return env


def _worker_env(rank, world_size, port, threads):
    env = _base_env()
    env.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0", ROLE_RANK=str(rank),
        ROLE_WORLD_SIZE=str(world_size), MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port),
        OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), MPLBACKEND="Agg",
    )
    iface = loopback_interface()
    if iface and "GLOO_SOCKET_IFNAME" not in os.environ:
        env["GLOO_SOCKET_IFNAME"] = iface  # gloo must not pick an interface from the hostname
    return env


def _start_worker(rank, jobdir, env, server=None):
    """Worker ``rank``: forked by the fork server when there is one (a warm start, see
    ``forkserver``), else a new interpreter (a cold start)."""
    if server is not None:
        try:
            return server.start(rank, jobdir, env)
        except (OSError, RuntimeError):
            pass  # the server is gone: this worker starts cold
    return subprocess.Popen(
        [sys.executable, "-m", "course_lib.runtime.worker", str(jobdir), str(rank)],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, encoding="utf-8", errors="replace", bufsize=1,
        # own process group: Ctrl-C in the notebook reaches us, not them, and stopping the group
        # also stops anything a worker started (DataLoader workers, ...)
        start_new_session=(os.name == "posix"),
    )


def _pump(rank, stream_name, stream, lines):
    for line in stream:
        lines.put((rank, stream_name, line))
    stream.close()


def _print_lines(lines: queue.Queue):
    """Print queued worker lines from the calling thread, so they land in the calling cell."""
    while True:
        try:
            rank, stream_name, line = lines.get_nowait()
        except queue.Empty:
            return
        out = sys.stdout if stream_name == "stdout" else sys.stderr
        out.write(f"[rank {rank}] {line if line.endswith(chr(10)) else line + chr(10)}")
        out.flush()


def _stop(procs):
    """Kill every worker (and its process group) and reap it: nothing is left behind."""
    for proc in procs:
        try:
            if os.name == "posix":
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        except (ProcessLookupError, PermissionError, OSError):
            pass
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass
        if proc.stdin:
            proc.stdin.close()


# -- the supervisor ------------------------------------------------------------------------------

def _supervise(procs, jobdir, timeout, lines):
    world_size = len(procs)
    deadline = None if timeout is None else time.monotonic() + timeout
    first_failure = None
    while True:
        _print_lines(lines)
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes)
                  if c is not None and (c != 0 or not Path(jobdir, f"result-{r}.pkl").exists())]
        if failed and first_failure is None:
            first_failure = time.monotonic()
        if failed and (time.monotonic() - first_failure > _GRACE_S or all(
                c is not None for c in codes)):
            # the earliest error is the cause; later ones are usually peers losing their link
            described = cause_first([describe_failure(r, procs[r], jobdir) for r in failed])
            error = described[0][1]
            others = [e.rank for _, e in described[1:]]
            if others:
                error.args = (error.args[0] + f"\n\n(rank(s) {', '.join(map(str, others))} "
                              f"failed after it, most likely as a consequence.)",)
            raise error
        if all(c == 0 for c in codes):
            return [cloudpickle.loads(Path(jobdir, f"result-{r}.pkl").read_bytes())
                    for r in range(world_size)]
        if deadline is not None and time.monotonic() > deadline:
            running = [r for r, c in enumerate(codes) if c is None]
            returned = [r for r in running if Path(jobdir, f"result-{r}.pkl").exists()]
            raise timeout_error(timeout, running, returned, world_size,
                                 dump_stacks(procs, running, jobdir))
        time.sleep(_POLL_S)


def launch(fn, world_size: int = 2, args=(), kwargs=None, backend: str = "auto",
           timeout: float | None = 300, warm: bool = True, threads: int | None = None):
    """Run ``fn(*args, **kwargs)`` on ``world_size`` worker processes; return their results.

    Inside ``fn`` the default process group is initialised (``dist.get_rank()``,
    ``dist.get_world_size()`` work) and RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    are set as torchrun sets them. ``backend="auto"`` gives every rank a GPU (rank r on cuda:r,
    a ``"cpu:gloo,cuda:nccl"`` group) when there are at least ``world_size`` GPUs, else gloo on
    the CPU; ``course_lib.runtime.device()`` tells ``fn`` which (see ``devices``).

    Returns the list of return values, index = rank. Raises ``WorkerError`` when a rank raises,
    exits or dies, ``LaunchTimeout`` when ranks are still running after ``timeout`` seconds
    (``None``: no limit) and re-raises ``KeyboardInterrupt``; in every case all workers are
    stopped first.

    ``warm`` (on Linux): the workers are forked by a fork server that has already imported
    torch, so a launch starts in a fraction of a second; each worker is still an interpreter
    that ran nothing before (see ``forkserver``). ``warm=False``, or ``COURSE_LIB_LAUNCH=cold``
    in the environment, starts every worker as a new Python, as on other systems.

    ``threads``: the CPU threads of every rank; ``None``: ``COURSE_LIB_THREADS`` (default 1,
    the kernel's own rule) at every world size, so that timings compare ranks, not threads. A
    warning says when ``world_size x threads`` exceeds the cores.
    """
    kwargs = {} if kwargs is None else kwargs
    _check_arguments(fn, world_size, args, kwargs, timeout)
    backend = choose_backend(backend, world_size)
    job = _pickle_job(fn, args, kwargs)
    threads, cores = worker_threads(threads), usable_cores()
    if world_size * threads > cores:
        each = f" x {threads} threads" if threads > 1 else ""  # "3 workers on 2 CPU core(s)"
        warnings.warn(f"{world_size} workers{each} on {cores} CPU core(s): oversubscribed. "
                      f"Results are correct, but times measure contention, not speedup.",
                      RuntimeWarning, stacklevel=2)
    store_timeout = datetime.timedelta(seconds=timeout if timeout is not None else 24 * 3600)
    # The store lives here, on a port the kernel chose, until every worker is gone: no race
    # between "find a free port" and "use it", and no fixed port to collide with.
    store = dist.TCPStore(LOOPBACK, 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=store_timeout)
    with tempfile.TemporaryDirectory(prefix="course_lib-launch-") as jobdir:
        settings = dict(sys_path=list(sys.path), cwd=os.getcwd(), backend=backend, threads=threads,
                        # the ranks' own collectives wait longer than the launch does, so that
                        # its timeout (which reports where each rank was) always comes first
                        timeout_s=store_timeout.total_seconds() + _COLLECTIVE_MARGIN_S)
        Path(jobdir, "settings.pkl").write_bytes(pickle.dumps(settings))
        Path(jobdir, "job.pkl").write_bytes(job)
        procs, pumps = [], []
        lines: queue.Queue = queue.Queue()
        server = forkserver.server(_base_env()) if warm else None
        try:
            for rank in range(world_size):
                proc = _start_worker(rank, jobdir, _worker_env(rank, world_size, store.port,
                                                               threads), server)
                procs.append(proc)
                for name in ("stdout", "stderr"):
                    pump = threading.Thread(target=_pump, daemon=True,
                                            args=(rank, name, getattr(proc, name), lines))
                    pump.start()
                    pumps.append(pump)
            return _supervise(procs, jobdir, timeout, lines)
        finally:
            _stop(procs)
            for pump in pumps:  # the workers are gone: their last lines are on the way
                pump.join(timeout=2)
            _print_lines(lines)
            del store
