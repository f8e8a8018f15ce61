"""The one step loop (course_lib.training) with the parts that plug into it: every gradient
synchroniser of lesson 10 and ZeRO's ShardedAdam, on a model with a frozen parameter, a
parameter no loss uses and two parameter groups, against torch's SGD and Adam on one process,
on 2 and 3 gloo ranks."""

import numpy as np
import pytest
import torch

from course_lib import WorkerError, launch
from course_lib import overlap as ov
from course_lib import training as T
from course_lib import zero as Z

GLOBAL_BATCH, STEPS = 12, 4  # 12 rows split over 2 or 3 ranks


class WithSpare(torch.nn.Module):
    """An MLP whose first bias is frozen and which carries a layer that forward never uses."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                        torch.nn.Linear(16, 4)).double()
        self.spare = torch.nn.Linear(8, 4).double()  # no gradient on any rank, ever
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
        self.body[0].bias.requires_grad_(False)  # frozen

    def forward(self, x):
        return self.body(x)


def groups(model, lr_fast):
    """Two parameter groups: the last layer with its own learning rate and weight decay, and
    with it the unused layer (a zero gradient in place of none would decay it: torch skips it)."""
    return [{"params": list(model.body[0].parameters())},
            {"params": [*model.body[2].parameters(), *model.spare.parameters()], "lr": lr_fast,
             "weight_decay": 0.01}]


def sgd(model):
    return torch.optim.SGD(groups(model, 0.3), lr=0.1, foreach=False)


def adam(model):
    return torch.optim.Adam(groups(model, 0.03), lr=0.01, foreach=False)


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(40, 8, generator=g, dtype=torch.float64), torch.randint(0, 4, (40,),
                                                                               generator=g)


def one_process(optimizer):
    model = WithSpare()
    x, y = data()
    losses = T.step_loop(model, optimizer(model), x, y, GLOBAL_BATCH, STEPS)
    return model, losses


def every_sync():
    x, y = data()
    return {sync: ov.train(WithSpare, x, y, GLOBAL_BATCH, STEPS, lr=None, sync=sync,
                           bucket_mb=1e-6, find_unused=True, optimizer=sgd)["params"]
            for sync in ov.SYNCS}


def sharded_adam():
    out = {}
    for stage in (1, 2):
        model = WithSpare()
        x, y = data()
        opt = Z.ShardedAdam(groups(model, 0.03), stage=stage, lr=0.01)
        T.step_loop(model, opt, x, y, GLOBAL_BATCH, STEPS)
        out[stage] = vector(model), moments(opt.adam)
    return out


def moments(optimizer):
    """How many numbers of Adam's moments an optimizer holds (its step counts left out)."""
    return sum(t.numel() for state in optimizer.state.values() for k, t in state.items()
               if k != "step")


def vector(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("ranks", [2, 3])
def test_every_synchroniser_equals_torch_sgd_with_frozen_unused_and_grouped_parameters(ranks):
    model, _ = one_process(sgd)
    expected = vector(model)
    start = vector(WithSpare())
    spare = slice(expected.numel() - 36, None)  # spare's 32 weights and 4 biases come last
    assert torch.equal(expected[spare], start[spare])  # torch left the unused layer alone
    for rank, result in enumerate(launch(every_sync, ranks)):
        for sync, params in result.items():
            torch.testing.assert_close(params, expected, rtol=0, atol=1e-12,
                                       msg=lambda m, s=sync, r=rank: f"{s}, rank {r}: {m}")


@pytest.mark.parametrize("ranks", [2, 3])
def test_sharded_adam_equals_torch_adam_with_frozen_unused_and_grouped_parameters(ranks):
    model = WithSpare()
    opt = adam(model)
    T.step_loop(model, opt, *data(), GLOBAL_BATCH, STEPS)
    results = launch(sharded_adam, ranks)
    for stage in (1, 2):
        for rank, by_stage in enumerate(results):
            torch.testing.assert_close(by_stage[stage][0], vector(model), rtol=0, atol=1e-12,
                                       msg=lambda m, s=stage, r=rank: f"stage {s}, rank {r}: {m}")
        # the ranks' moments together are torch's: none for the frozen or the unused layer
        assert sum(r[stage][1] for r in results) == moments(opt) == 2 * (128 + 64 + 4)


def test_without_find_unused_a_parameter_without_gradient_is_refused_by_name():
    x, y = data()
    for sync in ("after backward", "per parameter", "buckets"):
        with pytest.raises(WorkerError, match=r"parameters \['spare.weight', 'spare.bias'\] got "
                                              r"no gradient"):
            launch(ov.train, 2, args=(WithSpare, x, y, GLOBAL_BATCH, 1, 0.1),
                   kwargs=dict(sync=sync, bucket_mb=1e-6))


def spare_on_rank_0_only():
    """Rank 0's loss also uses the spare layer; the other ranks' do not."""
    import torch.distributed as dist

    from course_lib.data_parallel import average_gradients

    model = WithSpare()
    x, y = data()
    out = model(x[:6])
    if dist.get_rank() == 0:
        out = out + model.spare(x[:6])
    torch.nn.functional.cross_entropy(out, y[:6]).backward()
    average_gradients(model, find_unused=True)


def test_a_parameter_only_some_ranks_used_is_refused_by_name_not_left_to_hang():
    # lesson 4's average_gradients is lesson 10's "after backward": the same refusal
    assert ov.all_reduce_after_backward is ov.average_gradients
    with pytest.raises(WorkerError, match=r"parameters \['spare.weight', 'spare.bias'\] got a "
                                          r"gradient on some ranks only"):
        launch(spare_on_rank_0_only, 2, timeout=60)


def test_the_loop_refuses_what_it_cannot_split_or_draw():
    x, y = data()
    with pytest.raises(ValueError, match="does not split evenly over 3 ranks"):
        T.check_split(10, 3)
    with pytest.raises(ValueError, match="larger than the 40 rows"):
        T.global_batches(40, 41, 1)
    for bad, match in (((40, 0, 1), "global_batch must be a whole number of at least 1"),
                       ((40, True, 1), "global_batch must be"), ((40, 4, -1), "steps must be"),
                       ((40, 4, True), "steps must be"), ((40, 2.5, 1), "global_batch must be")):
        with pytest.raises(ValueError, match=match):
            T.global_batches(*bad)
    for split in ((0, 2), (-4, 2), (8, -2), (5, 2.5), (8, 0)):
        with pytest.raises(ValueError, match="must be a whole number of at least 1"):
            T.check_split(*split)
    with pytest.raises(ValueError, match="rows must be a whole number of at least 0"):
        T.check_steps(-10, 2, 1)
    assert T.gradient_counts([]).numel() == 0
    assert T.check_whole("steps", np.int64(3)) == 3  # numpy's integers are whole numbers too
    for counts in (torch.tensor([0.0, 1.0, 2.0, 1.0]), [0, 1, 2, 1]):  # a tensor or a list
        assert T.used_by_some_ranks_only(counts, 2) == [1, 3]
    with pytest.raises(RuntimeError, match=r"rank 0: parameters \['weight', 'bias'\] got no "):
        T.parameters_to_average(torch.nn.Linear(2, 2))  # one process: no process group needed
    assert T.rank_and_size() == (0, 1)  # no process group: one process
    model, losses = one_process(sgd)
    assert len(losses) == STEPS and all(loss > 0 for loss in losses)
    assert [len(b) for b in T.global_batches(40, 12, 3)] == [12, 12, 12]


def test_step_loop_reports_each_step_and_computes_the_mean_cross_entropy():
    model = WithSpare()
    x, y = data()
    seen = []
    T.step_loop(model, sgd(model), x, y, GLOBAL_BATCH, 3, on_step=lambda s, t: seen.append(s))
    assert seen == [0, 1, 2]
    logits = torch.randn(3, 5, 7, dtype=torch.float64)
    targets = torch.randint(0, 7, (3, 5))
    expected = torch.nn.functional.cross_entropy(logits.reshape(15, 7), targets.reshape(15))
    torch.testing.assert_close(T.loss_fn(lambda _: logits, None, targets), expected)


def test_counts_are_whole_and_an_epoch_makes_at_least_one_step():
    assert T.check_whole("repeats", 3) == 3 and T.check_whole("warm-up", 0, least=0) == 0
    for bad in (0, -2, 2.5, True, "3", None):
        with pytest.raises(ValueError, match=r"repeats must be a whole number of at least 1, got"):
            T.check_whole("repeats", bad)
    assert T.check_steps(100, 2, 10) == 5 and T.check_steps(100, 2, 10, accumulate=2) == 2
    assert T.check_steps(20, 2, 10) == 1  # exactly one step
    with pytest.raises(ValueError, match="19 rows over 2 ranks give each 9: not one step of 1 x "
                                         "local_batch 10; choose a smaller local_batch"):
        T.check_steps(19, 2, 10)
    with pytest.raises(ValueError, match="not one step of 3 x local_batch 10"):
        T.check_steps(50, 2, 10, accumulate=3)
    for kwargs, name in ((dict(world_size=0), "world_size"), (dict(local_batch=-1), "local_batch"),
                         (dict(accumulate=0), "accumulate")):
        with pytest.raises(ValueError, match=f"{name} must be a whole number"):
            T.check_steps(**(dict(rows=100, world_size=2, local_batch=10) | kwargs))


def test_is_whole_takes_python_and_numpy_integers_but_not_bools_or_floats():
    assert T.is_whole(3) and T.is_whole(np.int64(3)) and T.is_whole(-1)
    assert not any(T.is_whole(v) for v in (True, 3.0, np.float64(3), "3", None, torch.tensor(3)))
