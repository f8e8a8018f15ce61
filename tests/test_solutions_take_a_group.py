"""The instructor's solutions to the distributed exercises take ``group=None`` like every rank
function of the course, and honour it: run on 4 ranks as two groups {0, 1} and {2, 3}, each
answer is its own pair's, as one process computes it. A solution that ignored ``group`` would
mix in the other pair."""

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course_lib import device, launch
from course_lib import low_bits as lb

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SOLUTIONS = {"mean_and_max": "00_start_here", "my_doubling_all_reduce": "03_collectives",
             "my_weighted_average": "04_data_parallelism", "MyGather": "05_model_parallelism",
             "push_sum_step": "06b_without_a_server", "make_overlapped": "10_fast_data_parallelism",
             "make_zero1": "11_memory_and_sharding", "ef_sign_all_reduce": "07b_one_and_four_bits"}


def solution(name: str) -> str:
    cells = json.loads((NOTEBOOKS / f"{SOLUTIONS[name]}.ipynb").read_text())["cells"]
    found = [src for c in cells if c["cell_type"] == "code"
             for src in ["".join(c["source"])]
             if (f"def {name}(" in src or f"class {name}(" in src) and "BEGIN SOLUTION" in src]
    assert len(found) == 1, f"{name}: {len(found)} solution cells"
    return found[0]


def _data(rank: int):
    """What ``rank`` holds: a vector, and a batch of rank + 1 samples for a 3-in, 2-out layer."""
    g = torch.Generator().manual_seed(100 + rank)
    return (torch.randn(5, generator=g, dtype=torch.float64),
            torch.randn(rank + 1, 3, generator=g, dtype=torch.float64),
            torch.randn(rank + 1, 2, generator=g, dtype=torch.float64))


def _layer():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2).double()


def _loss(layer, x, y):
    return ((layer(x) - y) ** 2).mean()


def _in_pairs(sources):
    space = {"torch": torch, "dist": dist, "device": device, "lb": lb}
    for source in sources:
        exec(source, space)
    rank = dist.get_rank()
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = pairs[rank // 2]
    me = dist.get_rank(group)
    vector, x, y = _data(rank)
    out = {"sum": space["my_doubling_all_reduce"](vector.clone(), group=group),
           "mean_max": space["mean_and_max"](float(vector[0]), group=group)}

    width = vector[:2].clone().requires_grad_()  # this rank's 2 output features
    whole = space["MyGather"].apply(width, group)
    (whole * torch.arange(1.0, 5.0, dtype=torch.float64)).sum().backward()
    out["gather"], out["gather_grad"] = whole.detach(), width.grad

    out["ef_sign"] = space["ef_sign_all_reduce"](vector, torch.zeros_like(vector), group=group)

    layer = _layer()
    _loss(layer, x, y).backward()
    space["my_weighted_average"](layer, len(x), group=group)
    out["weighted"] = [p.grad.clone() for p in layer.parameters()]

    z = torch.cat([vector, torch.ones(1, dtype=torch.float64)])
    out["push_sum"] = space["push_sum_step"](z, [1 - me], [1 - me], group=group)

    layer = _layer()
    wait = space["make_overlapped"](layer, 1, group=group)
    _loss(layer, x, y).backward()
    wait()
    out["overlapped"] = [p.grad.clone() for p in layer.parameters()]

    layer = _layer()
    _loss(layer, x, y).backward()
    step, _ = space["make_zero1"](list(layer.parameters()), 0.1, 0.9, group=group)
    step()
    out["zero1"] = [p.detach().clone() for p in layer.parameters()]
    return out


@pytest.mark.filterwarnings("ignore:.*oversubscribed")  # 4 ranks on fewer cores: correctness only
def test_the_distributed_solutions_answer_for_their_own_group_only():
    ranks = launch(_in_pairs, world_size=4, args=([solution(n) for n in SOLUTIONS],), timeout=60)
    for pair in ([0, 1], [2, 3]):
        data = [_data(r) for r in pair]
        vectors = torch.stack([v for v, _, _ in data])
        x, y = torch.cat([d[1] for d in data]), torch.cat([d[2] for d in data])
        whole = _layer()
        _loss(whole, x, y).backward()  # the pair's global batch in one process
        grads = [p.grad for p in whole.parameters()]
        means = []
        for _, xr, yr in data:
            own = _layer()
            _loss(own, xr, yr).backward()
            means.append([p.grad for p in own.parameters()])
        mean = [(a + b) / 2 for a, b in zip(*means, strict=True)]
        signs = torch.where(vectors >= 0, 1.0, -1.0).double()  # a zero counts as +
        messages = vectors.abs().mean(1, keepdim=True) * signs  # scale x sign, each rank's
        stepped = [p.detach() - 0.1 * g for p, g in zip(_layer().parameters(), mean, strict=True)]
        for r in pair:
            got = ranks[r]
            torch.testing.assert_close(got["sum"], vectors.sum(0))
            torch.testing.assert_close(got["mean_max"], (vectors[:, 0].mean().item(),
                                                         vectors[:, 0].max().item()))
            torch.testing.assert_close(got["gather"], vectors[:, :2].reshape(-1))
            weights = torch.arange(1.0, 5.0, dtype=torch.float64)  # d loss / d gathered output
            torch.testing.assert_close(got["gather_grad"], weights[2 * (r % 2):2 * (r % 2) + 2])
            torch.testing.assert_close(got["weighted"], grads)
            torch.testing.assert_close(got["push_sum"][:-1] / got["push_sum"][-1], vectors.mean(0))
            torch.testing.assert_close(got["overlapped"], mean)
            torch.testing.assert_close(got["zero1"], stepped)
            sign_mean, residual = got["ef_sign"]
            torch.testing.assert_close(sign_mean, messages.mean(0))
            torch.testing.assert_close(residual, vectors[r % 2] - messages[r % 2])
