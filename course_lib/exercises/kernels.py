"""The grader's kernel: started in the sandbox, outputs capped, is it still answering, a real
restart (and the cells that ran, again), what it left running.

Lecture: none (the homework machinery; ``grading`` runs each submission through these).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import time
from pathlib import Path

import psutil

from course_lib.exercises.common import DATA_MIME

HIDDEN_FAILED = "a hidden test failed"  # all a report says of one: nothing the tests could leak
MAX_OUTPUTS = 200  # per cell: a cell that prints without end cannot fill the grader's memory
MAX_OUTPUT_BYTES = 1_000_000  # per cell, counted over what is kept: few huge prints alike
MAX_DATA_BYTES = 20_000_000  # what one check cell may send in all; more and its data is not judged
TOO_MUCH = {"name": None, "too much": True}  # a cell's data when it sent more


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


def run_quietly(client, code: str, within: float = 10.0) -> bool:
    """Run ``code`` in the kernel without output or history (the grader's own statements
    between cells); whether the kernel answered within ``within`` seconds."""
    from jupyter_core.utils import run_sync

    msg_id = client.kc.execute(code, silent=True, store_history=False)
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        try:
            reply = run_sync(client.kc.get_shell_msg)(timeout=left)
        except Exception:  # noqa: BLE001 - queue.Empty: no answer in time
            return False
        if reply["parent_header"].get("msg_id") == msg_id:
            return True
    return False


# after every cell: a closed or replaced sys.stdout or sys.stderr is made new (an honest cell
# that closed one must not cost the next exercise its output)
RESTORE_STREAMS = """
import sys as _s
from ipykernel.iostream import OutStream as _O
for _n in ("stdout", "stderr"):
    _v = getattr(_s, _n)
    if not isinstance(_v, _O) or _v.closed:
        _k = get_ipython().kernel
        setattr(_s, _n, _O(_k.session, _k.iopub_thread, _n, watchfd=False))
del _s, _O, _n, _v
"""


def responsive(client, within: float = 5.0) -> bool:
    """Whether the kernel answers a request that does nothing within ``within`` seconds."""
    return run_quietly(client, "pass", within)


def restart_kernel(client):
    """A real restart: the kernel process is killed, a new one started, and a new client
    connection waits until it answers (the old one may hold messages a broken kernel garbled).
    Returns the new kernel's pid."""
    from jupyter_core.utils import run_sync

    run_sync(client.km.restart_kernel)(now=True)
    with contextlib.suppress(Exception):
        client.kc.stop_channels()
    client.km.session.digest_history.clear()  # a garbling kernel may have repeated messages
    client.kc = client.km.client()
    client.kc.start_channels()
    run_sync(client.kc.wait_for_ready)(timeout=60)
    return pid_of_kernel(client)


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


def sandboxed_manager(shared: Path, **box):
    """A kernel manager whose kernel runs in the sandbox (``sandbox.command(..., **box)``),
    reached through Unix sockets in ``shared`` (the sandbox has no network to reach it by),
    interrupted by a message (a signal can't cross into its process tree)."""
    from jupyter_client.manager import AsyncKernelManager

    from course_lib.exercises import sandbox

    class SandboxedKernelManager(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            return sandbox.command(super().format_kernel_cmd(extra_arguments), shared=shared,
                                   **box)

        def write_connection_file(self, **kwargs):
            # a restart writes it again: never through a link a dead kernel planted there
            path = Path(self.connection_file)
            if path.is_symlink() or (path.exists() and not path.is_file()):
                path.unlink()
                self._connection_file_written = False
            return super().write_connection_file(**kwargs)

    km = SandboxedKernelManager(kernel_name="python3", transport="ipc",
                                ip=str(shared / "kernel"),
                                connection_file=str(shared / "kernel.json"))
    km.kernel_spec.interrupt_mode = "message"
    return km


def notebook_client(nb, km, cell_timeout):
    from nbclient import NotebookClient

    class CappedClient(NotebookClient):
        kept_bytes: dict = {}
        message_bytes: dict = {}  # every message of a cell, kept or not
        check_data: dict = {}  # cell index -> the records its checks sent (common.DATA_MIME)

        def process_message(self, msg, cell, cell_index):
            kind, content = msg["msg_type"], msg.get("content", {})
            if kind in ("status", "execute_input"):
                return super().process_message(msg, cell, cell_index)
            size = len(json.dumps(content, default=str))
            total = self.message_bytes.get(cell_index, 0) + size
            self.message_bytes[cell_index] = total
            data = content.get("data") if kind == "display_data" else None
            if isinstance(data, dict) and DATA_MIME in data:  # a check's data: judged, not shown
                records = self.check_data.setdefault(cell_index, [])
                if len(records) >= MAX_OUTPUTS or total > MAX_DATA_BYTES:
                    records[:] = [TOO_MUCH]  # nothing of it is judged
                elif records != [TOO_MUCH]:
                    records.append(data[DATA_MIME])
                return None
            # display updates and widgets' messages change what is kept without adding an
            # output: capped by what the cell has sent in all
            updating = kind.startswith("comm") or kind == "update_display_data" or bool(
                (content.get("transient") or {}).get("display_id"))
            if updating and total > MAX_OUTPUT_BYTES:
                return None
            return super().process_message(msg, cell, cell_index)

        def output(self, outs, msg, display_id, cell_index):
            content = msg.get("content", {})
            size = len(json.dumps(content, default=str))
            kept = self.kept_bytes.get(cell_index, 0) if outs else 0  # outs empty: a new run
            if len(outs) >= MAX_OUTPUTS or kept >= MAX_OUTPUT_BYTES:
                return None  # drop the rest: printing without end must not fill memory
            if kept + size > MAX_OUTPUT_BYTES:
                if msg["msg_type"] != "stream":
                    return None
                # the kernel batches prints into one message: keep its head, say so
                room = max(MAX_OUTPUT_BYTES - kept - 200, 0)
                msg = {**msg, "content": {**content, "text": content.get("text", "")[:room]
                                          + "\n[output cut by the grader]\n"}}
                size = MAX_OUTPUT_BYTES - kept
            self.kept_bytes[cell_index] = kept + size
            return super().output(outs, msg, display_id, cell_index)

    timeout_error = dict(ename="CellTimeout", evalue=f"the cell ran longer than {cell_timeout} s "
                         f"and was interrupted", traceback=[])
    return CappedClient(nb, km=km, timeout=cell_timeout, allow_errors=False,
                        interrupt_on_timeout=True, error_on_timeout=timeout_error)


def replay(client, nb, ran):
    """Run the cells that ran before, again, in a new kernel: copies, errors ignored."""
    for j in ran:
        try:
            client.execute_cell(copy.deepcopy(nb.cells[j]), j, store_history=False)
        except Exception:  # noqa: BLE001, S112 - the replay restores state; it is not graded
            continue
    client.check_data.clear()  # what the copies sent is not graded
