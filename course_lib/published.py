"""Published training runs to check the planner against (lesson 12).

Lecture: the seed article's "choose a strategy" step, checked against what was run at scale.
Every number below is copied from the source named beside it; nothing here is measured by this
course, and nothing here was fitted to these rows. A :class:`Run` holds the model, the cluster,
the fields of the plan the source gives (``plan``; the others were not published, and the planner
fills them with its best choice), the published throughput in teraFLOP/s per GPU counted as the
source counts it (``convention``: ``"hardware"`` with recomputation, as Megatron-LM's equation 3
does, or ``"model"``), and ``options``: what the planner may choose for this run, the software of
its time (no FlashAttention before 2022, no sequence parallelism before Korthikanti et al.).

Hardware: DGX A100 nodes (Selene; Narayanan et al. 2021, section 5): 8 GPUs of 80 GB, 312 TFLOP/s
of 16-bit peak each, NVLink inside a node and eight 200 Gb/s InfiniBand adapters, one per GPU.
NVLink's 300 GB/s per GPU and direction, and the H100's 989 TFLOP/s dense bf16 and 450 GB/s, are
NVIDIA's specifications, not the papers'.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace

from course_lib.cost_models import ring_all_reduce_time
from course_lib.model_shapes import check_positive
from course_lib.plans import Cluster, Plan, Transformer

NARAYANAN_2021 = ("Narayanan et al. 2021, Efficient large-scale language model training on GPU "
                  "clusters using Megatron-LM")
KORTHIKANTI_2022 = ("Korthikanti et al. 2022, Reducing activation recomputation in large "
                    "transformer models")
RAJBHANDARI_2020 = "Rajbhandari et al. 2020, ZeRO, Table 1 and section 3.2"
SMITH_2022 = ("Smith et al. 2022, Using DeepSpeed and Megatron to train Megatron-Turing NLG "
              "530B, sections 2.2 and 2.4")
BLOOM_2022 = ("BigScience 2022, BLOOM 176B training (Le Scao et al. 2022, section 3.4; the "
              "run's log and configuration in bigscience-workshop/bigscience, tr11-176B-ml)")
ZHANG_2022 = ("Zhang et al. 2022, OPT, section 2.4 (tensor parallelism 8 and FSDP without "
              "resharding after forward: facebookresearch/metaseq's OPT notes and launcher)")
DUBEY_2024 = "Dubey et al. 2024, The Llama 3 herd of models, Table 4 and section 3.3.2"
NVIDIA_2024 = ("NVIDIA 2024, Nemotron-4 340B technical report, Table 2 (shape: NeMo's "
               "Nemotron4Config340B)")

SEQ, VOCAB = 2048, 51_200  # both Megatron-LM papers
A100_PEAK, H100_PEAK = 312e12, 989e12
CLUSTERS, CONVENTIONS = ("a100", "a100 omni-path", "h100", "h800"), ("hardware", "model")


def nodes_of_eight(gpus: int) -> dict:
    """``gpus`` as nodes of 8 GPUs (fewer than 8: one node with that many); a count that fills
    no whole number of nodes is refused, not rounded down."""
    if isinstance(gpus, bool) or not isinstance(gpus, numbers.Integral) or gpus < 1 or (
            gpus > 8 and gpus % 8):
        raise ValueError(f"gpus must be 1 to 8 or a multiple of 8 (nodes of 8), got {gpus!r}")
    return dict(gpus_per_node=min(int(gpus), 8), nodes=max(1, int(gpus) // 8))


def a100_cluster(gpus: int, mfu: float = 0.5, inter_bandwidth: float = 25e9) -> Cluster:
    """``gpus`` A100 80 GB GPUs (80 GiB each) in DGX nodes of 8 (fewer than 8: one node with
    that many); ``inter_bandwidth`` per GPU between nodes (DGX: 200 Gb/s, 25 GB/s)."""
    return Cluster(**nodes_of_eight(gpus), memory=80 * 2**30, peak_flops=A100_PEAK,
                   intra_bandwidth=300e9, inter_bandwidth=inter_bandwidth, mfu=mfu)


def h100_cluster(gpus: int, mfu: float = 0.5, intra_bandwidth: float = 450e9) -> Cluster:
    """``gpus`` H100 80 GB GPUs in nodes of 8 with 400 Gb/s (50 GB/s) per GPU between nodes
    (Llama 3's and Nemotron-4's clusters). An H800 computes as an H100 with a slower NVLink:
    160 GB/s as DeepSeek-V3 (section 3.2.2) measured it, ``intra_bandwidth=160e9``."""
    return Cluster(**nodes_of_eight(gpus), memory=80 * 2**30, peak_flops=H100_PEAK,
                   intra_bandwidth=intra_bandwidth, inter_bandwidth=50e9, mfu=mfu)


def megatron_flops(model: Transformer) -> float:
    """FLOPs per iteration as both Megatron-LM papers count them, with full recomputation
    (Narayanan et al. 2021, equation 3): 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))."""
    b, s, h, v, layers = model.global_batch, model.seq, model.hidden, model.vocab, model.layers
    return 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def gpt(layers, hidden, heads, batch, seq=SEQ, vocab=VOCAB, **shape) -> Transformer:
    return Transformer(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab,
                       global_batch=batch, **shape)


@dataclass(frozen=True)
class Run:
    name: str
    source: str
    model: Transformer
    cluster: str          # one of CLUSTERS: "a100", "a100 omni-path", "h100" or "h800"
    gpus: int
    plan: dict            # the published plan's fields
    tflops: float         # published teraFLOP/s per GPU, in ``convention``
    convention: str = "hardware"
    seconds: float | None = None  # published seconds per iteration, where given
    options: dict = field(default_factory=dict)
    compared: str = ""    # the runs a paper compares share this label
    chosen: bool = True   # the team's configuration (False: the losing side of a comparison)

    def __post_init__(self):
        nodes_of_eight(self.gpus)  # a cluster of whole nodes, or refused by name
        positive = all(isinstance(v, numbers.Real) and not isinstance(v, bool) and 0 < v < math.inf
                       for v in (self.tflops, 1.0 if self.seconds is None else self.seconds))
        if self.cluster not in CLUSTERS or self.convention not in CONVENTIONS or not positive:
            raise ValueError(f"Run {self.name!r}: cluster must be one of {CLUSTERS}, convention "
                             f"one of {CONVENTIONS}, tflops and seconds positive and finite; got "
                             f"{self.cluster!r}, {self.convention!r}, {self.tflops!r}, "
                             f"{self.seconds!r}")


OLD = dict(attention=("stored",), sequence_parallel=(False,))  # 2021: no SP, no FlashAttention
MEGATRON_2021 = dict(OLD, zero_stages=(0,), recompute=(True,))
FULL = dict(recompute=True, attention="stored", sequence_parallel=False)
SELECTIVE = dict(recompute=False, attention="recomputed", sequence_parallel=True)  # with SP


def _table_1(params, heads, hidden, layers, tp, pp, gpus, batch, tflops):
    return Run(f"GPT {params}B", NARAYANAN_2021 + ", Table 1", gpt(layers, hidden, heads, batch),
               "a100", gpus, dict(tp=tp, pp=pp, dp=gpus // (tp * pp), zero=0, **FULL), tflops,
               options=MEGATRON_2021)


# Narayanan et al. 2021, Table 1 (every row): "we use the interleaved pipeline schedule with the
# scatter/gather optimization enabled"; micro-batch sizes and chunks are not in the table
RUNS = [_table_1(*row) for row in (
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163))]

# Narayanan et al. 2021, Table 2: ZeRO-3 without model parallelism against PTD-P (tp 8 and pp 12
# for 174.6B, tp 8 and pp 35 for 529.6B), both recomputing; teraFLOP/s per GPU
# (ZeRO-3 as DeepSpeed ran it: each weight matrix gathered on its own)
GPT_175B = gpt(96, 12288, 96, 1536)
TABLE_2_OPTIONS = dict(OLD, zero_stages=(0, 3), recompute=(True,), gather_units=("matrix",))
for _params, _zero3, _ptdp in (
        ("174.6", [(384, 1536, 4, 144), (768, 1536, 2, 88), (1536, 1536, 1, 44)],
         [(384, 1536, 1, 153), (768, 1536, 1, 149), (1536, 1536, 1, 141)]),
        ("529.6", [(640, 2560, 4, 138), (1120, 2240, 2, 98), (2240, 2240, 1, 48)],
         [(560, 2240, 1, 171), (1120, 2240, 1, 167), (2240, 2240, 1, 159)])):
    _shape, _pp = ((96, 12288, 96), 12) if _params == "174.6" else ((105, 20480, 128), 35)
    for (_g3, _b3, _mb3, _t3), (_gp, _bp, _mbp, _tp) in zip(_zero3, _ptdp, strict=True):
        _label = f"{_params}B on ~{_g3 if _g3 == _gp else _gp} GPUs"
        RUNS.append(Run(f"GPT {_params}B, ZeRO-3, {_g3} GPUs", NARAYANAN_2021 + ", Table 2",
                        gpt(*_shape, _b3), "a100", _g3,
                        dict(dp=_g3, tp=1, pp=1, zero=3, micro_batches=_b3 // (_g3 * _mb3),
                             gather_unit="matrix", **FULL), _t3, options=TABLE_2_OPTIONS,
                        compared=f"Table 2, {_params}B, {_gp} GPUs", chosen=False))
        RUNS.append(Run(f"GPT {_params}B, PTD-P, {_gp} GPUs", NARAYANAN_2021 + ", Table 2",
                        gpt(*_shape, _bp), "a100", _gp,
                        dict(dp=_gp // (8 * _pp), tp=8, pp=_pp, zero=0,
                             micro_batches=_bp // (_gp // (8 * _pp) * _mbp), **FULL), _tp,
                        options=TABLE_2_OPTIONS, compared=f"Table 2, {_params}B, {_gp} GPUs"))

# Korthikanti et al. 2022, Tables 3 and 5: seconds per iteration without data parallelism, full
# recomputation against the paper's own (selective recomputation and sequence parallelism);
# "the interleaving schedule with three interleaving stages for the 175B and 530B models"
for _name, _shape, _tp, _pp, _gpus, _batch, _mb, _full, _present, _chunks in (
        ("22B", (48, 6144, 64), 8, 1, 8, 4, 4, 1.42, 1.10, 1),
        ("175B", (96, 12288, 96), 8, 8, 64, 64, 1, 18.13, 13.75, 3),
        ("530B", (105, 20480, 128), 8, 35, 280, 280, 1, 49.05, 37.83, 3),
        ("1T", (128, 25600, 160), 8, 64, 512, 512, 1, 94.42, 71.49, None)):
    _model = gpt(*_shape, _batch)
    _known = dict(dp=1, tp=_tp, pp=_pp, zero=0, micro_batches=_batch // _mb) | (
        dict(chunks=_chunks) if _chunks else {})
    for _label, _how, _seconds in (("full recomputation", FULL, _full),
                                   ("selective + SP", SELECTIVE, _present)):
        _hw = _model.hardware_flops(_how["recompute"], _how["attention"])
        RUNS.append(Run(f"GPT {_name}, {_label}", KORTHIKANTI_2022 + ", Tables 3 and 5", _model,
                        "a100", _gpus, dict(_known, **_how), _hw / (_seconds * _gpus) / 1e12,
                        seconds=_seconds,
                        options=dict(zero_stages=(0,), **{k: (v,) for k, v in _how.items()})))

# Megatron-Turing NLG 530B (Smith et al. 2022): 105 layers, 20480 wide, 128 heads, batch 1920,
# tp 8 x pp 35 on 280, 350 and 420 DGX A100 nodes: 60.1, 50.2, 44.4 s per iteration, 126, 121,
# 113 teraFLOP/s per GPU. DeepSpeed's pipeline runs plain 1F1B; the paper's TF/s are
# Megatron-LM's (with recomputation: 96 B s l h^2 (...) over 60.1 s on 2240 GPUs is 126)
for _nodes, _seconds, _t in ((280, 60.1, 126), (350, 50.2, 121), (420, 44.4, 113)):
    RUNS.append(Run(f"MT-NLG 530B, {_nodes * 8} GPUs", SMITH_2022, gpt(105, 20480, 128, 1920),
                    "a100", _nodes * 8, dict(tp=8, pp=35, dp=_nodes // 35, chunks=1, **FULL), _t,
                    seconds=_seconds, options=dict(OLD, zero_stages=(0, 1), recompute=(True,),
                                                   chunks=(1,))))

# BLOOM 176B: 384 A100 80 GB on Jean Zay, tp 4 x pp 12 x dp 8, ZeRO-1 (BF16Optimizer), micro-batch
# 2 of a 2048 batch, full recomputation, 72 pipeline "layers" = 70 blocks + the two embeddings,
# 6 a stage (5+6x10+5 blocks); the log: "elapsed time per iteration (s): 104.70 ... TFLOPs:
# 149.77", Megatron-LM's hardware count. Four Omni-Path links per node (100 Gb/s each, the
# paper): 6.25 GB/s per GPU between nodes.
BLOOM = gpt(70, 14336, 112, 2048, vocab=250_880, learned_positions=False)
RUNS.append(Run("BLOOM 176B", BLOOM_2022, BLOOM, "a100 omni-path", 384,
                dict(tp=4, pp=12, dp=8, zero=1, micro_batches=128, chunks=1,
                     stages=(5,) + (6,) * 10 + (5,), **FULL), 149.77, seconds=104.70,
                options=dict(OLD, zero_stages=(0, 1), recompute=(True,), chunks=(1,))))

# OPT-175B: "992 80GB A100 GPUs ... Fully Sharded Data Parallel with Megatron-LM Tensor
# Parallelism ... up to 147 TFLOP/s per GPU"; tp 8 (124 hosts of 8), FSDP without resharding
# after forward (ZeRO-2's memory), activation checkpointing; 2M tokens a batch: 124 data-parallel
# ranks x 8 sequences of 2048. The 147 counts recomputation: the OPT notes' 4.30e23 FLOPs over
# 33 days on 1024 GPUs is 147 TFLOP/s with Megatron-LM's count, 108 without.
RUNS.append(Run("OPT-175B", ZHANG_2022, gpt(96, 12288, 96, 992, vocab=50_272), "a100", 992,
                dict(tp=8, pp=1, dp=124, zero=2, **FULL), 147,
                options=dict(OLD, zero_stages=(0, 1, 2, 3), recompute=(True,))))

# Llama 3 405B, Table 4's 8K-context rows: tp 8 x pp 16, dp 64 (8,192 GPUs) and 128 (16,384),
# 16M tokens a step, 430 and 400 teraFLOP/s per GPU (BF16 MFU 43 % and 41 %: model FLOPs);
# interleaved (V not given), one layer fewer on the first and the last stage, no activation
# checkpointing at 8K, FSDP sharding optimizer state and gradients (ZeRO-2). The vocabulary is
# 128,256 (meta-llama/llama-models; the paper rounds it to 128,000).
LLAMA3_405B = gpt(126, 16384, 128, 2048, seq=8192, vocab=128_256, ffn=53_248, gated_mlp=True,
                  kv_heads=8, dropout=False, learned_positions=False, tied_head=False)
for _gpus, _t in ((8192, 430), (16_384, 400)):
    RUNS.append(Run(f"Llama 3 405B, {_gpus:,} GPUs", DUBEY_2024, LLAMA3_405B, "h100", _gpus,
                    dict(tp=8, pp=16, dp=_gpus // 128, zero=2, recompute=False,
                         stages=(7,) + (8,) * 14 + (7,)), _t, convention="model",
                    options=dict(attention=("flash",), recompute=(False,))))
# and its long-context row: 131,072 tokens a sequence, context parallelism cp 16 inside tp 8 x pp
# 16 and dp 8 (16,384 GPUs), 16 sequences per data-parallel rank (the same 16M tokens a step),
# 380 teraFLOP/s per GPU (BF16 MFU 38 %)
RUNS.append(Run("Llama 3 405B, 128K context", DUBEY_2024, replace(LLAMA3_405B, seq=131_072,
                                                                   global_batch=128),
                "h100", 16_384, dict(tp=8, pp=16, cp=16, dp=8, zero=2, recompute=False,
                                     stages=(7,) + (8,) * 14 + (7,)), 380, convention="model",
                options=dict(attention=("flash",), recompute=(False,), cp=(16,))))

# Nemotron-4 340B, Table 2: tp 8 x pp 12 interleaved, a distributed optimizer (ZeRO-1), dp 16,
# 32, 64 with batches 768, 1536, 2304 of 4096 tokens: 10.3, 10.3, 8.0 s per iteration, MFU 42.4,
# 42.3, 41.0 % of 989 TFLOP/s (model FLOPs). Squared-ReLU MLP 73,728 wide, 8 key/value heads.
NEMOTRON_340B = dict(layers=96, hidden=18432, heads=96, seq=4096, vocab=256_000, kv_heads=8,
                     dropout=False, learned_positions=False, tied_head=False)
for _dp, _batch, _seconds, _mfu in ((16, 768, 10.3, 42.4), (32, 1536, 10.3, 42.3),
                                    (64, 2304, 8.0, 41.0)):
    RUNS.append(Run(f"Nemotron-4 340B, {_dp * 96} GPUs", NVIDIA_2024,
                    Transformer(global_batch=_batch, **NEMOTRON_340B), "h100", _dp * 96,
                    dict(tp=8, pp=12, dp=_dp, zero=1), _mfu / 100 * H100_PEAK / 1e12,
                    convention="model", seconds=_seconds,
                    options=dict(attention=("flash",))))

TEAMS = {NARAYANAN_2021: "NVIDIA (Megatron-LM)", KORTHIKANTI_2022: "NVIDIA (Megatron-LM)",
         SMITH_2022: "Microsoft and NVIDIA", BLOOM_2022: "BigScience", ZHANG_2022: "Meta AI",
         DUBEY_2024: "Meta (Llama team)", NVIDIA_2024: "NVIDIA (Nemotron)"}


def team_of(run: Run) -> str:
    """The team that published ``run``."""
    teams = [team for source, team in TEAMS.items() if run.source.startswith(source)]
    if not teams:
        raise ValueError(f"no team is known for the source {run.source!r}: add it to TEAMS")
    return teams[0]

# Memory: GB (10^9 bytes) per GPU. ZeRO's Table 1: the model states (16 bytes a parameter in
# mixed precision) of a 7.5B model over 64 data-parallel GPUs at each stage; section 3.2: GPT-2's
# 1.5B model, its states, and its activations at sequence 1K and batch 32, with and without
# recomputation ("about 60 GB", "about 8 GB"). GPT-2 1.5B: 48 layers, 1600 wide, 25 heads.
GPT2_XL = gpt(48, 1600, 25, 32, seq=1024, vocab=50_257)
MEMORY = [dict(name=f"7.5B, ZeRO-{zero} over 64", source=RAJBHANDARI_2020, psi=7.5e9, dp=64,
              zero=zero, term="state", gb=gb) for zero, gb in ((1, 31.4), (2, 16.6), (3, 1.88))]
MEMORY += [
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
LAYER_22B = dict(source="Korthikanti et al. 2022, Table 4", model=gpt(48, 6144, 64, 4), tp=8,
                 micro_batch=4, seconds=19.6e-3)


def measured_mfu(all_reduces_out: bool = True) -> float:
    """The share of peak :data:`LAYER_22B` ran at. With ``all_reduces_out`` its four tensor-parallel
    all-reduces, timed as the planner times them on NVLink, are taken out of the measured time first
    (the planner adds them back as a term of their own): the MFU of the kernels alone, the planner's
    MFU for every cluster here (H100s too: an assumption, no layer was timed alone on H100s)."""
    layer, node = LAYER_22B, a100_cluster(8)
    model, seconds = layer["model"], layer["seconds"]
    if all_reduces_out:
        activation = model.value_bytes * model.seq * layer["micro_batch"] * model.hidden
        alpha, beta = node.link(layer["tp"], 1)
        seconds -= 4 * float(ring_all_reduce_time(activation, layer["tp"], alpha, beta))
    return layer_flops(model, layer["micro_batch"]) / layer["tp"] / (seconds * A100_PEAK)


def layer_flops(model: Transformer, micro_batch: int) -> float:
    """Model FLOPs of one layer's forward and backward for one micro-batch (Korthikanti et al.
    2022, equation 7 without the head): 72 b s h^2 (1 + s / (6 h))."""
    check_positive("layer_flops", micro_batch=micro_batch)
    s, h = model.seq, model.hidden
    return 72 * micro_batch * s * h * h * (1 + s / (6 * h))


def cluster_of(run: Run, mfu: float) -> Cluster:
    """The run's cluster at the kernels' ``mfu``."""
    if run.cluster in ("h100", "h800"):
        return h100_cluster(run.gpus, mfu, 450e9 if run.cluster == "h100" else 160e9)
    return a100_cluster(run.gpus, mfu, {"a100": 25e9, "a100 omni-path": 6.25e9}[run.cluster])
