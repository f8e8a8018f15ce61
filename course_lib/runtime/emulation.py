"""An emulated accelerator: a rank's compute takes the time a device would need; messages stay real.

Why. On a CPU, a rank's compute and gloo's communication share the same cores: a message sent
while the other rank computes waits for a core, so overlap, pipelines and plans cannot pay off on
a laptop. On a GPU node the compute runs on the device and the host is free to communicate. This
module restores that division of labour on CPU ranks.

How. The real computation runs on the CPU, so every result stays exact. The device's time for
it is modelled from the work done: the FLOPs of each piece of the step (matrix products,
convolutions, attention -- what MFU counts), counted once by torch's ``FlopCounterMode`` while
one step runs (:meth:`EmulatedDevice.counting`), divided by the device's ``flops_per_second``.
At *pacing points* -- after forward, when a parameter's gradient is computed, after backward,
after the optimizer step -- the rank sleeps until the piece since the last point has taken its
modelled time. Sleeping leaves the cores to gloo's threads, as a GPU leaves its host free; the
same modelled time on every rank and every step keeps the ranks in step, as GPUs are. Time
spent waiting for a message passes as it is, so a blocking collective after backward costs its
real time, as on a device. A piece whose CPU work took longer than its modelled time (the rate
is too high for this CPU) is late: :attr:`EmulatedDevice.lag` sums by how much. Work without
FLOPs (an optimizer's update, copies) is not modelled: :attr:`EmulatedDevice.unmodelled`. Pieces
paced with ``carry`` (a backward pass's gradients) are one run: the next starts when the last was
due, so a host late at one point (a small piece, a hook's copy) catches up in the next, as a
device's queue does; ``lag`` then counts the run's CPU work beyond the run's modelled time.

Choosing the rate by similarity. What decides whether communication can hide is the *ratio* of
communication to compute time. :func:`rate_for` picks the rate that gives this machine's step
the ratio of the system it stands for (the planner's ``step_time`` says a system's ratio), and
refuses one that would leave this CPU too busy to stand for a device; :func:`reachable_ratio`
gives the largest it accepts, for a run that should go on at that ratio and say so.

Any code, without pacing points. :meth:`EmulatedDevice.queued` runs a block as a GPU's stream
runs it: each operation computes at once on the CPU and is queued on the device, which takes its
FLOPs / rate after the work before it; work without FLOPs takes no device time. The host's CPU
work counts as instant (a GPU's host only launches kernels), its waits for messages do not. The
host waits for the device only before a message, when it reads a value and at the block's end;
``lag`` counts the device waiting for the host. Code whose messages are inside other libraries
(torch's pipelining, FSDP2, tensor-parallel layers) runs on it as it is.

Off by default: code that is not handed an :class:`EmulatedDevice` paces nothing and never
sleeps. Every figure and sentence made from an emulated run says "emulated device"; it is not a
GPU measurement.
"""

from __future__ import annotations

import contextlib
import itertools
import time

import torch

from course_lib.runtime.device_queue import DeviceQueue

LABEL = "emulated device"


class EmulatedDevice:
    """A rank's stand-in accelerator that computes ``flops_per_second``.

    ``stands_for`` says what its ratio of communication to compute stands for, e.g. "a 1.3B GPT
    on 32 A100s". The first step runs inside :meth:`counting` (it counts the FLOPs between
    pacing points and is not paced); every later step calls :meth:`start` when it begins and
    :meth:`catch_up` at the same pacing points (:meth:`pace_gradients` adds one whenever
    autograd computes a gradient)."""

    def __init__(self, flops_per_second: float, stands_for: str = ""):
        if isinstance(flops_per_second, bool) or not flops_per_second > 0:
            raise ValueError(f"flops_per_second must be positive, got {flops_per_second!r}")
        self.flops_per_second, self.stands_for = float(flops_per_second), stands_for
        self.device_seconds = self.lag = self.unmodelled = 0.0
        self.pieces = None     # FLOPs between consecutive pacing points of one step
        self._counter = self._counted = None
        self._wall, self._cpu, self._next, self._run = None, None, 0, 0.0
        self._free = self._mark = None  # queued(): the device's queue ends; the host's CPU

    def __repr__(self) -> str:
        return (f"EmulatedDevice(flops_per_second={self.flops_per_second:.3g}, "
                f"stands_for={self.stands_for!r})")

    @property
    def label(self) -> str:
        """How figures and sentences name it: "emulated device" (and what it stands for)."""
        return LABEL + (f" ({self.stands_for})" if self.stands_for else "")

    @property
    def step_flops(self) -> int:
        """The FLOPs of one step, as counted."""
        self._check_counted()
        return sum(self.pieces)

    @contextlib.contextmanager
    def counting(self):
        """Run one step inside this: its pacing points record the FLOPs done since the last one
        (nothing sleeps); afterwards every step is paced by them."""
        from torch.utils.flop_counter import FlopCounterMode

        check_one_thread()
        self._counter, self._counted = FlopCounterMode(display=False), []
        with self._counter:
            yield self
        totals = [*self._counted, self._counter.get_total_flops()]
        self.pieces = [b - a for a, b in itertools.pairwise([0, *totals])]
        self._counter = self._counted = None

    def start(self) -> None:
        """Begin a paced step: the next piece of compute starts now."""
        if self._counter is None:
            self._check_counted()
            self._wall, self._cpu, self._next = time.perf_counter(), time.thread_time(), 0
            self._run = 0.0  # modelled seconds of the run of pieces since the last point

    def catch_up(self, carry: bool = False) -> float:
        """A pacing point: sleep until the piece since the last point has taken its modelled
        time (``carry``: see the module's docstring). Returns the seconds slept."""
        if self._counter is not None:
            self._counted.append(self._counter.get_total_flops())
            return 0.0
        self._check_counted()
        if self._wall is None:
            raise RuntimeError("call start() when a paced step begins")
        if self._next >= len(self.pieces) - 1:
            raise RuntimeError(f"this step has more pacing points than the one counted "
                               f"({len(self.pieces) - 1}): pace every step the same way")
        modelled = self.pieces[self._next] / self.flops_per_second
        self._next += 1
        due, cpu = self._wall + modelled, time.thread_time() - self._cpu
        wait = due - time.perf_counter()
        self.device_seconds += modelled
        self._run += modelled
        if not carry and self._run > 0:  # the CPU's work did not fit the device's time
            self.lag += max(0.0, cpu - self._run)
        elif not carry:
            self.unmodelled += cpu
        if wait > 0:
            time.sleep(wait)
        self._wall = due if carry else time.perf_counter()
        if not carry:
            self._cpu, self._run = time.thread_time(), 0.0
        return max(wait, 0.0)

    def pace_gradients(self, model, carry: bool = False) -> list:
        """A pacing point each time autograd computes a trainable parameter's gradient: a tensor
        hook, which runs before any post-accumulate-grad hook or DDP hook, so a synchroniser
        starts each message at the modelled time its gradient is ready (``carry``: backward's
        pieces as one run). Returns the handles (``h.remove()`` to stop)."""
        def pace(grad):
            self.catch_up(carry=carry)
            return grad

        return [p.register_hook(pace) for p in model.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def queued(self):
        """Run the block as a GPU's stream runs it (the module's docstring says how); no step
        needs counting first."""
        check_one_thread()
        if self._free is not None:
            raise RuntimeError("queued() blocks do not nest")
        self._free = 0.0
        self.resume()
        try:
            with DeviceQueue(self):
                yield self
            self.synchronize()
        finally:
            self._free = None

    def issue(self, flops: float, cpu: float, ready: float = 0.0) -> None:
        """Queue an operation of ``flops`` that took ``cpu`` seconds on this CPU (inside
        :meth:`queued`): the device runs it after the work queued before it and not before
        ``ready`` (a wall time), in FLOPs / rate seconds; work without FLOPs takes no device
        time (``unmodelled`` counts its CPU time)."""
        seconds = flops / self.flops_per_second
        self._free = max(self._free, ready) + seconds  # after a message's wait, not before
        if not flops:
            self.unmodelled += cpu
            return
        self.device_seconds += seconds

    def synchronize(self) -> float:
        """Sleep until the device has done the work queued so far; returns the seconds slept.
        A host that arrives after that kept the device waiting: ``lag`` counts it."""
        wait = self._free - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        else:
            self.lag -= wait
        return max(wait, 0.0)

    def resume(self) -> None:
        """After a message or a read: the device goes on from now with what the host queues."""
        self._free, self._mark = max(self._free, time.perf_counter()), time.thread_time()

    def ready(self, wall: float, cpu: float) -> float:
        """When an operation issued at ``wall`` (this thread's clock at ``cpu``) can start: the
        host's CPU work since the last message is taken as instant, as a GPU's host launches
        work at once; only its waits (a message's ``wait()``) count."""
        return wall - (cpu - self._mark)

    def _check_counted(self) -> None:
        if self.pieces is None:
            raise RuntimeError("run one step inside EmulatedDevice.counting() first: the device "
                               "paces a step by the FLOPs counted in it")


def catch_up(emulated: EmulatedDevice | None) -> None:
    """A pacing point for code that may or may not run on an emulated device (None: off)."""
    if emulated is not None:
        emulated.catch_up()


def queued(emulated: EmulatedDevice | None):
    """``emulated.queued()``, or nothing when ``emulated`` is None (off)."""
    return contextlib.nullcontext() if emulated is None else emulated.queued()


def summary(emulated: EmulatedDevice | None) -> dict | None:
    """What a run reports of its emulated device: the modelled seconds of compute, the lag and
    the unmodelled seconds (None when off)."""
    if emulated is None:
        return None
    return dict(device_seconds=emulated.device_seconds, lag=emulated.lag,
                unmodelled=emulated.unmodelled, flops_per_second=emulated.flops_per_second,
                label=emulated.label)


@contextlib.contextmanager
def paced_step(emulated: EmulatedDevice | None):
    """One step on ``emulated`` (None: as it is): counted if the device has not counted a step
    yet, paced from its start otherwise."""
    if emulated is None:
        yield
    elif emulated.pieces is None:
        with emulated.counting():
            yield
    else:
        emulated.start()
        yield


def check_one_thread() -> None:
    """The emulated device checks its pieces against one thread's CPU time (and the similarity
    measures one), so the compute must run in that one thread (the lessons' default: ``launch``
    gives each worker one thread)."""
    if torch.get_num_threads() != 1:
        raise RuntimeError(f"the emulated device measures one thread's CPU time, but torch uses "
                           f"{torch.get_num_threads()} threads here; set torch.set_num_threads(1)"
                           f" (COURSE_LIB_THREADS=1)")


def check_cpu_rank(dev) -> None:
    """An emulated device stands in for an accelerator on CPU ranks; a rank that has a GPU is
    measured as it is."""
    if torch.device(dev).type != "cpu":
        raise ValueError(f"this rank computes on {dev}: the emulated device stands in for an "
                         f"accelerator on CPU ranks; measure {dev} as it is")


def rate_for(ratio: float, communication: float, flops: float, compute_cpu: float,
             least: float = 2.0) -> float:
    """The FLOP rate at which a step of ``flops`` makes its ``communication`` seconds
    ``ratio`` x its compute: the device computes the step in ``communication / ratio`` seconds.
    Refused when that is under ``least`` x the step's ``compute_cpu`` seconds of CPU work: the
    CPU would be busy more than 1/least of the time and gloo's threads would wait for cores."""
    for name, value in (("ratio", ratio), ("communication", communication), ("flops", flops),
                        ("compute_cpu", compute_cpu)):
        if isinstance(value, bool) or not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    device = communication / ratio
    if device < least * compute_cpu:
        raise ValueError(
            f"a ratio of {ratio:g} makes the device compute a step in {device * 1e3:.2f} ms "
            f"(communication {communication * 1e3:.2f} ms / {ratio:g}), under {least:g} x the "
            f"{compute_cpu * 1e3:.2f} ms this CPU needs: it would be too busy to stand for a "
            f"device; choose a ratio of at most {communication / (least * compute_cpu):.3g}, or "
            f"a step with more bytes per FLOP")
    return flops / device


def reachable_ratio(ratio: float, communication: float, compute_cpu: float,
                    least: float = 2.0) -> float:
    """``ratio``, or on a CPU too slow to stand for it the largest ratio :func:`rate_for`
    accepts (1% inside its limit): the same system with a network ``ratio / returned`` x
    faster. Say so wherever a run uses less than it asked for."""
    if not least > 0:
        raise ValueError(f"least must be positive, got {least!r}")
    return min(ratio, 0.99 * communication / (least * compute_cpu))


def flops_of(fn, *args, **kwargs) -> tuple[int, object]:
    """The floating-point operations of ``fn(*args, **kwargs)`` as torch's FlopCounterMode
    counts them (matrix products, convolutions, attention: the FLOPs of MFU), and its result."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        out = fn(*args, **kwargs)
    return counter.get_total_flops(), out
