"""Every hand-written function that runs on ranks puts its tensors on ``device()``.

On two gloo ranks, each function runs inside ``fake_gpu.pretend_gpu()``, where ``device()`` is
a marker device: an operation that mixes the rank's device with the CPU, or a collective on a
CPU tensor, raises, as it would on a GPU; the result must come back on the marker and equal
what the same function computes on the CPU. (DDP, FSDP2, DTensor and torch's pipelining place
tensors themselves on the device they are given: ``python -m course_lib.benchmarks.gpu_check``
runs them on real GPUs.)
"""

import functools

import pytest
import torch
from fake_gpu import Misplaced, on_marker, pretend_gpu, to_cpu

from course_lib import collectives as C
from course_lib import data_parallel as dp
from course_lib import decentralized as dec
from course_lib import erm, hello, launch
from course_lib import federated as fl
from course_lib import parameter_server as ps
from course_lib import pipeline as pp
from course_lib import quantization as qz
from course_lib import tensor_parallel as tp
from course_lib.data import load_digits
from course_lib.models import DIGITS_MLP, digits_cnn, feed_forward, mlp

PAIR = {0: [1], 1: [0]}


def summed(all_reduce, vector, rank):
    return all_reduce(vector(rank))[0]


def cases():
    """name -> a function of this rank's index that runs one lesson function."""
    digits, flat = load_digits(images=True, dtype=torch.float64), load_digits()
    x, y = digits.x_train[:64], digits.y_train[:64]
    pieces = pp.split_into_stages(mlp((64, 16, 16, 10), activation=torch.nn.Tanh,
                                      dtype=torch.float64), 2)
    batch = torch.randn(8, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    parts = list(torch.arange(200).split(25))
    problem = erm.diabetes_problem()
    local = fl.LocalTraining(epochs=1, batch=10, lr=0.1)
    vector = lambda rank: torch.arange(7.0) * (rank + 1)  # noqa: E731
    return {
        **{name: functools.partial(summed, all_reduce, vector)
           for name, all_reduce in {**C.ALL_REDUCES, "torch": C.torch_all_reduce}.items()},
        "time_all_reduce": lambda rank: {n: len(runs) for n, runs in C.time_all_reduce(
            C.ring_all_reduce, [8, 16], repeats=2).items()},
        "train_from_scratch": lambda rank: dp.train_from_scratch(
            lambda: digits_cnn(width=2, dtype=torch.float64), x, y, 8, 0.1)["params"],
        "run_pipeline": lambda rank: pp.run_pipeline(pieces, batch, torch.arange(8) % 10,
                                                     2)["grads"],
        "run_megatron_mlp": lambda rank: tp.run_megatron_mlp(
            feed_forward(d_model=4, d_hidden=8), batch[:, :4], batch[:, 4:8]),
        "gossip_average": lambda rank: dec.gossip_average(vector(rank).double(), PAIR,
                                                          dec.mixing_matrix(PAIR)),
        "decentralized_sgd": lambda rank: dec.decentralized_sgd(problem, PAIR, steps=3,
                                                                lr=0.1, batch=8)["iterates"],
        "local_sgd": lambda rank: dec.local_sgd(problem, local_steps=2, rounds=2, lr=0.1,
                                                batch=8)["averaged"],
        "quantized_all_reduce": lambda rank: qz.quantized_all_reduce(vector(rank))["sum"],
        "compressed_all_reduce": lambda rank: qz.compressed_all_reduce(vector(rank),
                                                                       "fp16")["sum"],
        "fedavg_round": lambda rank: fl.fedavg_round(
            DIGITS_MLP.init(), fl.Clients.of(flat, parts), [0, 1, 2, 5], local, seed=0,
            round_=0),
        "federated": lambda rank: fl.federated(
            flat, parts, local, fl.Federation(rounds=1, fraction=0.5, scaffold=True))["params"],
        "hello_all_reduce": lambda rank: hello.hello_all_reduce()["all_reduce_sum"],
    }


def run_every_case(pretend: bool):
    import torch.distributed as dist

    rank, out = dist.get_rank(), {}
    for name, case in cases().items():
        try:
            if pretend:
                with pretend_gpu():
                    result = case(rank)
                out[name] = ("ok" if on_marker(result) else "not on the device", to_cpu(result))
            else:
                out[name] = ("ok", to_cpu(case(rank)))
        except Misplaced as err:
            out[name] = (f"misplaced: {err}", None)
    return out


@pytest.fixture(scope="module")
def runs():
    return {pretend: launch(run_every_case, 2, args=(pretend,), timeout=240)
            for pretend in (False, True)}


@pytest.mark.parametrize("name", sorted(cases()))
def test_lesson_function_keeps_its_tensors_on_the_ranks_device(runs, name):
    for rank in (0, 1):
        verdict, result = runs[True][rank][name]
        assert verdict == "ok", f"rank {rank}: {verdict}"
        torch.testing.assert_close(result, runs[False][rank][name][1], equal_nan=True)


def test_the_parameter_server_computes_on_the_device_and_sends_from_host_memory():
    """The server receives from any source (gloo only): its messages stay on the CPU by design,
    while its workers compute on their device."""
    problem = erm.diabetes_problem()

    def server_round(pretend):
        run = lambda: ps.parameter_server(problem, ps.sgd(0.1), gradients=2, batch=8)  # noqa
        if not pretend:
            return to_cpu(run())
        with pretend_gpu(messages_on_cpu=True):
            return to_cpu(run())

    plain, pretended = (launch(server_round, 2, args=(p,)) for p in (False, True))
    torch.testing.assert_close(pretended[0]["iterates"], plain[0]["iterates"])


def test_the_audit_catches_a_tensor_left_on_the_cpu():
    with pretend_gpu():
        w = torch.ones(3, device=torch.device("meta"))
        with pytest.raises(Misplaced, match="mixes"):
            _ = w + torch.ones(3)
        _ = w + torch.tensor(2.0)  # a 0-dim CPU scalar is fine, as on CUDA
        assert on_marker(w * 2) and not on_marker(torch.ones(2))
