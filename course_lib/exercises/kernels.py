"""The grader's kernel: started in the sandbox, outputs capped, is it still answering, a real
restart (and the cells that ran, again), what it left running.

Lecture: none (the homework machinery; ``grading`` runs each submission through these).
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from pathlib import Path

import psutil

HIDDEN_FAILED = "a hidden test failed"  # all a report says of one: nothing the tests could leak
MAX_OUTPUTS = 200  # per cell: a cell that prints without end cannot fill the grader's memory
MAX_OUTPUT_BYTES = 1_000_000  # per cell, counted over what is kept: few huge prints alike


def kill_children(pid):
    """Kill what the kernel ``pid`` started, except the fork server of warm launches (it lives
    as long as the kernel by design, and every launch would pay its start again; in the sandbox
    it ends with the sandbox)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
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


def _run_hidden(client, cell, index, kernel_pid) -> bool:
    """Run an exercise's hidden tests: whether they passed. How they failed is not reported
    (an error message is the student's code talking, and could carry the tests' text)."""
    try:
        client.execute_cell(cell, index)
    except Exception:  # noqa: BLE001 - an error, a timeout, a dead kernel: all the same here
        if not responsive(client):
            restart_kernel(client)
        return False
    finally:
        kill_children(kernel_pid)
    return True


def responsive(client, within: float = 5.0) -> bool:
    """Whether the kernel answers a request that does nothing within ``within`` seconds."""
    from jupyter_core.utils import run_sync

    msg_id = client.kc.execute("pass", silent=True, store_history=False)
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        try:
            reply = run_sync(client.kc.get_shell_msg)(timeout=left)
        except Exception:  # noqa: BLE001 - queue.Empty: no answer in time
            return False
        if reply["parent_header"].get("msg_id") == msg_id:
            return True
    return False


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

    km = SandboxedKernelManager(kernel_name="python3", transport="ipc",
                                ip=str(shared / "kernel"),
                                connection_file=str(shared / "kernel.json"))
    km.kernel_spec.interrupt_mode = "message"
    return km


def notebook_client(nb, km, cell_timeout):
    from nbclient import NotebookClient

    class CappedClient(NotebookClient):
        kept_bytes: dict = {}

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


def replay(client, nb, ran, out):
    """Run the cells that ran before, again, in a new kernel: copies, errors ignored."""
    for j in ran:
        try:
            client.execute_cell(copy.deepcopy(nb.cells[j]), j, store_history=False)
        except Exception:  # noqa: BLE001, S112 - the replay restores state; it is not graded
            continue
    for old in out.glob("*"):
        old.unlink()
