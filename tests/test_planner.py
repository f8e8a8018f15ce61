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
    # each layer's input, plus one layer's activations while backward recomputes it
    assert recomputed["activations"] == pytest.approx(2 * 2 * 8 * b * 4 + per_layer)
    assert mem["total"] == pytest.approx(mem["state"] + mem["activations"])


def test_a_pipeline_stage_keeps_at_most_pp_micro_batches_in_flight():
    two = P.memory(TINY, P.Plan(dp=1, tp=1, pp=2, micro_batches=2))
    eight = P.memory(TINY, P.Plan(dp=1, tp=1, pp=2, micro_batches=8))
    per_layer_8 = P.activation_bytes_per_layer(TINY, P.Plan(dp=1, tp=1, pp=2, micro_batches=8))
    # one layer a stage, two micro-batches in flight
    assert eight["activations"] == pytest.approx(1 * 2 * per_layer_8)
    assert eight["activations"] < two["activations"]


def test_recomputation_makes_a_plan_fit():
    plan = P.Plan(dp=8, tp=1, pp=1, zero=3, micro_batches=2)  # 32 sequences a micro-batch
    full, recomputed = (P.memory(GPT_7B, P.Plan(dp=8, tp=1, pp=1, zero=3, micro_batches=2,
                                                recompute=r)) for r in (False, True))
    limit = (full["total"] + recomputed["total"]) / 2
    small = P.Cluster(**{**NODE.__dict__, "memory": limit})
    ranked = {r.plan: r for r in P.rank_plans(GPT_7B, small)}
    assert not ranked[plan].fits
    assert ranked[P.Plan(dp=8, tp=1, pp=1, zero=3, micro_batches=2, recompute=True)].fits


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
        assert plan.pp == 1 or plan.micro_batches >= plan.pp  # 1F1B's requirement
    assert any(p.pp == 1 and p.micro_batches > 1 for p in P.candidate_plans(GPT_7B, NODE))


def test_float32_state_and_an_untied_head_count_what_tiny_gpt_holds():
    from course_lib.models import tiny_gpt

    gpt = tiny_gpt(vocab=96, d_model=64, layers=4, heads=4, context=32)
    model = P.Transformer(layers=4, hidden=64, heads=4, seq=32, vocab=96, global_batch=8,
                          value_bytes=4, tied_head=False)
    numel = sum(p.numel() for p in gpt.parameters())
    assert model.parameters == numel
    psi = 1000
    assert P.state_bytes(psi, 4, 0, 4) == 16 * psi
    assert P.state_bytes(psi, 4, 1, 4) == 4 * psi + 4 * psi + 8 * psi / 4
    assert P.state_bytes(psi, 4, 2, 4) == 4 * psi + (4 + 8) * psi / 4
    assert P.state_bytes(psi, 4, 3, 4) == 16 * psi / 4
    assert P.state_bytes(psi, 4, 1, 2) == 4 * psi + 12 * psi / 4  # ZeRO's mixed precision
    with pytest.raises(ValueError, match="value_bytes"):
        P.state_bytes(psi, 4, 1, 8)


def test_tiny_gpt_layer_bytes_match_what_autograd_saves():
    import torch

    from course_lib import train_gpt
    from course_lib.models import tiny_gpt

    model = P.Transformer(layers=4, hidden=64, heads=4, seq=32, vocab=96, global_batch=8,
                          value_bytes=4, tied_head=False)
    gpt = tiny_gpt(vocab=96, d_model=64, layers=4, heads=4, context=32)
    for tp in (1, 2, 4):
        # one block split over tp ranks, run as rank 0 (f and g are the identity for tp = 1)
        block = train_gpt.ParallelBlock(gpt.blocks[0], 0, tp, group=None)
        block.tp = 1  # no group here: rank 0's share of the work, without the all-reduces
        saved = train_gpt.SavedBytes()
        x = torch.randn(8, 32, 64, requires_grad=True)
        with saved.hooks():
            block(x)
        per_layer = P.tiny_gpt_bytes_per_layer(model, P.Plan(dp=1, tp=tp, pp=1))
        # the block's input is saved by the first LayerNorm: it is x itself, a leaf here
        assert saved.peak == pytest.approx(per_layer, rel=1e-9), tp


def test_candidate_plans_on_a_big_cluster_use_divisors_and_micro_batch_sizes():
    cluster = P.Cluster(gpus_per_node=8, nodes=192, memory=80 * 2**30, peak_flops=312e12,
                        intra_bandwidth=300e9, inter_bandwidth=25e9)
    model = P.Transformer(layers=80, hidden=12288, heads=96, seq=2048, vocab=51_200,
                          global_batch=2304)
    plans = P.candidate_plans(model, cluster)
    assert P.Plan(dp=24, tp=8, pp=8, zero=0, micro_batches=96) in plans  # Megatron's, b = 1
    for plan in plans:
        assert plan.dp * plan.tp * plan.pp == 1536 and plan.tp <= 8
        assert model.global_batch % (plan.dp * plan.micro_batches) == 0
        assert not (plan.zero == 3 and plan.pp > 1)
        assert plan.pp == 1 or plan.micro_batches >= plan.pp  # 1F1B's requirement


def test_the_torchrun_command_runs_the_plan_on_every_node():
    plan = P.Plan(dp=4, tp=8, pp=1, zero=1, micro_batches=4, recompute=True)
    one = P.torchrun_command(GPT_7B, NODE, P.Plan(dp=2, tp=4, pp=1))
    assert one.startswith("torchrun --standalone --nproc-per-node 8 -m course_lib.train_gpt")
    four = P.Cluster(**{**NODE.__dict__, "nodes": 4})
    cmd = P.torchrun_command(GPT_7B, four, plan)
    assert "--nnodes 4" in cmd and "$HEAD_NODE:$PORT" in cmd and "--recompute" in cmd
    assert "--dp 4 --tp 8 --pp 1 --zero 1 --micro-batches 4" in cmd
    assert "--layers 32 --d-model 4096 --heads 32 --context 2048" in cmd


def test_published_configurations_hold_what_the_papers_print():
    from course_lib import published as pub

    # Narayanan et al. 2021 print the parameter count of each row (equation 2 of the paper)
    for row, billions in zip(pub.THROUGHPUT, (1.7, 18.4, 39.1, 145.6), strict=True):
        assert row["model"].parameters / 1e9 == pytest.approx(billions, abs=0.06)
        assert row["gpus"] % (row["tp"] * row["pp"]) == 0
    for row in pub.ITERATION:
        assert row["plan"].tp * row["plan"].pp * row["plan"].dp == row["gpus"]
    # ZeRO's Table 1 is its own formula: 16 bytes a parameter, sharded stage by stage
    for row in pub.MEMORY[:3]:
        assert P.state_bytes(row["psi"], row["dp"], row["zero"]) / 1e9 == pytest.approx(
            row["gb"], abs=0.05)
    # 96 B s l h^2 (1 + s/6h + V/16lh) is 4/3 of 72 B s l h^2 (...): recomputation's extra forward
    model = pub.ITERATION[0]["model"]
    per_layer = pub.layer_flops(model, model.global_batch) * model.layers
    assert pub.megatron_flops(model) > 4 / 3 * per_layer
    cluster = pub.a100_cluster(32)
    assert (cluster.gpus_per_node, cluster.nodes, cluster.gpus) == (8, 4, 32)
    assert pub.a100_cluster(4).gpus == 4
    # one 22B layer at 150 teraFLOP/s of 312, all-reduces included; without the four
    # all-reduces of 2 s b h bytes over NVLink (about 0.66 ms each) the kernels ran at ~55 %
    assert pub.measured_mfu(all_reduces_out=False) == pytest.approx(0.48, abs=0.005)
    ring = 2 * 7 * 5e-6 + 2 * 7 / 8 * (2 * 2048 * 4 * 6144) / 300e9
    kernels = 19.6e-3 - 4 * ring
    assert pub.measured_mfu() == pytest.approx(0.48 * 19.6e-3 / kernels, rel=0.01)
    for row in pub.ZERO3_VS_PTDP:
        plan = row["plan"]
        assert plan.dp * plan.tp * plan.pp == row["gpus"]
        assert pub.GPT_175B.global_batch % (plan.dp * plan.micro_batches) == 0


def test_why_speaks_in_mib_below_a_gib():
    assert P.size(3 * 2**30) == "3.0 GiB" and P.size(2.5 * 2**20) == "2.50 MiB"
    tiny = P.Transformer(layers=2, hidden=8, heads=2, seq=4, vocab=10, global_batch=4)
    two = P.Cluster(gpus_per_node=2, nodes=1, memory=2**30, peak_flops=1e9,
                    intra_bandwidth=1e9, inter_bandwidth=1e9)
    ranked = P.rank_plans(tiny, two)
    assert "MiB" in P.why(ranked[0], ranked[1]) or "x the best step" in P.why(ranked[0],
                                                                              ranked[1])
