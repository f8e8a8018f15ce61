"""Guarding the grader's kernel from outside: the processes a cell left behind (those that
left the kernel's process tree too), a cell that never lets the grader's own timeout fire, and a
kernel that fills the one host folder it can write.

Lecture: none (the homework machinery; ``grading`` and ``kernels`` use these).
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import threading
import time
from pathlib import Path

import psutil


def kill_children(pid):
    """Kill what the kernel ``pid`` started, except the fork server of warm launches (it lives
    as long as the kernel by design, and every launch would pay its start again; in the sandbox
    it ends with the sandbox) -- and, in the sandbox, every other process of its process
    namespace but the kernel and the sandbox's own: those that left the kernel's tree too."""
    try:
        kernel = psutil.Process(pid)
        children = kernel.children(recursive=True) + _escaped(kernel)
    except psutil.NoSuchProcess:
        return
    keep = set()
    for child in children:
        try:
            if child.ppid() == pid and "course_lib.runtime.forkserver" in " ".join(child.cmdline()):
                keep.add(child.pid)
        except psutil.Error:
            pass
    for child in children:
        if child.pid in keep:
            continue
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def _escaped(kernel) -> list:
    """The processes of the kernel's pid namespace (when it has one of its own, as in the
    sandbox) that are neither the kernel, its ancestors, nor its descendants: double-forked
    processes that left its tree."""
    try:
        space = os.readlink(f"/proc/{kernel.pid}/ns/pid")
        if space == os.readlink("/proc/self/ns/pid"):
            return []  # not sandboxed: its namespace is the grader's own
        ours = {kernel.pid, *(p.pid for p in kernel.parents()),
                *(p.pid for p in kernel.children(recursive=True))}
    except (OSError, psutil.Error):
        return []
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid not in ours and os.readlink(f"/proc/{process.pid}/ns/pid") == space:
                found.append(process)
        except OSError:
            continue
    return found


WRITABLE = ("/sandbox", "/tmp", "/dev/shm")  # the sandbox's tmpfs, seen through /proc


class Guard(threading.Thread):
    """Watches the kernel from outside, twice a second: when a cell runs past ``deadline`` (a
    kernel that floods the grader with messages never lets the client's own timeout fire), the
    kernel has put more than ``max_bytes`` or ``max_files`` into ``shared`` (its sockets'
    folder, on the host's disk), or more than ``max_inodes`` files into one of its tmpfs (their
    size has a limit of its own, their number none), it kills the kernel and says why in
    ``reason``. ``kernel_pid``: the kernel to look into (None: not sandboxed)."""

    def __init__(self, client, shared: Path | None, max_bytes: int = 64 << 20,
                 max_files: int = 1000, max_inodes: int = 100_000):
        super().__init__(daemon=True)
        self.client, self.shared, self.max_bytes, self.max_files = (client, shared, max_bytes,
                                                                    max_files)
        self.max_inodes, self.kernel_pid = max_inodes, None
        self.deadline, self.reason, self.done = None, None, threading.Event()

    def run(self):
        while not self.done.wait(0.5):
            why = None
            if self.deadline is not None and time.monotonic() > self.deadline:
                why = "it ran past the grader's hard limit (the kernel was killed)"
            elif self.shared is not None and _over(self.shared, self.max_bytes, self.max_files):
                why = (f"the kernel wrote more than {self.max_bytes >> 20} MB or "
                       f"{self.max_files} files into its sockets' folder (it was killed)")
            elif self.shared is not None and (place := self._crowded()):
                why = (f"the kernel made more than {self.max_inodes} files in {place} "
                       f"(it was killed)")
            if why is not None:
                self.reason, self.deadline = why, None
                kill_kernel(self.client)

    def _crowded(self) -> str | None:
        """The first of the sandbox's tmpfs holding more than ``max_inodes`` files, if any."""
        for place in WRITABLE if self.kernel_pid else ():
            with contextlib.suppress(OSError):
                seen = os.statvfs(f"/proc/{self.kernel_pid}/root{place}")
                if seen.f_files - seen.f_ffree > self.max_inodes:
                    return place
        return None


def _over(folder: Path, max_bytes: int, max_files: int) -> bool:
    """Whether ``folder`` holds more than ``max_bytes`` or ``max_files`` (links not followed)."""
    size, files, todo = 0, 0, [folder]
    while todo:
        with contextlib.suppress(OSError), os.scandir(todo.pop()) as entries:
            for entry in entries:
                files += 1
                if files > max_files:
                    return True
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
                else:
                    with contextlib.suppress(OSError):
                        size += entry.stat(follow_symlinks=False).st_size
                if size > max_bytes:
                    return True
    return False


def remove_tree(path: Path) -> None:
    """Remove ``path`` and all below it, however deep (a kernel can nest folders past Python's
    recursion limit, where ``shutil.rmtree`` of Python 3.11 fails): ``rm -rf``, which walks the
    tree without recursing and follows no link."""
    subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def clean_sockets_folder(folder: Path) -> None:
    """Remove what a dead kernel left in its sockets' folder but the connection file and the
    sockets themselves (nothing is followed: links go, not what they point to)."""
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name == "kernel.json" and entry.is_file(follow_symlinks=False):
                continue
            if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                continue
            if entry.is_dir(follow_symlinks=False):
                remove_tree(Path(entry.path))
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def kill_kernel(client) -> None:
    """Kill the kernel's whole process tree (in the sandbox: the sandbox), whatever it is doing:
    the grader's last resort, when it stops answering within any limit."""
    try:
        top = psutil.Process(client.km.provisioner.process.pid)
        for process in [*top.children(recursive=True), top]:
            with contextlib.suppress(psutil.Error):
                process.kill()
    except (AttributeError, psutil.Error):
        pass


def pid_of_kernel(client):
    """The kernel's own process: the one the client started, or in a sandbox the outermost
    ipykernel beneath the sandbox's processes (the cells' children are killed below it)."""
    try:
        pid = client.km.provisioner.process.pid
    except AttributeError:
        return None
    def is_kernel(process):  # bubblewrap's own command line names the kernel too
        line = process.cmdline()
        return "ipykernel_launcher" in line and not line[0].endswith("bwrap")

    try:
        top = psutil.Process(pid)
        if is_kernel(top):
            return pid
        for _ in range(100):  # the sandbox starts the kernel a moment after itself
            for child in top.children(recursive=True):
                if is_kernel(child):
                    return child.pid
            time.sleep(0.05)
    except psutil.Error:
        pass
    return pid
