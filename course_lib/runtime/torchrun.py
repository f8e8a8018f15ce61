"""The same experiment through ``launch`` on one machine, or under ``torchrun`` on a cluster.

Lecture: "Parallel computing for machine learning", slides part 1 (message passing, one program
on many processors) and the article's workflow: prepare the environment, then run the same code
from a laptop to a cluster.

An experiment is a plain function meant to run on every rank. ``run_experiment`` runs it:

* ``python -m course_lib.<module> --world-size 2``: through :func:`course_lib.launch`;
* ``torchrun --nproc-per-node=N [--nnodes=...] -m course_lib.<module>``: torchrun started the
  processes, so each one joins the process group from the environment torchrun set.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import traceback

import torch
import torch.distributed as dist

from course_lib.runtime.devices import choose_backend, loopback_interface, worker_threads
from course_lib.runtime.errors import WorkerError
from course_lib.runtime.launching import launch
from course_lib.runtime.worker import to_cpu


def launched_by_torchrun() -> bool:
    """True in a process started by torchrun (or any launcher that sets RANK and WORLD_SIZE)
    that has not joined a process group yet."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and not dist.is_initialized()


def init_from_environment(backend: str = "auto") -> str:
    """Join the process group described by torchrun's variables; return the backend used.

    With GPUs for every process of this node, each takes the GPU of its LOCAL_RANK and the group
    is ``"cpu:gloo,cuda:nccl"`` (:mod:`course_lib.runtime.devices`); otherwise gloo. Each process
    computes with the CPU threads :func:`launch` gives a rank (``devices.worker_threads``:
    ``COURSE_LIB_THREADS``, default 1), so both print the same numbers.
    """
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    backend = choose_backend(backend, local_world_size)
    if os.environ.get("WORLD_SIZE") == os.environ.get("LOCAL_WORLD_SIZE"):
        # one node: keep gloo on loopback, whatever the hostname resolves to
        iface = loopback_interface()
        if iface:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
    torch.set_num_threads(worker_threads())
    device_id = None
    if "nccl" in backend:  # this process's GPU; gloo still carries CPU tensors
        device_id = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device_id)
    dist.init_process_group(backend, device_id=device_id)
    return backend


def importable(fn):
    """``fn``, or where it was defined in a module started as ``python -m course_lib.X`` (so its
    module is ``__main__``), the same function imported from course_lib.X: launch then sends it
    to the workers by reference, as any library function, instead of by value."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if (getattr(fn, "__module__", None) != "__main__" or spec is None or not spec.name
            or spec.name.endswith("__main__")):  # a package's __main__: importing it reruns it
        return fn
    return getattr(importlib.import_module(spec.name), fn.__qualname__, fn)


def run_experiment(fn, *, world_size: int = 2, kwargs=None, backend: str = "auto",
                   timeout: float | None = 300):
    """Run ``fn(**kwargs)`` on every rank; return the list of results (index = rank).

    Under torchrun this process is one of the ranks: it joins the group, runs ``fn``, gathers
    every rank's result and returns the list on rank 0 (``None`` on the others). Otherwise it
    starts ``world_size`` workers with :func:`launch`.
    """
    kwargs = {} if kwargs is None else kwargs
    if not launched_by_torchrun():
        return launch(importable(fn), world_size=world_size, kwargs=kwargs, backend=backend,
                      timeout=timeout)
    init_from_environment(backend)
    try:
        result = to_cpu(fn(**kwargs))  # rank 0 may be on another node, or another GPU
        gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(result, gathered, dst=0)
        dist.barrier()
        return gathered
    finally:
        dist.destroy_process_group()


def run_main(main) -> None:
    """A command's ``if __name__ == "__main__":`` block: ``main()``, then, in a process torchrun
    started, exit at once with status 0 once everything printed is flushed.

    Skipping the interpreter's teardown there is what :mod:`course_lib.runtime.worker` does for
    the workers ``launch`` starts: native libraries were seen to abort at exit after distributed
    work (about one run in 40 of the tensor-parallel command: "terminate called without an
    active exception"), which would turn a finished job into a crash. An exception, or a
    ``SystemExit`` from the option parser, propagates as usual.
    """
    main()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and not dist.is_initialized():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def number(kind, least: float = 0, most: float = math.inf, *, above: bool = False):
    """An option's type: a finite ``kind`` (int or float) of at least ``least`` (above it, with
    ``above``) and at most ``most``; anything else is the parser's usage error, naming it."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a "
                                             f"{'whole number' if kind is int else 'number'}"
                                             ) from None
        low = value > least if above else value >= least
        if not (low and value <= most and math.isfinite(value)):
            raise argparse.ArgumentTypeError(
                f"must be {'above' if above else 'at least'} {least:g}"
                + (f" and at most {most:g}" if most < math.inf else "") + f", got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def positive(kind):
    """An option's type: a ``kind`` (int or float) above zero, or the parser's usage error."""
    return number(kind, 0, above=True)


def experiment_parser(description: str) -> argparse.ArgumentParser:
    """Command-line options every experiment module shares (its own are added to the parser)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--world-size", type=positive(int), default=2,
                        help="workers to launch (ignored under torchrun, which decides)")
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    parser.add_argument("--timeout", type=positive(float), default=300,
                        help="seconds before giving up")
    return parser


def check_backend(parser, backend: str, world_size: int) -> None:
    """Outside torchrun, a backend this machine cannot give ``world_size`` ranks (nccl without
    NCCL or GPUs) is the parser's usage error, before any worker starts."""
    if not launched_by_torchrun():
        try:
            choose_backend(backend, world_size)
        except ValueError as why:
            parser.error(str(why))


def run_command(fn, description: str, options, argv=None, *, world_size: int = 2):
    """An experiment's command line: :func:`experiment_parser`'s options plus ``options`` --
    ``(flag, type, default)`` each, or ``(flag, type, default, more)`` with ``more`` a dict for
    ``add_argument`` (``help``, ``choices``), passed to ``fn`` as keyword arguments named after
    the flag (``--local-batch`` -> ``local_batch``) -- then :func:`run_experiment`. A whole
    number must be at least 1 (a ``--seed`` 0), a float at least 0, unless ``more`` says
    ``least``, ``most`` or ``above`` (:func:`number`); a ValueError an experiment raises for its
    arguments is the parser's usage error too. Returns the parsed arguments and the results
    (``None`` on ranks other than 0 under torchrun)."""
    parser = experiment_parser(description)
    parser.set_defaults(world_size=world_size)
    for flag, kind, default, *more in options:
        more = dict(more[0]) if more else {}
        if kind in (int, float):
            least = more.pop("least", 0 if kind is float or flag == "--seed" else 1)
            kind = number(kind, least, more.pop("most", math.inf), above=more.pop("above", False))
        parser.add_argument(flag, type=kind, default=default, **more)
    args = parser.parse_args(argv)
    check_backend(parser, args.backend, args.world_size)
    names = [option[0].lstrip("-").replace("-", "_") for option in options]
    kwargs = {name: getattr(args, name) for name in names}
    try:
        return args, run_experiment(fn, world_size=args.world_size, kwargs=kwargs,
                                    backend=args.backend, timeout=args.timeout)
    except WorkerError as error:  # a rank refused the arguments: a usage error, its traceback
        if error.exc_type != "ValueError":  # above it (a bug may raise a ValueError too)
            raise
        print(error.worker_traceback, file=sys.stderr)
        parser.error(f"rank {error.rank}: {error.exc_message}")
    except ValueError as why:  # under torchrun, this rank's own refusal
        traceback.print_exc()
        parser.error(str(why))

