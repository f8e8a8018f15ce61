"""The first code a worker process runs: ``python -m course_lib.runtime.worker JOBDIR RANK``.

Started by :func:`course_lib.runtime.launching.launch`. It joins the process group through the
store the launcher holds, runs the job and leaves its result (or its error) in JOBDIR for the
launcher.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from pathlib import Path


def _exit_when_parent_dies(fd: int):
    """``fd`` is our stdin, a pipe the launcher holds open; EOF means the launcher is gone (a
    restarted kernel, a killed notebook), so no worker outlives it. It reads the raw descriptor,
    not ``sys.stdin``: a thread blocked in ``sys.stdin.buffer.read()`` holds that buffer's lock,
    and a child forked meanwhile (a DataLoader worker, ``multiprocessing``'s "fork") would hang
    when it closes its copy of ``sys.stdin``."""
    while os.read(fd, 4096):
        pass
    os._exit(70)


def set_title(title: str) -> None:
    """Show ``title`` as this process's command line in ``ps``, ``top`` and /proc/PID/cmdline
    (with the ``setproctitle`` package; without it, the command line stays as it was)."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        return
    setproctitle(title)


def _name(fn) -> str:
    fn = getattr(fn, "func", fn)  # a functools.partial shows the function it wraps
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def to_cpu(value):
    """Move tensors to the CPU so the launcher can unpickle results without touching a GPU."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(to_cpu(v) for v in value)
    if type(value) is dict:
        return {k: to_cpu(v) for k, v in value.items()}
    return value


def _write(path: Path, data: bytes):
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)  # the launcher never reads a half-written file


def _error_record(exc: BaseException) -> dict:
    frames = [(f.filename, f.lineno, f.name, f.line)
              for f in traceback.extract_tb(exc.__traceback__)
              if f.filename != __file__]  # the student's frames, not the launcher's
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    return dict(type=name, message=str(exc), frames=frames,
                exception_only=traceback.format_exception_only(kind, exc), time=time.time())


def main(jobdir: str, rank: int) -> None:
    jobdir = Path(jobdir)
    title = f"course_lib worker: rank {rank} of {os.environ.get('WORLD_SIZE', '?')}"
    set_title(title)  # forked or new, a worker shows what it is, not the fork server's title
    watched = os.dup(sys.stdin.fileno())  # our own: fn may close or reuse fd 0
    threading.Thread(target=_exit_when_parent_dies, args=(watched,), daemon=True).start()
    if hasattr(signal, "SIGUSR1"):  # the launcher asks "where are you?" before a timeout kill
        stack_file = open(jobdir / f"stack-{rank}.txt", "w")
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    settings = pickle.loads((jobdir / "settings.pkl").read_bytes())
    sys.path[:] = settings["sys_path"] + [p for p in sys.path if p not in settings["sys_path"]]
    os.chdir(settings["cwd"])
    try:
        import cloudpickle
        import torch
        import torch.distributed as dist

        torch.set_num_threads(settings["threads"])
        torch.set_num_interop_threads(1)
        fn, args, kwargs = cloudpickle.loads((jobdir / "job.pkl").read_bytes())
        set_title(f"{title}, {_name(fn)}")
        timeout = datetime.timedelta(seconds=settings["timeout_s"])
        world_size = int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              world_size, is_master=False, timeout=timeout)
        device_id = None
        if "nccl" in settings["backend"]:  # this rank's GPU; gloo still carries CPU tensors
            device_id = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device_id)
        dist.init_process_group(settings["backend"], store=store, rank=rank,
                                world_size=world_size, timeout=timeout, device_id=device_id)
        result = fn(*args, **kwargs)
        try:
            payload = cloudpickle.dumps(to_cpu(result))
        except Exception as err:
            raise TypeError(f"fn returned a {type(result).__name__} that can't be sent back to "
                            f"the launcher ({err}); return plain data or tensors") from err
        _write(jobdir / f"result-{rank}.pkl", payload)
        # wait for every rank to return from fn, through the store, not a collective: a rank
        # left in a barrier of fn's own must not pair with ours (it waits, and the launcher's
        # timeout names it), and fn may have torn the group down itself
        store.set(f"returned/{rank}", "1")
        store.wait([f"returned/{r}" for r in range(world_size)])
        if dist.is_initialized():
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the launcher
        if isinstance(exc, SystemExit):
            exc = RuntimeError(f"fn called sys.exit({exc.code!r}); return from fn instead")
        _write(jobdir / f"error-{rank}.pkl", pickle.dumps(_error_record(exc)))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: native libraries were seen to abort at exit after distributed
    # work, which would turn a finished job into a "crash"
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
