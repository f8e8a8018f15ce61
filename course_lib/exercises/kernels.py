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

from course_lib.exercises.common import DATA_MIME
from course_lib.exercises.guard import (  # noqa: F401 - here too, as the grader's kernel's
    clean_sockets_folder,
    kill_children,
    kill_kernel,
    pid_of_kernel,
)

HIDDEN_FAILED = "a hidden test failed"  # all a report says of one: nothing the tests could leak
MAX_OUTPUTS = 200  # per cell: a cell that prints without end cannot fill the grader's memory
MAX_OUTPUT_BYTES = 1_000_000  # per cell, counted over what is kept: few huge prints alike
MAX_DATA_BYTES = 20_000_000  # what one check cell may send in all; more and its data is not judged
TOO_MUCH = {"name": None, "too much": True}  # a cell's data when it sent more
MAX_MESSAGE_BYTES = 64_000_000  # one message from the kernel, at most (prints come batched)
# received, not yet read, per socket: at most about 1 GB held here; more wait in the kernel
MAX_QUEUED_MESSAGES = 16


def run_quietly(client, code: str, within: float = 10.0) -> bool:
    """Run ``code`` in the kernel without output or history (the grader's own statements
    between cells); whether the kernel answered within ``within`` seconds (a reply that makes
    no sense is no answer)."""
    from jupyter_core.utils import run_sync

    try:
        msg_id = client.kc.execute(code, silent=True, store_history=False)
        deadline = time.monotonic() + within
        while (left := deadline - time.monotonic()) > 0:
            reply = run_sync(client.kc.get_shell_msg)(timeout=left)
            parent = reply.get("parent_header") if isinstance(reply, dict) else None
            if isinstance(parent, dict) and parent.get("msg_id") == msg_id:
                return True
    except Exception:  # noqa: BLE001 - queue.Empty, or a kernel whose replies make no sense
        return False
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

    with contextlib.suppress(AttributeError):  # its control groups are removed at the end
        client.launchers.add(client.km.provisioner.process.pid)
    kill_kernel(client)  # all of it, before anything of the old kernel's is touched
    if getattr(client, "shared", None) is not None:
        clean_sockets_folder(client.shared)
    run_sync(client.km.restart_kernel)(now=True)
    with contextlib.suppress(Exception):
        client.kc.stop_channels()
    client.km.session.digest_history.clear()  # a garbling kernel may have repeated messages
    client.kc = client.km.client()
    client.kc.start_channels()
    run_sync(client.kc.wait_for_ready)(timeout=60)
    return pid_of_kernel(client)


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
            kind, content = msg.get("msg_type"), msg.get("content")
            if not isinstance(content, dict) or not isinstance(kind, str):
                return None
            count = content.get("execution_count")
            if "execution_count" in content and not (type(count) is int or count is None):
                content = {k: v for k, v in content.items() if k != "execution_count"}
                msg = {**msg, "content": content}  # a prompt number is a number, nothing else
            if kind == "status":
                return super().process_message(msg, cell, cell_index)
            size = len(json.dumps(content, default=str)) + sum(
                len(b) for b in msg.get("buffers") or [])  # widgets' binary buffers too
            total = self.message_bytes.get(cell_index, 0) + size
            self.message_bytes[cell_index] = total
            if kind == "execute_input":
                return super().process_message(msg, cell, cell_index) \
                    if total <= MAX_OUTPUT_BYTES else None
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
    km.client_factory = capped_kernel_client()
    return CappedClient(nb, km=km, timeout=cell_timeout, allow_errors=False,
                        interrupt_on_timeout=True, error_on_timeout=timeout_error,
                        store_widget_state=False)  # widgets' state: not the grader's to keep


def capped_kernel_client():
    """The kernel client class the grader talks through: no message it receives may be larger
    than :data:`MAX_MESSAGE_BYTES` (a kernel that sends one is disconnected and the message
    dropped, before the grader holds it in memory)."""
    import zmq.asyncio
    from jupyter_client.asynchronous import AsyncKernelClient

    class CappedKernelClient(AsyncKernelClient):
        def _context_default(self):
            self._created_context = True
            context = zmq.asyncio.Context()
            context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # for every socket it makes
            # and so few queued that their worst case stays small (zmq's default: 1,000); more
            # wait in the kernel's queue, in the sandbox's memory, and past its 1,000 the kernel
            # drops them: a cell that floods loses messages (its check's data among them)
            context.setsockopt(zmq.RCVHWM, MAX_QUEUED_MESSAGES)
            return context

    return CappedKernelClient


def replay(client, nb, ran, deadline: float | None = None, guard=None) -> str | None:
    """Run the cells that ran before, again, in a new kernel: copies, errors ignored. It stops
    at ``deadline`` (``time.monotonic()``: the notebook's limit) and at a copy that runs past
    the cell limit or kills the kernel, and ``guard`` watches each copy as it does a cell: so a
    cell that behaves only when it is not replayed costs at most one cell limit more. Returns
    where it stopped early, in words, or None when every cell ran again."""
    for j in ran:
        if deadline is not None and time.monotonic() > deadline:
            client.check_data.clear()
            return f"the notebook's limit came at cell {j}"
        if guard is not None:
            guard.deadline = time.monotonic() + client.timeout + 15
        try:
            client.execute_cell(copy.deepcopy(nb.cells[j]), j, store_history=False)
        except Exception as error:  # noqa: BLE001 - the replay restores state; it is not graded
            if getattr(error, "ename", "CellTimeout") == "CellTimeout":
                client.check_data.clear()  # past its limit, or no kernel: more would only wait
                return f"cell {j} did not run again ({type(error).__name__})"
        finally:
            if guard is not None:
                guard.deadline = None
    client.check_data.clear()  # what the copies sent is not graded
    return None
