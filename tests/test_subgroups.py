"""Every lesson's algorithm runs inside a sub-group: a 4-rank world split into the groups {0, 2}
and {1, 3}, each running the algorithms on its own data at the same time (group B in the
opposite order, so the two groups are busy with different algorithms), each result equal to its
single-process baseline. A function that used global ranks or the default group would send to
the other group's processes and fail or hang."""

import functools

import pytest
import torch
import torch.distributed as dist

from course_lib import collectives as C
from course_lib import data_parallel as dp
from course_lib import decentralized as dec
from course_lib import erm, launch
from course_lib import federated as fl
from course_lib import parameter_server as ps
from course_lib import pipeline as pp
from course_lib import tensor_parallel as tp
from course_lib.data import load_digits
from course_lib.models import DIGITS_MLP, digits_cnn, feed_forward, mlp

GROUPS = ([0, 2], [1, 3])
LR, LOCAL_BATCH = 0.1, 8


def inputs(g: int) -> dict:
    """What group g works on: different data for the two groups, the same on both of its ranks."""
    gen = torch.Generator().manual_seed(100 + g)
    digits = load_digits(images=True, dtype=torch.float64)
    rows = torch.randperm(len(digits.y_train), generator=gen)[:64]
    flat = load_digits()
    return dict(
        vectors=[torch.randn(11, generator=gen, dtype=torch.float64) for _ in range(2)],
        images=(digits.x_train[rows], digits.y_train[rows]),
        model_fn=functools.partial(digits_cnn, seed=g, width=2, dtype=torch.float64),
        pieces=pp.split_into_stages(mlp((64, 16, 16, 10), activation=torch.nn.Tanh,
                                        dtype=torch.float64, seed=g), 2),
        batch=(torch.randn(12, 64, generator=gen, dtype=torch.float64),
               torch.randint(0, 10, (12,), generator=gen)),
        block=feed_forward(d_model=8, d_hidden=16, seed=g),
        tokens=(torch.randn(5, 8, generator=gen, dtype=torch.float64),
                torch.randn(5, 8, generator=gen, dtype=torch.float64)),
        problem=erm.breast_cancer_problem() if g == 0 else erm.diabetes_problem(),
        clients=fl.Clients.of(flat, torch.randperm(len(flat.y_train), generator=gen)[:240]
                              .split(30)),
    )


GOSSIP_GRAPH = {0: [1], 1: [0]}
LOCAL = fl.LocalTraining(epochs=1, batch=10, lr=0.1)
CHOSEN = [0, 3, 5, 6]


def algorithms(data, group):
    """Each lesson's algorithm on this rank's group; name -> what this rank ended with."""
    me = dist.get_rank(group)
    return {
        "ring all-reduce": lambda: C.ring_all_reduce(data["vectors"][me], group=group)[0],
        "data-parallel step": lambda: dp.train_from_scratch(
            data["model_fn"], *data["images"], LOCAL_BATCH, LR, group=group)["params"],
        "pipeline round": lambda: pp.run_pipeline(data["pieces"], *data["batch"], 3,
                                                  group=group)["grads"],
        "Megatron MLP": lambda: tp.run_megatron_mlp(data["block"], *data["tokens"],
                                                    group=group),
        "gossip step": lambda: dec.gossip_average(data["vectors"][me], GOSSIP_GRAPH,
                                                  dec.mixing_matrix(GOSSIP_GRAPH), group),
        "parameter-server round": lambda: ps.parameter_server(
            data["problem"], ps.sgd(0.5), gradients=3, seed=None, group=group),
        "FedAvg round": lambda: fl.fedavg_round(DIGITS_MLP.init(), data["clients"], CHOSEN,
                                                LOCAL, seed=0, round_=0, group=group),
    }


def on_two_subgroups():
    groups = [dist.new_group(ranks) for ranks in GROUPS]  # every rank takes part in both
    g = next(i for i, ranks in enumerate(GROUPS) if dist.get_rank() in ranks)
    todo = list(algorithms(inputs(g), groups[g]).items())
    results = {name: run() for name, run in (todo if g == 0 else todo[::-1])}
    dist.barrier()
    return g, dist.get_rank(groups[g]), results


@pytest.fixture(scope="module")
def runs():
    with pytest.warns(RuntimeWarning, match="oversubscribed"):
        out = launch(on_two_subgroups, 4, timeout=240)
    assert [(g, me) for g, me, _ in out] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    return {(g, me): results for g, me, results in out}


@pytest.mark.parametrize("g", [0, 1])
def test_ring_all_reduce_in_a_subgroup(runs, g):
    want = sum(inputs(g)["vectors"])
    for me in (0, 1):
        torch.testing.assert_close(runs[g, me]["ring all-reduce"], want)


@pytest.mark.parametrize("g", [0, 1])
def test_data_parallel_step_in_a_subgroup(runs, g):
    data = inputs(g)
    model = data["model_fn"]()
    batches = dp.sampler_global_batches(len(data["images"][1]), 2, LOCAL_BATCH)
    dp.train_one_process(model, *data["images"], batches, LR)
    for me in (0, 1):
        torch.testing.assert_close(runs[g, me]["data-parallel step"],
                                   dp.parameters_vector(model))


@pytest.mark.parametrize("g", [0, 1])
def test_pipeline_round_in_a_subgroup(runs, g):
    data = inputs(g)
    _, grads = pp.reference_gradients(data["pieces"], *data["batch"])
    got = runs[g, 0]["pipeline round"] + runs[g, 1]["pipeline round"]  # stage 0's, then 1's
    for a, b in zip(got, grads, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("g", [0, 1])
def test_megatron_mlp_in_a_subgroup(runs, g):
    data = inputs(g)
    x, target = data["tokens"]
    block, x = data["block"], x.clone().requires_grad_(True)
    out = block(x)
    torch.nn.functional.mse_loss(out, target).backward()
    for me in (0, 1):
        result = runs[g, me]["Megatron MLP"]
        torch.testing.assert_close(result["out"], out.detach())
        torch.testing.assert_close(result["x_grad"], x.grad)
        rows = slice(me * 8, (me + 1) * 8)
        torch.testing.assert_close(result["grads"]["w1"], block.fc1.weight.grad[rows])
        assert result["counter"] == {"forward": 1, "backward": 1}


@pytest.mark.parametrize("g", [0, 1])
def test_gossip_step_in_a_subgroup(runs, g):
    X = torch.stack(inputs(g)["vectors"])
    want = dec.mixing_matrix(GOSSIP_GRAPH) @ X
    for me in (0, 1):
        torch.testing.assert_close(runs[g, me]["gossip step"], want[me])


@pytest.mark.parametrize("g", [0, 1])
def test_parameter_server_round_in_a_subgroup(runs, g):
    problem = inputs(g)["problem"]
    w = torch.zeros(problem.d, dtype=torch.float64)
    for _ in range(3):  # one worker holding every row: gradient descent
        w = w - 0.5 * problem.gradient(w)
    log = runs[g, 0]["parameter-server round"]
    torch.testing.assert_close(log["iterates"][-1], w)
    assert runs[g, 1]["parameter-server round"]["steps"] == 3


@pytest.mark.parametrize("g", [0, 1])
def test_fedavg_round_in_a_subgroup(runs, g):
    data = inputs(g)
    want = fl.fedavg_round(DIGITS_MLP.init(), data["clients"], CHOSEN, LOCAL, seed=0, round_=0)
    for me in (0, 1):
        torch.testing.assert_close(runs[g, me]["FedAvg round"], want, atol=1e-10, rtol=0)


def test_the_two_groups_really_computed_different_things(runs):
    assert not torch.allclose(runs[0, 0]["ring all-reduce"], runs[1, 0]["ring all-reduce"])
