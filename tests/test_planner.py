"""The strategy planner (course_lib.planner) on hand-computed cases."""

import pytest

from course_lib import planner as P

TINY = P.Transformer(layers=2, hidden=4, heads=2, seq=8, vocab=10, global_batch=8)
GPT_7B = P.Transformer(layers=32, hidden=4096, heads=32, seq=2048, vocab=50_257,
                       global_batch=512)
NODE = P.Cluster(gpus_per_node=8, nodes=1, memory=80 * 2**30, peak_flops=312e12,
                 intra_bandwidth=300e9, inter_bandwidth=25e9)


def test_parameters_and_flops_by_hand():
    # 2 blocks x (12 * 16 + 13 * 4) + (10 + 8) * 4 = 2 * 244 + 72
    assert TINY.parameters == 560
    tokens = 8 * 8
    attention = 2 * 6 * 2 * 4 * 64 * 8
    assert TINY.flops_per_step() == 6 * 560 * tokens + attention
    assert TINY.flops_per_step(recompute=True) == 8 * 560 * tokens + attention * 8 / 6


def test_memory_terms_by_hand():
    plan = P.Plan(dp=2, tp=2, pp=1, zero=1, micro_batches=1)
    mem = P.memory(TINY, plan)
    share = 560 / 2
    assert mem["state"] == pytest.approx(4 * share + 12 * share / 2)
    b = 8 / 2  # sequences per micro-batch on a dp rank
    per_layer = 8 * b * 4 * (10 + 24 / 2 + 5 * 2 * 8 / (4 * 2))
    assert mem["activations"] == pytest.approx(2 * 1 * per_layer)
    recomputed = P.memory(TINY, P.Plan(dp=2, tp=2, pp=1, zero=1, recompute=True))
    assert recomputed["activations"] == pytest.approx(2 * 2 * 8 * b * 4)
    assert mem["total"] == pytest.approx(mem["state"] + mem["activations"])


def test_a_pipeline_stage_keeps_at_most_pp_micro_batches_in_flight():
    two = P.memory(TINY, P.Plan(dp=1, tp=1, pp=2, micro_batches=2))
    eight = P.memory(TINY, P.Plan(dp=1, tp=1, pp=2, micro_batches=8))
    per_layer_8 = P.activation_bytes_per_layer(TINY, P.Plan(dp=1, tp=1, pp=2, micro_batches=8))
    # one layer a stage, two micro-batches in flight
    assert eight["activations"] == pytest.approx(1 * 2 * per_layer_8)
    assert eight["activations"] < two["activations"]


def test_recomputation_makes_a_plan_fit():
    plan = P.Plan(dp=8, tp=1, pp=1, zero=3)
    full, recomputed = (P.memory(GPT_7B, P.Plan(dp=8, tp=1, pp=1, zero=3, recompute=r))
                        for r in (False, True))
    limit = (full["total"] + recomputed["total"]) / 2
    small = P.Cluster(**{**NODE.__dict__, "memory": limit})
    ranked = {r.plan: r for r in P.rank_plans(GPT_7B, small)}
    assert not ranked[plan].fits
    assert ranked[P.Plan(dp=8, tp=1, pp=1, zero=3, recompute=True)].fits


def test_tensor_parallelism_across_nodes_loses_to_pipeline_parallelism():
    model = P.Transformer(layers=8, hidden=1024, heads=8, seq=1024, vocab=32_000,
                          global_batch=16)
    two_nodes = P.Cluster(gpus_per_node=1, nodes=2, memory=80 * 2**30, peak_flops=312e12,
                          intra_bandwidth=300e9, inter_bandwidth=12.5e9)
    across = P.step_time(model, two_nodes, P.Plan(dp=1, tp=2, pp=1))
    piped = P.step_time(model, two_nodes, P.Plan(dp=1, tp=1, pp=2, micro_batches=8))
    assert across["tensor_parallel"] > 0 and piped["tensor_parallel"] == 0
    assert piped["total"] < across["total"]
    # the planner itself never puts a tensor-parallel group across nodes
    assert all(r.plan.tp == 1 for r in P.rank_plans(model, two_nodes))


def test_the_ranking_puts_fitting_plans_first_fastest_first_and_says_why():
    ranked = P.rank_plans(GPT_7B, NODE)
    fits = [r for r in ranked if r.fits]
    assert fits and all(r.fits for r in ranked[:len(fits)])
    times = [r.time["total"] for r in fits]
    assert times == sorted(times)
    slower = next(r for r in fits if r.time["total"] > 1.01 * fits[0].time["total"])
    assert "x the best step, most of it" in P.why(fits[0], slower)
    tie = next((r for r in fits[1:] if r.time["total"] <= 1.005 * fits[0].time["total"]), None)
    if tie is not None:
        assert "as fast as the best" in P.why(fits[0], tie)
        assert tie.memory["total"] >= fits[0].memory["total"]
    loser = next(r for r in ranked if not r.fits)
    assert "GiB per GPU" in P.why(fits[0], loser)


def test_candidates_respect_divisibility():
    for plan in P.candidate_plans(GPT_7B, NODE):
        assert plan.dp * plan.tp * plan.pp == 8
        assert GPT_7B.heads % plan.tp == 0 and GPT_7B.layers % plan.pp == 0
        assert GPT_7B.global_batch % (plan.dp * plan.micro_batches) == 0
        assert not (plan.zero == 3 and plan.pp > 1)
    assert any(p.pp == 1 and p.micro_batches > 1 for p in P.candidate_plans(GPT_7B, NODE))
