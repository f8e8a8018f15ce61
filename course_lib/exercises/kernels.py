"""The grader's kernel: is it still answering, a real restart, what it left running.

Lecture: none (the homework machinery; ``grading`` runs each submission through these).
"""

from __future__ import annotations

import time

import psutil

HIDDEN_FAILED = "a hidden test failed"  # all a report says of one: nothing the tests could leak


def _kill_children(pid):
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for child in children:
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
        if not _responsive(client):
            _restart(client)
        return False
    finally:
        _kill_children(kernel_pid)
    return True


def _responsive(client, within: float = 5.0) -> bool:
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


def _restart(client):
    """A real restart: the kernel process is killed, a new one started, and the client waits
    until it answers. Returns the new kernel's pid."""
    from jupyter_core.utils import run_sync

    run_sync(client.km.restart_kernel)(now=True)
    run_sync(client.kc.wait_for_ready)(timeout=60)
    return _kernel_pid(client)


def _kernel_pid(client):
    try:
        return client.km.provisioner.process.pid
    except AttributeError:
        return None
