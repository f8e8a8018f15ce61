"""The strategy planner (course_lib.planner, plans, stages, gpu_memory, step_time) on
hand-computed cases."""

import math
from dataclasses import replace

import numpy as np
import pytest

from course_lib import cost_models as M
from course_lib import planner as P
from course_lib import published as pub
from course_lib.step_time import OVERLAP_SLOWDOWN

TINY = P.Transformer(layers=2, hidden=4, heads=2, seq=8, vocab=10, global_batch=8)
GPT_7B = P.Transformer(layers=32, hidden=4096, heads=32, seq=2048, vocab=50_257,
                       global_batch=512)
NODE = P.Cluster(gpus_per_node=8, nodes=1, memory=80 * 2**30, peak_flops=312e12,
                 intra_bandwidth=300e9, inter_bandwidth=25e9)


def test_parameters_and_both_flop_conventions_by_hand():
    # a block of GPT-2's shape: 12 h^2 + 13 h = 244; embeddings (10 + 8) x 4
    assert TINY.layer_parameters == 244
    assert TINY.parameters == 2 * 244 + 72
    tokens = 8 * 8
    forward = 2 * 244 + 4 * 4 * 8  # per token and layer: 2 per weight, scores 4 h s
    head = 2 * 10 * 4
    assert TINY.model_flops() == 3 * (2 * forward + head) * tokens
    assert TINY.hardware_flops() == TINY.model_flops()
    assert TINY.hardware_flops(recompute=True) == TINY.model_flops() + 2 * forward * tokens
    # selective recomputation repeats attention's scores only
    assert TINY.hardware_flops(attention="recomputed") == TINY.model_flops() + 2 * 128 * tokens


def test_hardware_flops_with_recomputation_are_megatrons_equation_3():
    from course_lib.published import megatron_flops

    for model in (GPT_7B, P.Transformer(layers=96, hidden=12288, heads=96, seq=2048,
                                        vocab=51_200, global_batch=1536)):
        # equal but for the biases and norms (13 h a layer) and position embeddings
        assert model.hardware_flops(recompute=True) == pytest.approx(megatron_flops(model),
                                                                     rel=2e-3)
        assert model.model_flops() < model.hardware_flops(recompute=True)


def test_grouped_query_attention_and_a_gated_mlp_count_their_weights():
    llama = P.Transformer(layers=1, hidden=64, heads=8, seq=16, vocab=10, global_batch=1,
                          ffn=96, gated_mlp=True, kv_heads=2)
    k = 64 * 2 // 8  # key width
    assert llama.kv_width == k
    assert llama.layer_parameters == (2 * 64 * 64 + 2 * 64 * k + 2 * 64 + 2 * k
                                      + 3 * 64 * 96 + 2 * 96 + 64 + 4 * 64)


def test_memory_terms_by_hand():
    plan = P.Plan(dp=2, tp=2, pp=1, zero=1, micro_batches=1)
    mem = P.memory(TINY, plan)
    share = TINY.parameters / 2
    assert mem["state"] == pytest.approx(4 * share + 12 * share / 2)
    s, b, h, a, t = 8, 8 / 2, 4, 2, 2  # b: sequences per micro-batch on a dp rank
    per_layer = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))  # Korthikanti et al.'s count
    head = s * b * (2 * 2 * h + 4 * 10 / t)  # two inputs in bf16, float32 logits split over t
    assert mem["activations"] == pytest.approx(2 * per_layer + head)
    recomputed = P.memory(TINY, replace(plan, recompute=True))
    # each layer's input, plus the rest of one layer while backward recomputes it
    kept = 2 * s * b * h
    assert recomputed["activations"] == pytest.approx(2 * kept + (per_layer - kept) + head)
    assert mem["total"] == pytest.approx(mem["state"] + mem["activations"])


def test_flash_attention_and_sequence_parallelism_split_what_they_should():
    plan = P.Plan(dp=1, tp=2, pp=1, micro_batches=1)
    s, b, h, a, t = 8, 8, 4, 2, 2
    tokens = s * b
    flash = P.activation_bytes_per_layer(TINY, replace(plan, attention="flash"))
    assert flash == pytest.approx(tokens * (10 * h + 24 * h / t + 4 * a / t))
    selective = P.activation_bytes_per_layer(TINY, replace(plan, attention="recomputed"))
    assert selective == pytest.approx(tokens * h * (10 + 24 / t))
    sp = P.activation_bytes_per_layer(TINY, replace(plan, attention="recomputed",
                                                    sequence_parallel=True))
    assert sp == pytest.approx(tokens * h * 34 / t)  # Korthikanti et al.'s Table 2
    full_sp = P.activation_bytes_per_layer(TINY, replace(plan, recompute=True,
                                                         sequence_parallel=True))
    assert full_sp == pytest.approx(2 * tokens * h / t)


@pytest.mark.parametrize("layers", [1, 2, 3, 4])
def test_recomputation_never_predicts_more_memory(layers):
    model = P.Transformer(layers=layers, hidden=64, heads=4, seq=256, vocab=100,
                          global_batch=8)
    for pp in (p for p in (1, 2, 4) if p <= layers and layers % p == 0):
        for tp, m, attention, sp in ((1, 1, "stored", False), (2, 2, "flash", True),
                                     (2, 8, "stored", False), (1, 4, "flash", False)):
            plan = P.Plan(dp=1, tp=tp, pp=pp, micro_batches=max(m, pp), attention=attention,
                          sequence_parallel=sp)
            full, recomputed = P.memory(model, plan), P.memory(model, replace(plan,
                                                                              recompute=True))
            assert recomputed["activations"] <= full["activations"] * (1 + 1e-12), plan
            assert recomputed["total"] <= full["total"] * (1 + 1e-12), plan
            stored = P.memory(model, replace(plan, attention="stored"))
            selective = P.memory(model, replace(plan, attention="recomputed"))
            assert selective["total"] <= stored["total"] * (1 + 1e-12), plan


def test_uneven_stages_memory_stage_by_stage_by_hand():
    model = P.Transformer(layers=5, hidden=8, heads=2, seq=4, vocab=10, global_batch=4)
    s, b, h, a = 4, 1, 8, 2
    layer = s * b * h * (10 + 24 + 5 * a * s / h)
    head = s * b * (2 * 2 * h + 4 * 10)
    p_layer = model.layer_parameters
    for stages in ((2, 3), (3, 2)):
        plan = P.Plan(dp=1, tp=1, pp=2, micro_batches=4, stages=stages)
        # stage 0: its layers and the embeddings, two micro-batches in flight (1F1B, p - s);
        # stage 1: its layers, a copy of the tied head's weights, one micro-batch and the head
        first = 16 * (stages[0] * p_layer + model.embedding_parameters) + 2 * stages[0] * layer
        last = 16 * (stages[1] * p_layer + model.vocab * h) + 1 * stages[1] * layer + head
        mem = P.memory(model, plan)
        assert mem["total"] == pytest.approx(max(first, last))
        assert mem["stage"] == (0 if first > last else 1)
    with pytest.raises(ValueError, match="hold 4 layers, the model has 5"):
        P.memory(model, P.Plan(dp=1, tp=1, pp=2, micro_batches=4, stages=(2, 2)))
    with pytest.raises(ValueError, match="does not divide the 5 layers"):
        P.memory(model, P.Plan(dp=1, tp=1, pp=2, micro_batches=4))


def test_balanced_stages_put_the_lighter_stages_at_the_ends():
    assert P.balanced_stages(70, 12) == (5,) + (6,) * 10 + (5,)  # BLOOM
    assert P.balanced_stages(126, 16) == (7,) + (8,) * 14 + (7,)  # Llama 3 405B
    assert all(type(n) is int for n in P.balanced_stages(np.int64(10), np.int64(3)))
    assert P.balanced_stages(10, 4) == (2, 3, 3, 2)
    assert P.balanced_stages(8, 4) == (2, 2, 2, 2)
    with pytest.raises(ValueError, match="cannot fill"):
        P.balanced_stages(3, 4)


def test_in_flight_micro_batches_follow_the_schedules():
    from course_lib.interleaving import interleaved_order

    assert [P.in_flight(P.Plan(dp=1, tp=1, pp=4, micro_batches=8), s) for s in range(4)] == \
        [4, 3, 2, 1]
    assert P.in_flight(P.Plan(dp=1, tp=1, pp=4, micro_batches=2), 0) == 2
    p, v, m = 4, 3, 8
    plan = P.Plan(dp=1, tp=1, pp=p, micro_batches=m, chunks=v)
    for stage in range(p):  # the most chunk forwards awaiting their backward, over v
        live = peak = 0
        for kind, _, _ in interleaved_order(stage, p, v, m):
            live += 1 if kind == "forward" else -1
            peak = max(peak, live)
        assert P.in_flight(plan, stage) == pytest.approx(peak / v)
    assert P.in_flight(plan, 0) == pytest.approx(p * (1 + (p - 1) / (p * v)))
    for stage in (10, -1, 1.0, True):  # 10 used to give -6 micro-batches, -1 more than p
        with pytest.raises(ValueError, match="stage must be a whole number from 0 to pp - 1"):
            P.in_flight(P.Plan(dp=1, tp=1, pp=4, micro_batches=8), stage)


def test_accumulation_leaves_only_the_last_backward_to_hide_the_all_reduce():
    model = P.Transformer(layers=2, hidden=2048, heads=16, seq=128, vocab=1000,
                          global_batch=64)
    grads = 2 * model.parameters  # bf16 gradients of the whole model on each of 2 ranks
    # no latency; the 2-rank ring sends 2 (p - 1) / p = 1 x the gradients: exactly 1 s; a step
    # computes for 3 s on each rank, 2 s of it backward
    two = P.Cluster(gpus_per_node=1, nodes=2, memory=1e12,
                    peak_flops=model.model_flops() / (2 * 3.0), intra_bandwidth=1.0,
                    inter_bandwidth=grads, intra_latency=0, inter_latency=0, mfu=1.0)
    layer = 2 * model.layer_parameters
    buckets = math.ceil(grads / layer)  # buckets of a layer's gradients (over 25 MiB here)
    assert layer > 25 * 2**20 and buckets == 3
    last = 1.0 / buckets  # the last bucket is ready only when backward ends
    sigma = OVERLAP_SLOWDOWN
    one = P.step_time(model, two, P.Plan(dp=2, tp=1, pp=1, micro_batches=1))
    assert one["compute"] == pytest.approx(3.0)
    assert one["data_parallel"] == pytest.approx(last + sigma * (1 - last))
    # 16 micro-batches: only the last one's backward, 2/16 s, is left to hide the 1 s
    sixteen = P.step_time(model, two, P.Plan(dp=2, tp=1, pp=1, micro_batches=16))
    assert sixteen["data_parallel"] == pytest.approx((1 - 2 / 16) + sigma * 2 / 16)
    assert sixteen["data_parallel"] > 1.9 * one["data_parallel"]
    after = P.step_time(model, two, P.Plan(dp=2, tp=1, pp=1), overlap=False)
    assert after["data_parallel"] == pytest.approx(1.0)  # nothing hides


def test_interleaving_divides_the_bubble_by_its_chunks():
    model = P.Transformer(layers=16, hidden=512, heads=8, seq=128, vocab=1, global_batch=8)
    one_gpu_each = P.Cluster(gpus_per_node=1, nodes=4, memory=1e12, peak_flops=1e12,
                             intra_bandwidth=1e11, inter_bandwidth=1e11)
    for v in (1, 2, 4):
        t = P.step_time(model, one_gpu_each, P.Plan(dp=1, tp=1, pp=4, micro_batches=8,
                                                    chunks=v))
        # (p - 1) / (v m) of the compute (a one-word vocabulary: the head adds next to nothing)
        assert t["bubble"] / t["compute"] == pytest.approx(3 / (v * 8), rel=1e-3)


def test_context_parallelism_splits_each_sequence_and_pays_the_rings_sends():
    long = replace(GPT_7B, seq=32_768, global_batch=8)
    data, context = P.Plan(dp=8, tp=1, pp=1), P.Plan(dp=1, tp=1, pp=1, cp=8)
    # a GPU computes on a cp-th of each sequence: the same tokens, FLOPs and activations as
    # data parallelism's whole sequences on as many GPUs
    for term in ("activations", "state"):
        assert P.memory(long, context)[term] == pytest.approx(P.memory(long, data)[term])
    assert P.memory(long, context)["activations"] == pytest.approx(
        P.memory(long, P.Plan(dp=1, tp=1, pp=1))["activations"] / 8)
    one, ring = (P.step_time(long, NODE, plan, overlap=False) for plan in (data, context))
    assert ring["compute"] == pytest.approx(one["compute"]) and one["context_parallel"] == 0
    # ZeRO shards over the dp x cp GPUs that hold the same layers
    assert P.memory(long, replace(context, dp=2, cp=4, zero=1))["state"] == pytest.approx(
        P.memory(long, replace(data, zero=1))["state"])
    # not hidden: 3 (cp - 1) sends per layer of a key and a value block (a GPU's tokens, the
    # cp-th of the batch's); hidden under attention, less
    alpha, beta = NODE.link(8, 1)
    block = 2 * long.value_bytes * (long.seq * long.global_batch / 8) * long.kv_width
    assert ring["context_parallel"] == pytest.approx(long.layers * 3 * 7 * (alpha + beta * block))
    hidden = P.step_time(long, NODE, context)["context_parallel"]
    assert hidden < 0.5 * ring["context_parallel"]
    assert P.collectives(long, context) == 3 * 7 * long.layers + 1


def test_cp_choices_are_checked_and_the_gradients_cp_group_takes_its_own_link():
    model = P.Transformer(layers=4, hidden=64, heads=4, seq=30, vocab=96, global_batch=8)
    four = P.Cluster(gpus_per_node=4, nodes=1, memory=1e12, peak_flops=1e12,
                     intra_bandwidth=1e11, inter_bandwidth=1e10)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="cp must be a positive whole number"):
            P.candidate_plans(model, four, cp=(bad,))
    with pytest.raises(ValueError, match=r"2 x cp the sequence \(30\)"):
        P.rank_plans(model, four, cp=(2,))
    assert len(P.candidate_plans(model, four, cp=(1, 1))) == len(P.candidate_plans(model, four))
    # a stage listed thrice counts once; a single value is refused by name, not read letter by
    # letter ('flash' as 'f', 'l', ...) or failing as "'int' object is not iterable"
    assert len(P.candidate_plans(model, four, zero_stages=(0, 0, 0))) == \
        len(P.candidate_plans(model, four, zero_stages=(0,)))
    for option, value in (("attention", "flash"), ("zero_stages", 3), ("recompute", True)):
        with pytest.raises(ValueError, match=f"{option} lists the choices to search"):
            P.candidate_plans(model, four, **{option: value})
    # dp 1, cp 2 inside tp 4 x pp 2 on two nodes of 8: the cp pair is 4 apart, in one node
    two_nodes = P.Cluster(gpus_per_node=8, nodes=2, memory=1e12, peak_flops=1e12,
                          intra_bandwidth=1e11, inter_bandwidth=1e9, intra_latency=0,
                          inter_latency=0)
    long = replace(GPT_7B, seq=4096, global_batch=8)
    plan = P.Plan(dp=1, tp=4, pp=2, cp=2, micro_batches=2)
    grads = 2 * long.value_bytes * long.layers * long.layer_parameters / (4 * 2)  # a stage's
    got = P.step_time(long, two_nodes, plan, overlap=False)["data_parallel"]
    assert got < grads / 1e11  # priced at NVLink's speed, not the 1 GB/s between nodes


MOE_7B = replace(GPT_7B, experts=8, top_k=2, global_batch=64, tied_head=False, dropout=False)
AS_RUN = dict(tied_head=False, dropout=False)  # train_gpt's GPT: its own head, no dropout


def test_experts_count_every_expert_held_and_only_the_chosen_ones_computed():
    import torch

    from course_lib.experts import model_of

    gpt = model_of(dict(vocab=96, d_model=64, layers=4, heads=4, context=32, experts=4,
                        top_k=2), 0, torch.float32)
    model = P.Transformer(layers=4, hidden=64, heads=4, seq=32, vocab=96, global_batch=8,
                          value_bytes=4, tied_head=False, experts=4, top_k=2)
    assert model.parameters == sum(p.numel() for p in gpt.parameters())
    h, mlp = 4096, 8 * 4096 * 4096 + 4 * 4096 + 4096  # one MLP: 2 h f weights, f + h biases
    dense = GPT_7B.layer_parameters
    assert MOE_7B.mlp_parameters == mlp and MOE_7B.expert_parameters == 8 * mlp
    assert MOE_7B.layer_parameters == dense + 7 * mlp + 8 * h  # 8 MLPs and a router
    assert MOE_7B.active_layer_parameters == dense + mlp + 8 * h  # a token uses 2 of them
    per = MOE_7B.forward_flops_per_token()["layer"]
    assert per == 2 * (dense + mlp + 8 * h) + 4 * h * GPT_7B.seq
    shared = replace(MOE_7B, shared_experts=1)
    assert shared.layer_parameters - MOE_7B.layer_parameters == mlp
    assert shared.active_layer_parameters - MOE_7B.active_layer_parameters == mlp
    for change, match in ((dict(top_k=9), "more experts than the 8"),
                          (dict(experts=-1), "experts must be a whole number"),
                          (dict(experts=0, shared_experts=1), "need experts > 0"),
                          (dict(experts=0), "need experts > 0")):  # top_k 2 without experts
        with pytest.raises(ValueError, match=match):
            replace(MOE_7B, **change)


def test_expert_parallelism_divides_the_experts_state_and_pays_two_all_to_alls_each_way():
    data, spread = P.Plan(dp=8, tp=1, pp=1), P.Plan(dp=8, tp=1, pp=1, ep=8)
    layers, mlp = MOE_7B.layers, MOE_7B.mlp_parameters
    psi = MOE_7B.parameters
    assert P.memory(MOE_7B, data)["state"] == pytest.approx(16 * psi)
    experts = layers * 8 * mlp
    assert P.memory(MOE_7B, spread)["state"] == pytest.approx(16 * (psi - experts + experts / 8))
    # ZeRO-1 over 8: the rest's state over 8 GPUs, each expert's over the 8 / ep = 1 holding it
    zero = P.memory(MOE_7B, replace(spread, zero=1))["state"]
    assert zero == pytest.approx(P.state_bytes(psi - experts, 8, 1) + 16 * experts / 8)
    assert P.memory(MOE_7B, spread)["activations"] == P.memory(MOE_7B, data)["activations"]
    # 4 all-to-alls a layer (dispatch and combine, forward and backward) of a GPU's tokens x
    # top_k x h values among the 8 GPUs of the node; the same compute
    one, ep = (P.step_time(MOE_7B, NODE, plan, overlap=False) for plan in (data, spread))
    assert one["expert_parallel"] == 0 and ep["compute"] == pytest.approx(one["compute"])
    alpha, beta = NODE.link(8, 1)
    routed = 2 * (64 / 8 * GPT_7B.seq) * 2 * 4096
    assert ep["expert_parallel"] == pytest.approx(
        layers * 4 * float(M.all_to_all_time(routed, 8, alpha, beta)))
    assert P.step_time(MOE_7B, NODE, spread)["expert_parallel"] < ep["expert_parallel"]
    assert P.collectives(MOE_7B, spread) == P.collectives(MOE_7B, data) + 4 * layers
    # ZeRO-3 gathers what a GPU holds of a block, 1/ep of its experts; an expert's state is
    # sharded over the 8 / ep = 1 GPU holding it
    three = replace(spread, zero=3)
    gathered = 2 * 2 * (MOE_7B.layer_parameters - experts / layers + experts / layers / 8)
    assert P.memory(MOE_7B, three)["state"] == pytest.approx(
        16 * (psi - experts) / 8 + 16 * experts / 8 + gathered)
    # an expert's gradients go over the GPUs that hold it: with ep = dp none, half of them with
    # ep = dp / 2 (a ring sends (p - 1)/p of its data: 1/2 on 2 GPUs, 7/8 on 8)
    from course_lib.step_time import ring_equivalent
    assert ring_equivalent(100.0, 60.0, spread) == pytest.approx(40.0)
    assert ring_equivalent(100.0, 60.0, replace(spread, ep=4)) == pytest.approx(40 + 60 * 4 / 7)
    assert ring_equivalent(100.0, 60.0, data) == pytest.approx(100.0)
    dp_seconds = {e: P.step_time(MOE_7B, NODE, replace(data, ep=e), overlap=False)
                  ["data_parallel"] for e in (1, 8)}
    assert dp_seconds[8] < 0.5 * dp_seconds[1]


@pytest.mark.parametrize("model, plan, match", [
    (GPT_7B, P.Plan(dp=8, tp=1, pp=1, ep=2), "spreads a model's experts, and this one has none"),
    (MOE_7B, P.Plan(dp=8, tp=1, pp=1, ep=16), "does not divide the 8 experts"),
    (MOE_7B, P.Plan(dp=2, tp=1, pp=1, ep=4, zero=1), "ep = 4 must divide dp = 2"),
    (replace(MOE_7B, experts=12), P.Plan(dp=6, tp=1, pp=1, ep=4), "ep = 4 must divide dp = 6"),
    (replace(GPT_7B, seq=8), P.Plan(dp=1, tp=1, pp=1, cp=8), "2 x cp = 16 equal chunks: 8 tokens"),
    (replace(GPT_7B, seq=30), P.Plan(dp=1, tp=1, pp=1, cp=2), "30 tokens do not split so")])
def test_predictions_refuse_a_cp_or_ep_that_cannot_split_the_model(model, plan, match):
    for predict in (lambda: P.step_time(model, NODE, plan), lambda: P.memory(model, plan)):
        with pytest.raises(ValueError, match=match):
            predict()


def test_ep_choices_follow_the_rules_and_the_planner_models_zero_with_experts():
    plans = P.candidate_plans(MOE_7B, NODE, ep=(1, 2, 8))
    assert {p.ep for p in plans} == {1, 2, 8}
    assert all(p.dp % p.ep == 0 and p.tp == 1 for p in plans if p.ep > 1)
    assert any(p.ep == 8 and p.zero == 1 for p in plans)  # train_gpt's refusal is its own
    assert {p.ep for p in P.candidate_plans(GPT_7B, NODE, ep=(1, 2))} == {1}  # no experts
    with pytest.raises(ValueError, match="ep must be a positive whole number"):
        P.candidate_plans(MOE_7B, NODE, ep=(0,))
    command = P.torchrun_command(MOE_7B, NODE, P.Plan(dp=8, tp=1, pp=1, ep=2))
    assert "--ep 2 --zero 0" in command and command.endswith("--experts 8 --top-k 2 --steps 10")
    with pytest.raises(ValueError, match="no shared experts"):
        P.torchrun_command(replace(MOE_7B, shared_experts=1), NODE, P.Plan(dp=8, tp=1, pp=1))
    for other in (dict(gated_mlp=True), dict(ffn=1000), dict(kv_heads=8, experts=0, top_k=1)):
        with pytest.raises(ValueError, match="plain MLP 4 x d_model wide"):  # another model
            P.torchrun_command(replace(MOE_7B, **other), NODE, P.Plan(dp=8, tp=1, pp=1))
    for steps in (0, -3, 2.5):
        with pytest.raises(ValueError, match="steps must be a positive whole number"):
            P.torchrun_command(MOE_7B, NODE, P.Plan(dp=8, tp=1, pp=1), steps=steps)
    assert "--precision bf16" in command  # 2-byte values: bf16 mixed precision
    fp32 = P.torchrun_command(replace(MOE_7B, value_bytes=4), NODE, P.Plan(dp=8, tp=1, pp=1))
    assert "--precision" not in fp32
    with pytest.raises(ValueError, match="micro_batch_sizes must be a positive whole number"):
        P.candidate_plans(MOE_7B, NODE, micro_batch_sizes=(0,))
    with pytest.raises(ValueError, match="zero must be a ZeRO stage"):
        P.Plan(dp=8, tp=1, pp=1, zero=1.0)


def test_a_published_run_with_expert_parallelism_is_predicted_within_a_third():
    from course_lib import validation as V
    from course_lib.published_experts import DEEPSEEK_V3, EXPERT_RUN

    assert 650e9 < DEEPSEEK_V3.parameters < 720e9  # 671B, plus what the shape adds (its note)
    assert 36e9 < DEEPSEEK_V3.layers * DEEPSEEK_V3.active_layer_parameters < 38e9  # 37B used
    c = V.compare(EXPERT_RUN, pub.measured_mfu())
    assert c["candidate"] and c["ranked"].plan.ep == 64
    assert 0.75 <= c["ratio"] <= 1.33, c["ratio"]
    # its memory as the module's note says: over 80 GiB, all of the excess activations
    memory = c["ranked"].memory
    assert not c["fits"] and memory["state"] < 20 * 2**30 < 80 * 2**30 < memory["total"]


def test_a_long_context_run_needs_the_cp_axis_to_exist():
    run = next(r for r in pub.RUNS if r.plan.get("cp", 1) > 1)  # Llama 3 at 131,072 tokens
    cluster = pub.cluster_of(run, pub.measured_mfu())
    with pytest.raises(ValueError, match="no plan uses all 16384 GPUs"):
        P.rank_plans(run.model, cluster, **{**run.options, "cp": (1,)})
    ranked = P.with_plan(P.rank_plans(run.model, cluster, **run.options), **run.plan)
    assert ranked and ranked[0].fits and ranked[0].plan.cp == 16
    two = P.Cluster(gpus_per_node=2, nodes=1, memory=1e12, peak_flops=1e12,
                    intra_bandwidth=1e11, inter_bandwidth=1e11)
    tiny = replace(TINY, **AS_RUN)
    command = P.torchrun_command(replace(tiny, vocab=96), two, P.Plan(dp=1, tp=1, pp=1, cp=2))
    assert "--dp 1 --tp 1 --pp 1 --cp 2 --zero 0" in command
    with pytest.raises(ValueError, match="vocab \\(10\\) must be at least the 96 characters"):
        P.torchrun_command(tiny, two, P.Plan(dp=1, tp=1, pp=1, cp=2))  # train_gpt would refuse


def test_tensor_parallel_all_reduces_count_the_recomputed_forward():
    plan = P.Plan(dp=1, tp=8, pp=1, micro_batches=4)
    plain, again = (P.step_time(GPT_7B, NODE, replace(plan, recompute=r))["tensor_parallel"]
                    for r in (False, True))
    assert again == pytest.approx(plain * 6 / 4)


def test_tensor_parallelism_across_nodes_loses_to_pipeline_parallelism():
    model = P.Transformer(layers=8, hidden=1024, heads=8, seq=1024, vocab=32_000,
                          global_batch=16)
    two_nodes = P.Cluster(gpus_per_node=1, nodes=2, memory=80 * 2**30, peak_flops=312e12,
                          intra_bandwidth=300e9, inter_bandwidth=12.5e9)
    across = P.step_time(model, two_nodes, P.Plan(dp=1, tp=2, pp=1))
    piped = P.step_time(model, two_nodes, P.Plan(dp=1, tp=1, pp=2, micro_batches=8))
    assert across["tensor_parallel"] > 0 and piped["tensor_parallel"] == 0
    assert piped["total"] < across["total"]
    assert all(r.plan.tp == 1 for r in P.rank_plans(model, two_nodes))


def test_the_ranking_puts_fitting_plans_first_fastest_first_and_says_why():
    ranked = P.rank_plans(GPT_7B, NODE)
    fits = [r for r in ranked if r.fits]
    assert fits and all(r.fits for r in ranked[:len(fits)])
    times = [P.to_three_figures(r.time["total"]) for r in fits]
    assert times == sorted(times)
    slower = next(r for r in fits if r.time["total"] > 1.01 * fits[0].time["total"])
    assert "x the best step, most of it" in P.why(fits[0], slower)
    loser = next(r for r in ranked if not r.fits)
    assert "GiB per GPU" in P.why(fits[0], loser)
    tie = next(r for r in fits[1:] if P.to_three_figures(r.time["total"]) ==
               P.to_three_figures(fits[0].time["total"]))
    assert "as fast as the best" in P.why(fits[0], tie)
    smaller = replace(fits[0], micro_batch=fits[0].micro_batch / 2)
    assert f"micro-batches of {smaller.micro_batch:g} sequences" in P.why(fits[0], smaller)
    with pytest.raises(TypeError, match="other is a Plan: rank it with rank_plans first"):
        P.why(fits[0], fits[1].plan)


def test_ties_go_to_fewer_collectives_then_larger_micro_batches():
    ranked = [r for r in P.rank_plans(GPT_7B, NODE) if r.fits]
    for a, b in zip(ranked, ranked[1:], strict=False):
        if P.to_three_figures(a.time["total"]) == P.to_three_figures(b.time["total"]):
            assert (a.collectives, -a.micro_batch) <= (b.collectives, -b.micro_batch)
    # accumulation is not free any more: more micro-batches of ZeRO-1 never predict faster
    z1 = {r.plan.micro_batches: r.time["total"] for r in ranked
          if (r.plan.dp, r.plan.zero, r.plan.attention, r.plan.recompute) == (8, 1, "flash",
                                                                                False)}
    assert [z1[m] for m in sorted(z1)] == sorted(z1.values())


def test_plans_slower_than_one_gpu_or_plain_data_parallelism_say_so():
    tiny = P.Transformer(layers=2, hidden=64, heads=4, seq=32, vocab=96, global_batch=8,
                         value_bytes=4, tied_head=False)
    slow_link = P.Cluster(gpus_per_node=2, nodes=1, memory=2**30, peak_flops=1e9,
                          intra_bandwidth=1e6, inter_bandwidth=1e6, intra_latency=1e-3, mfu=1)
    ranked = P.rank_plans(tiny, slow_link, overlap=False)
    tensor = next(r for r in ranked if r.plan.tp == 2)
    assert tensor.time["total"] > P.one_gpu_seconds(tiny, slow_link, tensor.plan)
    assert any("slower than one GPU" in note for note in tensor.notes)
    assert any("slower than plain data parallelism" in note for note in tensor.notes)
    fast = P.rank_plans(tiny, replace(slow_link, intra_bandwidth=1e15, intra_latency=0.0))
    assert not any("slower than one GPU" in n for r in fast if r.plan.tp == 1 for n in r.notes)


def test_candidates_respect_the_rules():
    plans = P.candidate_plans(GPT_7B, NODE)
    assert len(set(plans)) == len(plans)  # no plan twice
    for plan in plans:
        assert plan.dp * plan.tp * plan.pp == 8
        assert GPT_7B.heads % plan.tp == 0 and GPT_7B.layers % plan.pp == 0
        assert GPT_7B.global_batch % (plan.dp * plan.micro_batches) == 0
        assert not (plan.zero == 3 and plan.pp > 1) and not (plan.zero and plan.dp == 1)
        assert plan.pp == 1 or plan.micro_batches >= plan.pp  # 1F1B's requirement
        assert plan.chunks == 1 or (plan.micro_batches % plan.pp == 0
                                    and (GPT_7B.layers // plan.pp) % plan.chunks == 0)
        assert not (plan.sequence_parallel and plan.tp == 1)
    assert any(p.chunks > 1 for p in plans) and any(p.sequence_parallel for p in plans)
    odd = P.Transformer(layers=30, hidden=1024, heads=8, seq=512, vocab=1000, global_batch=64)
    assert any(p.stages == (3,) + (4,) * 6 + (3,) for p in P.candidate_plans(
        odd, P.Cluster(**{**NODE.__dict__, "nodes": 1})))


def test_float32_state_and_an_untied_head_count_what_tiny_gpt_holds():
    from course_lib.models import tiny_gpt

    gpt = tiny_gpt(vocab=96, d_model=64, layers=4, heads=4, context=32)
    model = P.Transformer(layers=4, hidden=64, heads=4, seq=32, vocab=96, global_batch=8,
                          value_bytes=4, tied_head=False)
    assert model.parameters == sum(p.numel() for p in gpt.parameters())
    psi = 1000
    assert P.state_bytes(psi, 4, 0, 4) == 16 * psi
    assert P.state_bytes(psi, 4, 1, 4) == 4 * psi + 4 * psi + 8 * psi / 4
    assert P.state_bytes(psi, 4, 2, 4) == 4 * psi + (4 + 8) * psi / 4
    assert P.state_bytes(psi, 4, 3, 4) == 16 * psi / 4
    assert P.state_bytes(psi, 4, 1, 2) == 4 * psi + 12 * psi / 4  # ZeRO's mixed precision
    with pytest.raises(ValueError, match="value_bytes"):
        P.state_bytes(psi, 4, 1, 8)
    for value_bytes in (2, 4):  # float32 used to return -1200 or NaN, or a bare KeyError: 5
        with pytest.raises(ValueError, match="psi must be zero or more"):
            P.state_bytes(-100, 2, 1, value_bytes)
        with pytest.raises(ValueError, match="psi must be zero or more"):
            P.state_bytes(math.nan, 2, 1, value_bytes)
        with pytest.raises(ValueError, match="ZeRO stage must be one of"):
            P.state_bytes(100, 2, 5, value_bytes)


def rank_0_block_peaks(tps) -> dict:
    """On one rank (a group of one: f and g are the identity): the bytes autograd saves in the
    forward of rank 0's share of a block split tp ways, for each tp."""
    import torch

    from course_lib import train_gpt
    from course_lib.models import tiny_gpt
    from course_lib.tensor_parallel import ParallelBlock

    gpt = tiny_gpt(vocab=96, d_model=64, layers=4, heads=4, context=32)
    peaks = {}
    for tp in tps:
        block = ParallelBlock(gpt.blocks[0], 0, tp)
        saved = train_gpt.SavedBytes()
        x = torch.randn(8, 32, 64, requires_grad=True)
        with saved.hooks():
            block(x)
        peaks[tp] = saved.peak
    return peaks


def test_tiny_gpt_layer_bytes_match_what_autograd_saves():
    from course_lib import launch

    model = P.Transformer(layers=4, hidden=64, heads=4, seq=32, vocab=96, global_batch=8,
                          value_bytes=4, tied_head=False)
    peaks = launch(rank_0_block_peaks, 1, args=((1, 2, 4),))[0]
    for tp, peak in peaks.items():
        per_layer = P.tiny_gpt_bytes_per_layer(model, P.Plan(dp=1, tp=tp, pp=1))
        assert peak == pytest.approx(per_layer, rel=1e-9), tp


def test_the_torchrun_command_runs_the_plan_on_every_node():
    plan = P.Plan(dp=4, tp=8, pp=1, zero=1, micro_batches=4, recompute=True)
    gpt = replace(GPT_7B, **AS_RUN)
    one = P.torchrun_command(gpt, NODE, P.Plan(dp=2, tp=4, pp=1))
    assert one.startswith("torchrun --standalone --nproc-per-node 8 -m course_lib.train_gpt")
    four = P.Cluster(**{**NODE.__dict__, "nodes": 4})
    cmd = P.torchrun_command(gpt, four, plan)
    assert "--nnodes 4" in cmd and "$HEAD_NODE:$PORT" in cmd and "--recompute" in cmd
    assert cmd.startswith("torchrun --nnodes 4 --rdzv-backend c10d --rdzv-endpoint "
                          "$HEAD_NODE:$PORT --rdzv-id $JOB_ID --nproc-per-node 8 -m "
                          "course_lib.train_gpt ")
    assert "rdzv" not in one  # --standalone makes its own rendezvous
    assert "--dp 4 --tp 8 --pp 1 --zero 1 --micro-batches 4" in cmd
    for extra, word in ((dict(sequence_parallel=True), "sequence parallelism"),
                        (dict(pp=2, dp=2, chunks=2), "interleaving"),
                        (dict(attention="recomputed", recompute=False), "selective")):
        with pytest.raises(ValueError, match=word):
            P.torchrun_command(gpt, four, replace(plan, **extra))
    for other in (dict(tied_head=True), dict(dropout=True), dict(learned_positions=False)):
        with pytest.raises(ValueError, match="a head of its own, learned positions and no drop"):
            P.torchrun_command(replace(gpt, **other), four, plan)  # it would run another model


def test_why_speaks_in_mib_below_a_gib():
    assert P.size(3 * 2**30) == "3.0 GiB" and P.size(2.5 * 2**20) == "2.50 MiB"


INVALID = [
    (P.Cluster, dict(gpus_per_node=0), "gpus_per_node"), (P.Cluster, dict(nodes=-1), "nodes"),
    (P.Cluster, dict(memory=0), "memory"), (P.Cluster, dict(peak_flops=0), "peak_flops"),
    (P.Cluster, dict(intra_bandwidth=0), "intra_bandwidth"),
    (P.Cluster, dict(inter_bandwidth=-1e9), "inter_bandwidth"),
    (P.Cluster, dict(inter_latency=-1e-6), "inter_latency"), (P.Cluster, dict(mfu=0), "mfu"),
    (P.Cluster, dict(mfu=1.5), "mfu"), (P.Cluster, dict(nodes=1.5), "nodes"),
    (P.Transformer, dict(global_batch=0), "global_batch"),
    (P.Transformer, dict(layers=0), "layers"), (P.Transformer, dict(heads=-2), "heads"),
    (P.Transformer, dict(value_bytes=3), "value_bytes"),
    (P.Transformer, dict(kv_heads=3), "kv_heads"), (P.Transformer, dict(hidden=10), "hidden"),
    (P.Plan, dict(dp=0), "dp"), (P.Plan, dict(tp=-1), "tp"),
    (P.Plan, dict(micro_batches=0), "micro_batches"), (P.Plan, dict(zero=4), "zero"),
    (P.Plan, dict(attention="sparse"), "attention"), (P.Plan, dict(chunks=2), "chunks"),
    (P.Plan, dict(pp=2, stages=(1, 1, 1)), "stages"),
    (P.Plan, dict(pp=2, stages=(0, 2)), "stages"), (P.Plan, dict(recompute=1), "recompute"),
]
GOOD = {P.Cluster: NODE.__dict__, P.Transformer: GPT_7B.__dict__,
        P.Plan: dict(dp=1, tp=1, pp=1)}


@pytest.mark.parametrize("cls, change, field", INVALID)
def test_a_description_that_cannot_exist_is_refused_naming_the_field(cls, change, field):
    with pytest.raises(ValueError, match=field):
        cls(**{**GOOD[cls], **change})


def test_whole_numbers_from_numpy_make_the_same_plan_and_model_as_python_ints():
    import numpy as np
    plan = P.Plan(dp=np.int64(2), tp=1, pp=np.int32(2), stages=[np.int64(3), 3])
    assert plan == P.Plan(dp=2, tp=1, pp=2, stages=(3, 3)) and str(plan).startswith("dp 2 x")
    assert hash(plan) == hash(P.Plan(dp=2, tp=1, pp=2, stages=(3, 3)))
    assert all(type(v) is int for v in (plan.dp, plan.pp, *plan.stages))
    model = P.Transformer(**{**GPT_7B.__dict__, "layers": np.int64(4), "value_bytes": np.int64(2)})
    assert model == replace(GPT_7B, layers=4) and type(model.layers) is int
    cluster = P.Cluster(**{**NODE.__dict__, "nodes": np.int64(2)})
    assert cluster == replace(NODE, nodes=2) and type(cluster.nodes) is int
    with pytest.raises(ValueError, match="Plan.dp must be a positive whole number"):
        P.Plan(dp=np.float64(2.0), tp=1, pp=1)
    assert P.Plan(1, 1, 2, stages=np.array([2, 2])).stages == (2, 2)


@pytest.mark.parametrize("call", [
    lambda p: M.amdahl_speedup(p, 0.5), lambda p: M.gustafson_speedup(p, 0.5),
    lambda p: M.fit_amdahl([p, 2], [1.0, 1.5]), lambda p: M.fit_gustafson([p, 2], [1.0, 1.5]),
    lambda p: M.probability_any_fails(p, 0.01), lambda p: M.all_reduce_bytes("naive ring", 8, p),
    lambda p: M.ring_all_reduce_time(8, p, 1e-6, 1e-9), lambda p: M.bus_bandwidth(8, 1.0, p),
    lambda p: M.parameter_server_words(p, 10, "star"), lambda p: M.async_staleness(p),
    lambda p: M.federated_bytes_per_round(p, 10), lambda p: M.quantized_sum_error_bound(p, 0.1),
    lambda p: M.bubble_fraction(p, 4), lambda p: M.pipeline_timeline(p, 4),
    lambda p: M.megatron_bytes(8, 4, p), lambda p: M.zero_bytes_per_rank(1e6, p, 1),
    lambda p: P.state_bytes(1e6, p, 1, 4)])
@pytest.mark.parametrize("p", [0, -2])
def test_cost_models_refuse_fewer_than_one_process(call, p):
    with pytest.raises(ValueError, match="at least 1|>= 1"):
        call(p)


def test_cost_models_refuse_no_workers():
    with pytest.raises(ValueError, match="at least 1"):
        M.parameter_server_epoch_seconds(100, 10, [], 0.1, "sync")
    with pytest.raises(ValueError, match="at least 1"):
        M.bulk_synchronous_timeline([], 1.0)


def test_a_plan_for_more_gpus_than_the_cluster_has_is_refused():
    with pytest.raises(ValueError, match="needs dp x cp x tp x pp = 16 GPUs, the cluster has 8"):
        P.step_time(GPT_7B, NODE, P.Plan(dp=16, tp=1, pp=1))


def test_a_model_no_plan_can_run_on_the_cluster_is_refused_with_the_rules():
    one_sequence = P.Transformer(layers=1, hidden=6, heads=3, seq=4, vocab=10, global_batch=1)
    with pytest.raises(ValueError, match="no plan uses all 8 GPUs"):
        P.rank_plans(one_sequence, NODE)


def test_fitting_keeps_the_plans_that_fit_in_order_and_names_the_smallest_when_none_does():
    ranked = P.rank_plans(GPT_7B, NODE)
    assert P.fitting(ranked) == [r for r in ranked if r.fits] and P.fitting(ranked)[0] is ranked[0]
    tiny_gpus = replace(NODE, memory=2**30)  # 1 GiB each: 7B fits in no plan
    none_fit = P.rank_plans(GPT_7B, tiny_gpus)
    smallest = min(none_fit, key=lambda r: r.memory["total"])
    with pytest.raises(ValueError, match=f"none of the {len(none_fit)} plans fits: the smallest, "
                                         f".*needs {P.size(smallest.memory['total'])}"):
        P.fitting(none_fit)
    with pytest.raises(ValueError, match="no plans to choose from"):
        P.fitting([])


def test_small_pieces_by_hand():
    from course_lib import plans, step_time

    assert plans.stage_text((5, 6, 6, 6, 5)) == "5+6x3+5"
    assert str(P.Plan(dp=1, tp=1, pp=3, stages=(1, 2, 1), chunks=1)).startswith(
        "dp 1 x tp 1 x pp 3 (1+2+1), ZeRO-0")
    # 1 s of communication beside 0.4 s of compute, the first 0.1 s unhideable
    sigma = OVERLAP_SLOWDOWN
    assert step_time.exposed(1.0, 0.4, 0.1) == pytest.approx(0.6 + sigma * 0.4)
    assert step_time.exposed(0.3, 2.0, 0.1) == pytest.approx(0.1 + sigma * 0.2)
    assert step_time.exposed(0.3, 0.0, 0.1) == pytest.approx(0.3)
    assert step_time.exposed(0.3, 2.0, 0.1, slowdown=0.0) == pytest.approx(0.1)
    # collectives a step: 4 all-reduces a layer and micro-batch, 2 sends per micro-batch,
    # ZeRO-1's reduce-scatter and all-gather
    plan = P.Plan(dp=2, tp=2, pp=2, zero=1, micro_batches=4)
    assert step_time.collectives(TINY, plan) == 1 * 4 * 4 + 2 * 4 + 2
    # sends: 2 (v m + p - 1) on the critical path, each 1/t of an activation
    two = P.Cluster(gpus_per_node=8, nodes=1, memory=1e12, peak_flops=1e12,
                    intra_bandwidth=1e9, inter_bandwidth=1e9, intra_latency=1e-6)
    activation = 2 * 8 * (8 / (2 * 4)) * 4  # bytes: s x b x h in bf16
    assert step_time.pipeline_seconds(TINY, two, plan) == pytest.approx(
        2 * (4 + 1) * (1e-6 + activation / 2 / 1e9))


def test_with_plan_finds_the_published_fields_and_compare_says_when_it_cannot():
    from course_lib import published as pub
    from course_lib import validation

    ranked = P.rank_plans(GPT_7B, NODE)
    found = P.with_plan(ranked, dp=8, zero=1)
    assert found and all(r.plan.dp == 8 and r.plan.zero == 1 for r in found)
    assert found == sorted(found, key=ranked.index)
    run = pub.RUNS[0]
    impossible = pub.Run(**{**run.__dict__, "plan": {**run.plan, "tp": 3}})
    assert validation.compare(impossible, 0.5) == dict(run=impossible, candidate=False,
                                                       fits=False)


@pytest.mark.parametrize("make, match", [
    (lambda: P.Cluster(8, 1, float("inf"), 1e12, 1e9, 1e9), "memory must be positive and finite"),
    (lambda: P.Cluster(8, 1, "80", 1e12, 1e9, 1e9), "memory must be positive and finite"),
    (lambda: P.Plan(1, 1, 1, stages=3), "stages is a tuple of each stage's layers"),
    (lambda: replace(GPT_7B, value_bytes=2.0), "value_bytes must be 2"),
    (lambda: replace(GPT_7B, tied_head="yes"), "tied_head is True or False"),
    (lambda: P.Cluster(8, 1, 8e10, 1e12, 1e9, 1e9, inter_latency="1"), "inter_latency must be"),
    (lambda: P.Cluster(8, 1, 8e10, 1e12, 1e9, 1e9, intra_latency=float("inf")),
     "intra_latency must be zero or positive and finite"),
    (lambda: P.Cluster(8, 1, 8e10, 1e12, 1e9, 1e9, mfu="0.5"), "mfu must be in"),
    (lambda: P.step_time(GPT_7B, NODE, P.Plan(8, 1, 1), overlap="no"), "overlap must be True"),
    (lambda: M.zero_bytes_per_rank(1e6, 8, True), "ZeRO stage must be one of")])
def test_descriptions_refuse_infinite_text_or_loose_values_by_name(make, match):
    with pytest.raises(ValueError, match=match):
        make()
    import numpy as np

    assert P.Cluster(8, 1, np.float64(8e10), np.int64(10**12), 1e9, 1e9).memory == 8e10
    ranked = P.rank_plans(GPT_7B, NODE)
    assert P.why(ranked[0], ranked[0]).endswith("the best plan itself")
    with pytest.raises(ValueError, match="a Plan has no field bogus"):
        P.with_plan(ranked, bogus=1)


@pytest.mark.parametrize("recompute, attention", [(False, "recompute"), (True, "Stored"),
                                                  ("no", "stored"), (None, "stored")])
def test_hardware_flops_refuse_an_attention_or_recompute_they_do_not_know(recompute, attention):
    # "recompute", a typo of "recomputed", used to count as "stored"; "no" as True
    with pytest.raises(ValueError, match=r"recompute is True or False and attention one of "
                                         r"\('stored', 'recomputed', 'flash'\)"):
        TINY.hardware_flops(recompute, attention)
    with pytest.raises(ValueError, match="recompute is True or False"):
        TINY.recomputed_flops_per_token(recompute, attention)
    assert TINY.hardware_flops(False, "flash") == TINY.model_flops()


def test_search_choices_no_plan_can_take_are_refused_even_where_unused():
    one_gpu = replace(NODE, gpus_per_node=1)  # dp = 1: no ZeRO stage would ever be tried
    with pytest.raises(ValueError, match=r"zero_stages takes \(0, 1, 2, 3\), got \[7\]"):
        P.candidate_plans(GPT_7B, one_gpu, zero_stages=(0, 7))
    with pytest.raises(ValueError, match=r"gather_units takes .*got \['matrx'\]"):
        P.candidate_plans(GPT_7B, NODE, gather_units=("matrx",))


def test_why_wants_the_better_plan_first_and_with_plan_takes_stages_as_a_list():
    ranked = P.rank_plans(GPT_7B, NODE)
    fits = [r for r in ranked if r.fits]
    with pytest.raises(ValueError, match="give the better plan first"):
        P.why(fits[-1], fits[0])
    tiny = P.rank_plans(P.Transformer(layers=4, hidden=64, heads=4, seq=32, vocab=100,
                                      global_batch=8), P.Cluster(2, 1, 80e9, 1e15, 1e11, 1e10))
    tied = next(r for r in tiny[1:] if P.rank_key(r)[:2] == P.rank_key(tiny[0])[:2])
    assert "as fast as the best" in P.why(tiny[0], tied)
    with pytest.raises(ValueError, match="give the better plan first"):
        P.why(tied, tiny[0])  # a tie in time, but the ranking puts tiny[0] first
    assert sorted(tiny, key=P.rank_key) == tiny
    uneven = P.rank_plans(replace(GPT_7B, layers=30), NODE)  # pp 4: stages of 7 and 8 layers
    stages = next(r for r in uneven if r.plan.stages).plan.stages
    assert P.with_plan(uneven, stages=list(stages)) == P.with_plan(uneven, stages=stages) != []
