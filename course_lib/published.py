"""Published training configurations to check the planner against (lesson 12).

Lecture: the seed article's "choose a strategy" step, checked against what was run at scale.
Every number below is copied from the paper named beside it; nothing here is measured by this
course. The A100 clusters of both Megatron-LM papers are DGX A100 nodes: 8 GPUs of 80 GB,
312 teraFLOP/s of 16-bit peak each, NVLink/NVSwitch inside a node and eight 200 Gb/s InfiniBand
adapters per node, one per GPU (Narayanan et al. 2021, section 5). The NVLink bandwidth is not
in the papers: 300 GB/s per GPU and direction is NVIDIA's A100 specification (600 GB/s both
ways).
"""

from __future__ import annotations

from course_lib.cost_models import ring_all_reduce_time
from course_lib.planner import Cluster, Plan, Transformer

NARAYANAN_2021 = ("Narayanan et al. 2021, Efficient large-scale language model training on GPU "
                  "clusters using Megatron-LM, Table 1")
KORTHIKANTI_2022 = ("Korthikanti et al. 2022, Reducing activation recomputation in large "
                    "transformer models, Tables 3 and 5")
RAJBHANDARI_2020 = "Rajbhandari et al. 2020, ZeRO, Table 1 and section 3.2"

SEQ, VOCAB = 2048, 51_200  # both Megatron-LM papers


def a100_cluster(gpus: int, mfu: float = 0.5) -> Cluster:
    """``gpus`` A100 80 GB GPUs (80 GiB each) in DGX nodes of 8 (fewer than 8: one node with
    that many)."""
    return Cluster(gpus_per_node=min(gpus, 8), nodes=max(1, gpus // 8), memory=80 * 2**30,
                   peak_flops=312e12, intra_bandwidth=300e9, inter_bandwidth=25e9, mfu=mfu)


def megatron_flops(model: Transformer) -> float:
    """FLOPs per iteration as both papers count them, with full recomputation (Narayanan et al.
    2021, equation 3): 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))."""
    b, s, h, v = model.global_batch, model.seq, model.hidden, model.vocab
    layers = model.layers
    return 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def _gpt(layers, hidden, heads, batch, seq=SEQ, vocab=VOCAB):
    return Transformer(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab,
                       global_batch=batch)


# Throughput: teraFLOP/s per GPU (Narayanan et al. 2021, Table 1: "we use the interleaved
# pipeline schedule with the scatter/gather optimization enabled", full recomputation; the
# micro-batch size of each row is not published) ...
THROUGHPUT = [
    dict(name="GPT 1.7B", source=NARAYANAN_2021, model=_gpt(24, 2304, 24, 512), gpus=32,
         tp=1, pp=1, tflops_per_gpu=137),
    dict(name="GPT 18.4B", source=NARAYANAN_2021, model=_gpt(40, 6144, 48, 1024), gpus=256,
         tp=8, pp=1, tflops_per_gpu=135),
    dict(name="GPT 39.1B", source=NARAYANAN_2021, model=_gpt(48, 8192, 64, 1536), gpus=512,
         tp=8, pp=2, tflops_per_gpu=138),
    dict(name="GPT 145.6B", source=NARAYANAN_2021, model=_gpt(80, 12288, 96, 2304), gpus=1536,
         tp=8, pp=8, tflops_per_gpu=148),
]

# ... and seconds per iteration with full recomputation, no data parallelism (Korthikanti et
# al. 2022, Tables 3 and 5; micro-batch 4 for 22B, 1 for the others). ``chunks``: the
# interleaved schedule's chunks per GPU where the paper gives them (3 for the 175B model; the
# paper does not say for the 1T model).
ITERATION = [
    dict(name="GPT 22B", source=KORTHIKANTI_2022, model=_gpt(48, 6144, 64, 4), gpus=8,
         plan=Plan(dp=1, tp=8, pp=1, micro_batches=1, recompute=True), seconds=1.42,
         chunks=1),
    dict(name="GPT 175B", source=KORTHIKANTI_2022, model=_gpt(96, 12288, 96, 64), gpus=64,
         plan=Plan(dp=1, tp=8, pp=8, micro_batches=64, recompute=True), seconds=18.13,
         chunks=3),
    dict(name="GPT 1T", source=KORTHIKANTI_2022, model=_gpt(128, 25600, 160, 512), gpus=512,
         plan=Plan(dp=1, tp=8, pp=64, micro_batches=512, recompute=True), seconds=94.42,
         chunks=None),
]

# ZeRO-3 against tensor x pipeline x data parallelism ("PTD-P": tp 8, pp 12) for the 174.6B
# model, global batch 1536, as the GPU count grows: teraFLOP/s per GPU (Narayanan et al. 2021,
# Table 2; ZeRO-3's micro-batch 4, 2, 1 sequences at 384, 768, 1536 GPUs; PTD-P's 1).
GPT_175B = _gpt(96, 12288, 96, 1536)
ZERO3_VS_PTDP = [
    dict(gpus=gpus, plan=plan, tflops_per_gpu=tflops)
    for gpus, mb, zero3, ptdp in ((384, 4, 144, 153), (768, 2, 88, 149), (1536, 1, 44, 141))
    for plan, tflops in ((Plan(dp=gpus, tp=1, pp=1, zero=3, micro_batches=1536 // (gpus * mb),
                               recompute=True), zero3),
                         (Plan(dp=gpus // 96, tp=8, pp=12, micro_batches=1536 // (gpus // 96),
                               recompute=True), ptdp))
]
TABLE_2 = "Narayanan et al. 2021, Table 2"

# Memory: GB (10^9 bytes) per GPU. ZeRO's Table 1: the model states (16 bytes a parameter in
# mixed precision) of a 7.5B model over 64 data-parallel GPUs at each stage; section 3.2: GPT-2's
# 1.5B model, its states, and its activations at sequence 1K and batch 32, with and without
# recomputation ("about 60 GB", "about 8 GB"). GPT-2 1.5B: 48 layers, 1600 wide, 25 heads.
GPT2_XL = _gpt(48, 1600, 25, 32, seq=1024, vocab=50_257)
MEMORY = [
    dict(name="7.5B, ZeRO-1 over 64", source=RAJBHANDARI_2020, psi=7.5e9, dp=64, zero=1,
         term="state", gb=31.4),
    dict(name="7.5B, ZeRO-2 over 64", source=RAJBHANDARI_2020, psi=7.5e9, dp=64, zero=2,
         term="state", gb=16.6),
    dict(name="7.5B, ZeRO-3 over 64", source=RAJBHANDARI_2020, psi=7.5e9, dp=64, zero=3,
         term="state", gb=1.88),
    dict(name="GPT-2 1.5B, states", source=RAJBHANDARI_2020, model=GPT2_XL,
         plan=Plan(dp=1, tp=1, pp=1), term="state", gb=24),
    dict(name="GPT-2 1.5B, activations", source=RAJBHANDARI_2020, model=GPT2_XL,
         plan=Plan(dp=1, tp=1, pp=1), term="activations", gb=60),
    dict(name="GPT-2 1.5B, activations, recomputed", source=RAJBHANDARI_2020, model=GPT2_XL,
         plan=Plan(dp=1, tp=1, pp=1, recompute=True), term="activations", gb=8),
]

# One layer of the 22B model (tensor-parallel over 8 GPUs, micro-batch 4): forward and backward
# took 19.6 ms without recomputation (Korthikanti et al. 2022, Table 4) -- the kernels' speed,
# tensor-parallel all-reduces included, that the planner's assumed MFU stands for.
LAYER_22B = dict(source="Korthikanti et al. 2022, Table 4", model=_gpt(48, 6144, 64, 4), tp=8,
                 micro_batch=4, seconds=19.6e-3)


def measured_mfu(all_reduces_out: bool = True) -> float:
    """The share of peak :data:`LAYER_22B` ran at. With ``all_reduces_out`` its four
    tensor-parallel all-reduces, timed as the planner times them on NVLink, are taken out of the
    measured time first -- the planner adds them back as a term of their own -- which gives the
    MFU of the kernels alone, the planner's MFU for the A100 clusters."""
    layer, node = LAYER_22B, a100_cluster(8)
    model = layer["model"]
    seconds = layer["seconds"]
    if all_reduces_out:
        activation = model.value_bytes * model.seq * layer["micro_batch"] * model.hidden
        alpha, beta = node.link(layer["tp"], 1)
        seconds -= 4 * float(ring_all_reduce_time(activation, layer["tp"], alpha, beta))
    return layer_flops(model, layer["micro_batch"]) / layer["tp"] / (seconds * 312e12)


def layer_flops(model: Transformer, micro_batch: int) -> float:
    """Model FLOPs of one layer's forward and backward for one micro-batch (Korthikanti et al.
    2022, equation 7 without the head): 72 b s h^2 (1 + s / (6 h))."""
    s, h = model.seq, model.hidden
    return 72 * micro_batch * s * h * h * (1 + s / (6 * h))
