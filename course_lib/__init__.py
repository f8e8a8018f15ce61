"""course_lib: the tested helpers behind the course notebooks.

Start with :func:`launch`, which runs a function on real torch.distributed worker processes.
"""

from course_lib.launching import LaunchTimeout, WorkerError, launch

__all__ = ["launch", "WorkerError", "LaunchTimeout"]
