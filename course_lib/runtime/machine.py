"""What this machine offers for parallel training: cores, GPUs, distributed backends.

Lecture: slides part 1 ("why parallel": processors, memory, communication). The first notebook
starts here so every measurement that follows can be read against the hardware it ran on.
"""

from __future__ import annotations

import os
import platform

import psutil
import torch
import torch.distributed as dist

from course_lib.runtime.devices import choose_backend, gpu_count, usable_cores, worker_threads


def use_threads(threads: int | None = None) -> int:
    """Set how many threads torch uses for this process's own computations (the notebook's
    kernel; workers set theirs when they start) and return it.

    The kit's default is one (``COURSE_LIB_THREADS`` changes it), set when ``course_lib`` is
    imported; every worker of ``launch`` gets the same, whatever the world size
    (:func:`course_lib.runtime.devices.worker_threads`). The lessons' models are small: a
    second thread gains little on an idle machine, and when another process keeps a core busy
    (a browser, a second kernel, a shared CI runner) torch's threads wait for each other at
    every operation, and a lesson measured at 16 s took 350 s. Lesson 00 measures this on your
    machine.
    """
    threads = worker_threads(threads)  # the one rule, which launch's workers follow too
    torch.set_num_threads(threads)
    return threads


def describe_machine() -> dict:
    """Cores, memory, GPUs and the backends torch.distributed can use here."""
    gpus = []
    for i in range(gpu_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append(dict(index=i, name=props.name, memory_gib=props.total_memory / 2**30))
    return dict(
        python=platform.python_version(),
        torch=torch.__version__,
        system=f"{platform.system()} {platform.machine()}",
        logical_cores=os.cpu_count(),
        physical_cores=psutil.cpu_count(logical=False),
        usable_cores=usable_cores(),
        memory_gib=psutil.virtual_memory().total / 2**30,
        gpus=gpus,
        backends={name: available() for name, available in (
            ("gloo", dist.is_gloo_available), ("nccl", dist.is_nccl_available),
            ("mpi", dist.is_mpi_available))},
        launch_backend_for_1=choose_backend("auto", 1),
        launch_backend_for_2=choose_backend("auto", 2),
        threads_per_worker=worker_threads(),
    )


def format_machine(info: dict) -> str:
    """A short human-readable report of :func:`describe_machine`."""
    gpus = ", ".join(f"cuda:{g['index']} {g['name']} ({g['memory_gib']:.0f} GiB)"
                     for g in info["gpus"]) or "none"
    backends = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in info["backends"].items())
    return "\n".join([
        f"Python {info['python']}, PyTorch {info['torch']}, {info['system']}",
        f"CPU cores: {info['usable_cores']} usable ({info['logical_cores']} logical, "
        f"{info['physical_cores']} physical); memory {info['memory_gib']:.1f} GiB",
        f"GPUs: {gpus}",
        f"torch.distributed backends: {backends}",
        f"launch(fn, world_size=1) would use {info['launch_backend_for_1']}; world_size=2 "
        f"{info['launch_backend_for_2']}; {info['threads_per_worker']} CPU thread(s) per worker "
        f"at every world size (COURSE_LIB_THREADS, or launch(..., threads=k))",
    ])
