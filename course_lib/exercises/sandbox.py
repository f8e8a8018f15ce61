"""The grader's sandbox: a submission's kernel sees only what a student may see.

Lecture: none (the homework machinery; ``grading`` starts each submission's kernel here). On
Linux, bubblewrap (``bwrap``, ``apt-get install bubblewrap``) starts the kernel in new
namespaces: its own view of the file system (the system and the Python environment read-only, a
fresh working copy holding the student edition of the lesson and of ``course_lib``, nothing of
the instructor's), no network but its own loopback (the workers of ``launch`` still meet there),
its own process tree (when the sandbox ends, everything the submission started ends with it),
and limits on memory, processes, file sizes and the size of every writable place (tmpfs). The
grader talks to the kernel through Unix sockets in one shared folder, the one place of the host
the kernel can write; it writes nothing there after the kernel has started, and what the checks
send (plain JSON) comes back in the kernel's own messages, judged outside.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

WORK = "/sandbox"  # where the working copy appears inside
INSTALL = "apt-get install bubblewrap (Debian, Ubuntu), dnf install bubblewrap (Fedora)"
CGROUPS = Path("/sys/fs/cgroup")
# what a Python process needs of /etc: the dynamic linker's cache, users and groups by name,
# name service and time zone, alternatives' symbolic links, fonts (matplotlib)
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "passwd", "group",
       "localtime", "alternatives", "fonts", "mime.types")


class SandboxUnavailable(RuntimeError):
    """Untrusted work can't be graded safely here: the message says why and what to do."""


@dataclass(frozen=True)
class Limits:
    """What one submission may use, all its processes together (memory per process where no
    control group can be made)."""

    memory_bytes: int = 8 << 30
    processes: int = 256
    file_bytes: int = 1 << 30  # the largest file it may write: a full disk costs everyone
    disk_bytes: int = 1 << 30  # each writable place (its folder, /tmp, /dev/shm): a tmpfs


def unavailable() -> str | None:
    """Why the sandbox can't run here, or None when it can (bubblewrap found and working)."""
    if sys.platform != "linux":
        return f"the sandbox needs Linux (this is {sys.platform}); grade in a Linux container"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return f"bubblewrap (bwrap) is not installed: {INSTALL}"
    probe = subprocess.run([bwrap, "--unshare-all", "--die-with-parent", *_system_mounts(),
                            "--proc", "/proc", "--dev", "/dev", "true"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return (f"bubblewrap is installed but can't make a sandbox here "
                f"({probe.stderr.strip()[:200]}): allow unprivileged user namespaces, or grade "
                f"inside a container")
    return None


def _system_mounts() -> list[str]:
    """The system, read-only: /usr and friends (symbolic links where /bin -> usr/bin), what a
    process needs of /etc, and the Python installation this grader runs (its prefix and its
    base's)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for name in ETC:  # not all of /etc: the sandbox's user maps to the grader's, secrets too
        if os.path.lexists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    for prefix in sorted({os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix),
                          sys.prefix, sys.base_prefix}):
        if not prefix.startswith("/usr"):
            args += ["--ro-bind", prefix, prefix]
    return args


def hosts(folder: Path) -> Path:
    """The sandbox's host names, written in ``folder`` (one the kernel can't write): itself
    only (c10d looks up ::ffff:127.0.0.1; without it each worker would ask a DNS server it
    can't reach, and warn)."""
    path = Path(folder) / "hosts"
    path.write_text("127.0.0.1 localhost\n::1 localhost\n::ffff:127.0.0.1 localhost\n")
    return path


def command(argv: list[str], *, library: Path, data: Path | None, shared: Path, hosts: Path,
            limits: Limits = Limits(), env: dict[str, str] | None = None) -> list[str]:
    """The command that runs ``argv`` in a sandbox.

    Its working folder ``/sandbox`` (and ``/tmp``, ``/dev/shm``) is a fresh tmpfs of
    ``limits.disk_bytes``, thrown away with it; ``library`` (the student edition of
    ``course_lib``) appears read-only as ``/sandbox/course_lib``, ``data`` read-only as
    ``/sandbox/data``, ``hosts`` as ``/etc/hosts``; ``shared`` (the kernel's sockets) keeps its
    path. The limits are set by a small launcher that then becomes bubblewrap."""
    bwrap = shutil.which("bwrap")
    if bwrap is None or sys.platform != "linux":
        raise SandboxUnavailable(unavailable() or "no sandbox")
    size = ["--size", str(limits.disk_bytes)]
    # the fresh /tmp first: a Python environment under /tmp (a CI checkout) is mounted on it
    mounts = ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/tmp",
              *size, "--tmpfs", "/dev/shm", *_system_mounts(), *size, "--tmpfs", WORK,
              "--dir", f"{WORK}/notebooks", "--ro-bind", str(library), f"{WORK}/course_lib",
              "--bind", str(shared), str(shared), "--ro-bind", str(hosts), "/etc/hosts"]
    if data is not None:
        mounts += ["--ro-bind", str(data), f"{WORK}/data"]
    variables = {"HOME": "/tmp", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                 "PYTHONPATH": WORK, "LANG": "C.UTF-8", "MPLBACKEND": "agg",
                 **{k: v for k, v in os.environ.items() if k.startswith("COURSE_LIB_")},
                 **(env or {})}
    setenv = [a for k, v in variables.items() for a in ("--setenv", k, v)]
    box = [bwrap, "--unshare-all", "--hostname", "localhost", "--die-with-parent",
           "--new-session", "--cap-drop", "ALL", *mounts, "--clearenv", *setenv,
           "--chdir", f"{WORK}/notebooks", "--", *argv]
    return [sys.executable, "-I", "-c", _LAUNCHER, json.dumps(asdict(limits)), *box]


# Runs outside the sandbox, just before it starts: join a control group of its own when one can
# be made (root, cgroup v1 or v2), set resource limits (these hold for an unprivileged user;
# root is exempt from the process count, hence the group), then become bubblewrap.
_LAUNCHER = r"""
import json, os, resource, sys
limits = json.loads(sys.argv[1])
grouped = False
for memory, pids in [("memory", "pids"), ("unified", "unified")]:
    base = "/sys/fs/cgroup/"
    try:
        name = f"course_lib_grader_{os.getpid()}"
        mem, pid = base + memory + "/" + name, base + pids + "/" + name
        for d in {mem, pid}:
            os.makedirs(d, exist_ok=True)
        if memory == "unified":
            open(mem + "/memory.max", "w").write(str(limits["memory_bytes"]))
            open(pid + "/pids.max", "w").write(str(limits["processes"]))
        else:
            open(mem + "/memory.limit_in_bytes", "w").write(str(limits["memory_bytes"]))
            open(pid + "/pids.max", "w").write(str(limits["processes"]))
        for d in {mem, pid}:
            open(d + "/cgroup.procs", "w").write(str(os.getpid()))
        grouped = True
        break
    except OSError:
        continue
if not grouped:  # no group: memory per process, and the process count of this user
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)
resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2)
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
# bubblewrap is process 1 in the sandbox, its environment readable there: it gets none of ours
os.execve(sys.argv[2], sys.argv[2:], {"PATH": "/usr/bin:/bin"})
"""


def remove_groups(pid: int) -> None:
    """Kill what is left in the control groups the launcher with ``pid`` made, and remove them
    (a group that still holds processes can't be removed: it is tried again for up to 2 s while
    the killed processes die)."""
    import time

    name = f"course_lib_grader_{pid}"
    for base in ("memory", "pids", "unified"):
        group = CGROUPS / base / name
        for _ in range(20):
            if not group.is_dir():
                break
            try:
                for line in (group / "cgroup.procs").read_text().split():
                    try:
                        os.kill(int(line), 9)
                    except ProcessLookupError:
                        pass
                group.rmdir()
            except OSError:
                time.sleep(0.1)  # still emptying: the processes are dead or dying

