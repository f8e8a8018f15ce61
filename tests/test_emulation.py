"""The emulated accelerator (course_lib.runtime.emulation): compute paced, messages real."""

import functools

import pytest
import torch

from course_lib import launch, training
from course_lib import overlap as ov
from course_lib.benchmarks.emulation import matrix_products
from course_lib.data import load_digits
from course_lib.models import mlp
from course_lib.runtime import emulation
from course_lib.runtime.emulation import EmulatedDevice, flops_of, rate_for, reachable_ratio

DIGITS = load_digits()
X, Y = DIGITS.x_train[:64], DIGITS.y_train[:64]
MODEL = functools.partial(mlp, (64, 32, 10), seed=0)


class FakeClock:
    """time.perf_counter, time.thread_time and time.sleep of a pretend machine."""

    def __init__(self, monkeypatch):
        self.wall = self.cpu = 0.0
        self.slept = []
        monkeypatch.setattr(emulation.time, "perf_counter", lambda: self.wall)
        monkeypatch.setattr(emulation.time, "thread_time", lambda: self.cpu)
        monkeypatch.setattr(emulation.time, "sleep", self.sleep)

    def compute(self, cpu, wall=None):
        self.cpu += cpu
        self.wall += cpu if wall is None else wall

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.wall += seconds


def test_each_piece_takes_its_flops_at_the_devices_rate(monkeypatch):
    clock, device = FakeClock(monkeypatch), EmulatedDevice(1e9)
    device.pieces = [40e6, 0, 40e6, 0, 0]      # as counting() would leave them
    device.start()
    clock.compute(0.010)                       # 40 MFLOP in 10 ms of CPU: 40 ms on the device
    assert device.catch_up() == pytest.approx(0.030)
    assert clock.wall == pytest.approx(0.040) and device.device_seconds == pytest.approx(0.040)
    clock.compute(0.0, wall=0.025)             # waiting 25 ms for a message: as it is
    assert device.catch_up() == 0.0 and clock.wall == pytest.approx(0.065)
    clock.compute(0.050)                       # 50 ms of CPU for a 40 ms piece: late by 10
    assert device.catch_up() == 0.0
    assert device.lag == pytest.approx(0.010) and device.device_seconds == pytest.approx(0.080)
    clock.compute(0.005)                       # an optimizer's update: no FLOPs, as it is
    assert device.catch_up() == 0.0 and device.unmodelled == pytest.approx(0.005)
    assert clock.slept == [pytest.approx(0.030)]
    with pytest.raises(RuntimeError, match="more pacing points than the one counted"):
        device.catch_up()


def test_pieces_that_carry_are_one_run_a_late_host_catches_up_in(monkeypatch):
    clock, device = FakeClock(monkeypatch), EmulatedDevice(1e9)
    device.pieces = [0, 40e6, 40e6, 0, 0]      # a gradient without FLOPs, two of 40 ms each
    device.start()
    clock.compute(0.004)                       # a bias's gradient and a hook's copy: late by 4
    assert device.catch_up(carry=True) == 0.0
    clock.compute(0.010)                       # 10 ms of CPU: the run is due at 40 ms, not 44
    assert device.catch_up(carry=True) == pytest.approx(0.026)
    assert clock.wall == pytest.approx(0.040)
    clock.compute(0.050)                       # 50 ms for 40: the run's 64 ms of CPU, 80 modelled
    assert device.catch_up() == 0.0 and clock.wall == pytest.approx(0.090)
    assert device.lag == 0.0 and device.unmodelled == 0.0
    assert device.device_seconds == pytest.approx(0.080)
    clock.compute(0.020)                       # without carry each piece stands alone
    device.start()
    clock.compute(0.004)
    device.catch_up()
    clock.compute(0.010)
    device.catch_up()
    assert device.unmodelled == pytest.approx(0.004) and clock.wall == pytest.approx(0.154)


def test_counting_records_the_flops_between_pacing_points():
    device, a = EmulatedDevice(1e9), torch.randn(100, 100)
    with device.counting():
        matrix_products(a, 3)
        device.catch_up()
        matrix_products(a, 1)
    assert device.pieces == [3 * 2 * 100 ** 3, 2 * 100 ** 3] and device.step_flops == 8 * 10 ** 6


def test_the_pacing_benchmark_times_paced_steps_against_the_modelled_time():
    # that a paced step takes the modelled time within 10% is a timing, so it is printed by
    # `python -m course_lib.benchmarks.emulation`, never asserted; here: what it runs and prints
    from course_lib.benchmarks import emulation as bench

    before = torch.get_num_threads()
    result = bench.paced_steps(size=60, slower=3.0, repeats=2)
    assert torch.get_num_threads() == before
    assert len(result["paced"].times) == 2 and len(result["cpu"].times) == 2
    assert result["modelled"] == pytest.approx(3.0 * result["cpu"].median)
    text = bench.format_paced(result)
    assert "wall / modelled" in text and "emulated device" in text
    with pytest.raises(ValueError, match="slower must be > 1"):
        bench.paced_steps(slower=1.0)


def test_the_pacing_benchmark_prints_idle_and_beside_a_busy_process(capsys):
    from course_lib.benchmarks import emulation as bench

    bench.main(["--repeats", "1", "--slower", "2", "--busy"])
    out = capsys.readouterr().out
    assert "beside a busy process" in out and "wall / modelled" in out


def test_nothing_waits_when_it_is_off(monkeypatch):
    def no_sleep(seconds):
        raise AssertionError("slept with no emulated device")

    monkeypatch.setattr(emulation.time, "sleep", no_sleep)
    losses = training.step_loop(MODEL(), torch.optim.SGD(MODEL().parameters(), lr=0.1), X, Y,
                                16, 3)
    assert len(losses) == 3


def _train_with(emulated):
    return ov.train(MODEL, X, Y, 16, 4, 0.1, sync="buckets", bucket_mb=0.001,
                    emulated=emulated)["params"]


def test_exact_results_are_unchanged_with_it_on():
    off = launch(_train_with, 2, args=(None,))
    on = launch(_train_with, 2, args=(EmulatedDevice(1e8, "a test"),))
    for a, b in zip(off, on, strict=True):
        assert torch.equal(a, b)  # the same operations in the same order: bit for bit


def _message_during_compute():
    import torch.distributed as dist

    a = torch.randn(200, 200, generator=torch.Generator().manual_seed(0))
    device = EmulatedDevice(20 * 2 * 200 ** 3 / 1.0)  # 20 products in 1 s
    with device.counting():
        matrix_products(a)
        device.catch_up()
    buf = torch.ones(2**16)
    device.start()
    work = dist.all_reduce(buf, async_op=True)   # started before the compute
    matrix_products(a)
    device.catch_up()                             # the device is still computing until here
    done = work.is_completed()
    work.wait()
    return done, buf[0].item()


def test_a_message_started_before_the_modelled_compute_finishes_within_it():
    for done, total in launch(_message_during_compute, 2):
        assert done and total == 2.0  # 256 kB travelled while the device computed for 1 s


def test_gradient_pacing_runs_before_a_synchronisers_hook():
    model, order = MODEL(), []
    device = EmulatedDevice(1e9)
    device.catch_up = lambda carry=False: order.append("pace")
    handles = device.pace_gradients(model)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: order.append("sync"))
    training.loss_fn(model, X, Y).backward()
    assert order == ["pace", "sync"] * 4       # 4 parameters: each paced, then sent
    for h in handles:
        h.remove()


def test_the_flops_of_a_step_counted_by_hand():
    model, b = MODEL(), 8

    def step():
        training.loss_fn(model, X[:b], Y[:b]).backward()

    flops, _ = flops_of(step)
    forward = 2 * b * 64 * 32 + 2 * b * 32 * 10
    weight_grads = forward                      # dL/dW of each layer: one product each
    input_grads = 2 * b * 32 * 10               # dL/dx of the second layer (the data needs none)
    assert flops == forward + weight_grads + input_grads
    conv = torch.nn.Conv2d(3, 5, 3, padding=1)
    flops, _ = flops_of(conv, torch.randn(2, 3, 8, 8))
    assert flops == 2 * 2 * 5 * 8 * 8 * 3 * 3 * 3  # 2 b c_out H W c_in k k


def test_attention_on_a_cpu_rank_counts_its_flops_by_hand():
    # torch's counter has formulas for the GPU's attention kernels only; the course adds the CPU's
    b, h, s, d = 2, 4, 32, 16
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))

    def attend():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    flops, _ = flops_of(attend)
    forward = 2 * (2 * b * h * s * s * d)  # q k^T, then the scores times v (the mask not counted)
    backward = 2.5 * forward  # the scores again, dV, dP, dQ and dK: five products to forward's two
    assert flops == forward + backward


def test_rate_for_gives_the_ratio_and_refuses_what_this_cpu_cannot_stand_for():
    rate = rate_for(0.5, communication=0.02, flops=4e8, compute_cpu=0.01)
    assert rate == pytest.approx(1e10)  # the device computes the step in 0.02 / 0.5 = 40 ms
    with pytest.raises(ValueError, match=r"ratio of 2 .* 10\.00 ms .* at most 1"):
        rate_for(2.0, communication=0.02, flops=4e8, compute_cpu=0.01)
    with pytest.raises(ValueError, match="ratio must be positive"):
        rate_for(0.0, 0.02, 4e8, 0.01)


def test_a_ratio_this_cpu_cannot_stand_for_becomes_the_largest_rate_for_accepts():
    assert reachable_ratio(0.5, communication=0.02, compute_cpu=0.01) == 0.5  # within reach
    slow = reachable_ratio(2.0, communication=0.02, compute_cpu=0.01)
    assert slow == pytest.approx(0.99)  # 1% inside the limit of 0.02 / (2 x 0.01)
    rate_for(slow, communication=0.02, flops=4e8, compute_cpu=0.01)  # accepted, not refused
    with pytest.raises(ValueError, match="ratio of 1.01"):
        rate_for(1.01, communication=0.02, flops=4e8, compute_cpu=0.01)
    with pytest.raises(ValueError, match="least must be positive"):
        reachable_ratio(0.5, 0.02, 0.01, least=0)


def test_bad_settings_are_refused_by_name(monkeypatch):
    with pytest.raises(ValueError, match="flops_per_second must be positive"):
        EmulatedDevice(0)
    with pytest.raises(RuntimeError, match=r"counting\(\) first"):
        EmulatedDevice(1e9).start()
    device = EmulatedDevice(1e9)
    device.pieces = [1, 0]
    with pytest.raises(RuntimeError, match="call start"):
        device.catch_up()
    with pytest.raises(ValueError, match="cuda:0: .* CPU ranks"):
        emulation.check_cpu_rank("cuda:0")
    emulation.check_cpu_rank("cpu")
    monkeypatch.setattr(emulation.torch, "get_num_threads", lambda: 2)
    with pytest.raises(RuntimeError, match="one thread's CPU time"), EmulatedDevice(1e9).counting():
        pass
    assert EmulatedDevice(1e9, "8 GPUs").label == "emulated device (8 GPUs)"


def test_queued_operations_take_their_flops_one_after_another(monkeypatch):
    clock, device = FakeClock(monkeypatch), EmulatedDevice(1e9)
    with device.queued():
        device.issue(40e6, cpu=0.010)              # 40 ms on the device from 0
        clock.compute(0.010)
        device.issue(40e6, cpu=0.010)              # queued behind it: done at 80 ms
        clock.compute(0.010)
        device.issue(0, cpu=0.005)                 # no FLOPs: no device time
        clock.compute(0.005)
        assert device.synchronize() == pytest.approx(0.080 - 0.025)
        clock.compute(0.0, wall=0.100)             # a message: the device is idle meanwhile
        device.resume()                            # from 180 ms
        clock.compute(0.0, wall=0.020)             # the host waits 20 ms for another message
        clock.compute(0.005)                       # and works 5 ms (counted as instant)
        assert device.ready(clock.wall, clock.cpu) == pytest.approx(0.200)
        device.issue(40e6, cpu=0.010, ready=device.ready(clock.wall, clock.cpu))
        clock.compute(0.010)                       # done at 240 ms on the device
        device.resume()                            # an async message posted at 215 ms
        clock.compute(0.0, wall=0.040)             # its wait(): in at 255 ms
        clock.compute(0.005)
        device.issue(0, cpu=0.005, ready=device.ready(clock.wall, clock.cpu))  # unpacking it
        clock.compute(0.010)                       # more work without FLOPs
    assert clock.wall == pytest.approx(0.270)      # the device waited 15 ms for the host's CPU
    assert device.device_seconds == pytest.approx(0.120)
    assert device.lag == pytest.approx(0.015) and device.unmodelled == pytest.approx(0.010)
    assert clock.slept == [pytest.approx(0.055)]
    assert emulation.summary(device)["device_seconds"] == pytest.approx(0.120)
    assert emulation.summary(None) is None


def _queued_messages():
    import torch.distributed as dist

    device, seen = EmulatedDevice(1e12), []
    wait = device.synchronize
    device.synchronize = lambda: seen.append(device.device_seconds) or wait()
    a = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    with device.queued():
        b = a @ a                       # queued: 2 * 64^3 FLOPs
        dist.all_reduce(b)              # the message needs b: the host waits for the device
        total = b.sum().item()          # the host reads a value: it waits again
    return seen, total, b, 2 * (a @ a)


def test_a_message_or_a_read_waits_for_the_queued_work_before_it():
    for seen, total, summed, expected in launch(_queued_messages, 2):
        product = 2 * 64 ** 3 / 1e12
        assert seen[0] == pytest.approx(product)   # the all-reduce waited for the product
        assert len(seen) == 3                      # the all-reduce, .item() and the block's end
        torch.testing.assert_close(summed, expected)  # the results are the same as off
        assert total == pytest.approx(expected.sum().item(), rel=1e-4)


def test_queued_blocks_do_not_nest_and_off_is_nothing():
    device = EmulatedDevice(1e12)
    with device.queued(), pytest.raises(RuntimeError, match="do not nest"), device.queued():
        pass
    with emulation.queued(None) as nothing:
        assert nothing is None
    assert device.queued  # the device is usable again after a refused nesting
    with device.queued():
        torch.ones(3).sum()


def _send_and_receive():
    import torch.distributed as dist

    device, seen = EmulatedDevice(1e12), []
    wait = device.synchronize
    device.synchronize = lambda: seen.append("wait") or wait()
    buf = torch.zeros(4)
    with device.queued():
        if dist.get_rank() == 0:
            dist.send(torch.ones(4), dst=1)
        else:
            dist.recv(buf, src=0)
    return seen, buf


def test_a_send_waits_for_the_device_and_posting_a_receive_does_not():
    (sent, _), (received, buf) = launch(_send_and_receive, 2)
    assert sent == ["wait", "wait"]    # before the send (it needs its data), at the block's end
    assert received == ["wait"]        # only at the block's end
    torch.testing.assert_close(buf, torch.ones(4))


def _time_after_compute(numels):
    from course_lib.benchmarks.emulation import time_after_compute
    from course_lib.collectives import torch_all_reduce

    device = EmulatedDevice(5e9)
    times = time_after_compute(torch_all_reduce, numels, device, products=2, size=64, repeats=3)
    return times, device.device_seconds


def test_time_after_compute_times_each_size_past_the_device_s_compute():
    """Two gloo ranks: a time per repetition and size, none below zero (the host sleeps until
    the device is done before it sends); the device modelled every repetition's products,
    warm-up included. Whether a message after compute costs more than one after another is a
    timing: lesson 12 prints it."""
    numels = [16, 4096]
    by_rank = launch(_time_after_compute, 2, args=(numels,))
    for times, device_seconds in by_rank:
        assert sorted(times) == numels
        assert all(len(runs) == 3 and min(runs) >= 0 for runs in times.values())
        flops = 2 * 2 * 64 ** 3 * (3 + 1) * len(numels)  # 2 products, 4 runs a size
        assert device_seconds == pytest.approx(flops / 5e9)
