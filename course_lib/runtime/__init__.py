"""The machinery that runs a lesson on real processes, on a laptop, a GPU node or a cluster.

``launching`` starts workers from a notebook cell (``worker`` is the code each one runs first,
``errors`` says what went wrong); ``torchrun`` runs the same experiment under torchrun;
``devices`` holds the one rule for devices and backends; ``machine`` describes this machine;
``timing`` measures honestly and records timelines. (The GPU acceptance script, which runs every
lesson's rank functions, is :mod:`course_lib.benchmarks.gpu_check`: it stands above the lessons.)
"""

from course_lib.runtime.devices import choose_backend, device
from course_lib.runtime.errors import LaunchTimeout, WorkerError
from course_lib.runtime.launching import launch
from course_lib.runtime.timing import Span, Timeline, Timing, measure, synchronize, to_spans

__all__ = ["launch", "device", "choose_backend", "WorkerError", "LaunchTimeout", "Span",
           "Timeline", "Timing", "measure", "synchronize", "to_spans"]
