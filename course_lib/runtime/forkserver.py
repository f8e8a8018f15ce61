"""Warm launches: a fork server that has imported torch, so that a worker starts in milliseconds.

Started by :func:`course_lib.runtime.launching.launch`. A cold worker is a new Python that
imports torch first: about a second and a half of a core for every rank of every launch, and as
much again where DDP or pipelining import ``torch._dynamo``. The fork server pays it once: it
imports torch, ``torch.distributed``, what DDP, FSDP2, DTensor and pipelining import on first
use, numpy, cloudpickle and ``course_lib.runtime``, then waits. For each worker of a launch it
forks a child that runs the worker's code (``worker.main``) exactly as a cold worker would. In
``ps`` and ``top`` the server is ``course_lib fork server (for pid N)``, a worker ``course_lib
worker: rank R of P, FUNCTION``.

What stays as with cold workers (the launch contract):

* every worker is an interpreter that ran nothing before its job: the server never runs a
  job, never computes with torch and never starts a thread, and each child is used once;
* the child gets the launch's environment, its stdin/stdout/stderr are pipes to the launcher
  (EOF on stdin: the launcher is gone, the worker exits), it leads its own session (stopping
  it stops what it started), and numpy's global random state is reseeded as a new process's
  would be (Python's ``random`` reseeds itself after a fork);
* a server that no longer matches -- ``course_lib``'s source edited, an environment variable
  that matters at import time changed (:func:`signature`) -- is replaced before it forks;
* the server exits when its launcher does (its socket closes), or after
  ``COURSE_LIB_FORKSERVER_IDLE_S`` seconds (default 600) without a job.

Linux only: on macOS, forking after system frameworks are loaded is not safe, and Windows has
no fork; there, and with ``COURSE_LIB_LAUNCH=cold``, every launch starts cold.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]
TITLE = "course_lib fork server"  # its process title (with setproctitle): ps, top, cmdline
_READY_TIMEOUT_S = 120  # importing torch on a slow, busy machine


def supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(socket, "send_fds")


# environment variables that can change what importing torch, numpy or course_lib does
_IMPORT_TIME = ("PYTHON", "LD_", "DYLD_", "TORCH", "PYTORCH", "CUDA", "NVIDIA", "NCCL", "GLOO",
                "OMP_", "KMP_", "GOMP_", "MKL", "OPENBLAS", "NUMPY", "HIP", "ROCM", "PATH")


def signature() -> tuple:
    """What a server's preloaded modules were built from: course_lib's files (names, sizes,
    times) and the environment variables that matter at import time. A launch whose signature
    differs gets a new server (the job's whole environment reaches the worker in any case)."""
    files = tuple(sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns)
                         for p in _PACKAGE.rglob("*.py")))
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_IMPORT_TIME)))
    return files, env, sys.executable


# -- the server (python -m course_lib.runtime.forkserver FD) -----------------------------------


def _child(request, fds, sock):
    """In the forked child: become a fresh worker and run the job."""
    sock.close()
    os.setsid()  # its own session, as a cold worker has
    for target, fd in enumerate(fds):  # stdin, stdout, stderr: pipes to the launcher
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    import numpy as np

    np.random.seed()  # a new process's global state, not a copy of the server's
    from course_lib.runtime import worker

    try:
        worker.main(request["jobdir"], request["rank"])
    finally:  # main ends with os._exit; this is for the unforeseen
        os._exit(1)


def serve(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    from course_lib.runtime.worker import set_title

    set_title(f"{TITLE} (for pid {os.getppid()})")  # in ps and top, not "python -m ..."
    # what every worker imports first (numpy is reseeded in each child, see _child), and what
    # DDP and pipelining (torch._dynamo), FSDP2 and DTensor import on first use
    for name in ("cloudpickle", "numpy.random", "torch", "torch._dynamo", "torch.distributed",
                 "torch.distributed.fsdp", "torch.distributed.pipelining",
                 "torch.distributed.tensor", "course_lib.runtime.worker"):
        importlib.import_module(name)

    sock.send(json.dumps({"ready": os.getpid()}).encode())
    idle_s = float(os.environ.get("COURSE_LIB_FORKSERVER_IDLE_S", "600"))
    last_job, children = time.monotonic(), set()
    while True:
        readable, _, _ = select.select([sock], [], [], 0.02)
        while children:  # report every child that ended, as Popen would see it
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            sock.send(json.dumps({"pid": pid,
                                  "returncode": os.waitstatus_to_exitcode(status)}).encode())
        if readable:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
            if not data:  # the launcher is gone
                return
            request = json.loads(data)
            pid = os.fork()
            if pid == 0:
                _child(request, fds, sock)
            for fd in fds:
                os.close(fd)
            children.add(pid)
            last_job = time.monotonic()
            sock.send(json.dumps({"id": request["id"], "pid": pid}).encode())
        elif not children and time.monotonic() - last_job > idle_s:
            return


# -- the launcher's side --------------------------------------------------------------------------


class ForkedWorker:
    """A worker forked by the server, with the part of ``subprocess.Popen`` the launcher uses."""

    def __init__(self, pid, server, stdin, stdout, stderr):
        self.pid, self._server = pid, server
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            self.returncode = self._server.returncode(self.pid)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode


class ForkServer:
    """The launcher's handle on one fork server process."""

    def __init__(self, env: dict):
        self.signature = signature()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "course_lib.runtime.forkserver", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self._sock, self._lock, self._next_id = ours, threading.Lock(), 0
        self._replies, self._exits, self._changed = {}, {}, threading.Condition()
        self._closed = False
        threading.Thread(target=self._read, daemon=True).start()
        with self._changed:
            if not self._changed.wait_for(lambda: "ready" in self._replies or self._closed,
                                          timeout=_READY_TIMEOUT_S) or self._closed:
                self.close()
                raise RuntimeError("the fork server did not start")

    def _read(self):
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                data = b""
            with self._changed:
                if not data:
                    self._closed = True
                    self._changed.notify_all()
                    return
                message = json.loads(data)
                if "returncode" in message:
                    self._exits[message["pid"]] = message["returncode"]
                elif "ready" in message:
                    self._replies["ready"] = message["ready"]
                else:
                    self._replies[message["id"]] = message["pid"]
                self._changed.notify_all()

    def matches(self) -> bool:
        """Alive, and built from the course_lib and environment this launch would use."""
        return not self._closed and self.process.poll() is None and self.signature == signature()

    def start(self, rank: int, jobdir, env: dict) -> ForkedWorker:
        """Fork worker ``rank`` of the job in ``jobdir`` with environment ``env``."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        with self._lock:
            self._next_id += 1
            request_id = self._next_id
            request = dict(id=request_id, rank=rank, jobdir=str(jobdir), env=env)
            try:
                socket.send_fds(self._sock, [json.dumps(request).encode()],
                                [stdin_r, stdout_w, stderr_w])
            finally:
                for fd in (stdin_r, stdout_w, stderr_w):
                    os.close(fd)
            with self._changed:
                self._changed.wait_for(lambda: request_id in self._replies or self._closed,
                                       timeout=30)
                pid = self._replies.pop(request_id, None)
        if pid is None:
            for fd in (stdin_w, stdout_r, stderr_r):
                os.close(fd)
            raise RuntimeError("the fork server did not answer")
        text = dict(encoding="utf-8", errors="replace")
        return ForkedWorker(pid, self, open(stdin_w, "w", **text),
                            open(stdout_r, buffering=1, **text),
                            open(stderr_r, buffering=1, **text))

    def returncode(self, pid):
        with self._changed:
            if pid in self._exits:
                return self._exits.pop(pid)
        if self._closed and not _exists(pid):  # the server died: its report was lost
            return -int(signal.SIGKILL)
        return None

    def close(self):
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass
        try:
            self.process.kill()
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass


def _exists(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_server: ForkServer | None = None
_server_lock = threading.Lock()


def server(env: dict) -> ForkServer | None:
    """The fork server for this launch (started, or replaced, on demand); None when warm
    launches are off or unavailable here."""
    global _server
    if not supported() or os.environ.get("COURSE_LIB_LAUNCH", "warm") == "cold":
        return None
    with _server_lock:
        if _server is not None and not _server.matches():
            _server.close()
            _server = None
        if _server is None:
            try:
                _server = ForkServer(env)
            except (OSError, RuntimeError):
                return None  # warm launches are an optimisation: start cold instead
        return _server


def running() -> ForkServer | None:
    """The fork server this process runs now (its ``process`` is the server's), or None: before
    the first warm launch, after :func:`shutdown`, or where warm launches are off."""
    return _server


def shutdown() -> None:
    """Stop the fork server (it would also stop by itself when this process ends)."""
    global _server
    with _server_lock:
        if _server is not None:
            _server.close()
            _server = None


if __name__ == "__main__":
    serve(int(sys.argv[1]))
