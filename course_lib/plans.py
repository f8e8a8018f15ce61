"""What a parallel plan is made of: the model, the cluster and the plan itself (lesson 12).

Lecture: the seed article's "choose a strategy" step. Three descriptions, each checked once, when
it is made, so that a plan that cannot exist is refused with the field that is wrong:

* :class:`Transformer`: a GPT-style model (GPT-2 and Megatron's GPT by default; grouped-query
  attention, a gated MLP and no dropout describe Llama-style models);
* :class:`Cluster`: GPUs in nodes, their memory, peak speed and links;
* :class:`Plan`: data x tensor x pipeline degrees, a ZeRO stage, micro-batches, and how the
  activations are kept (recomputation, attention's scores, sequence parallelism, interleaving,
  layers per stage).

FLOPs are counted two ways, and every printed figure says which (Chowdhery et al. 2022, PaLM,
appendix B; Korthikanti et al. 2022, section 6): **model FLOPs** are the work the model needs,
6 per parameter and token plus attention; **hardware FLOPs** add what recomputation repeats.
Throughput and model FLOPs utilisation (MFU) use model FLOPs; step time uses hardware FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

ATTENTION = ("stored", "recomputed", "flash")
GATHER_UNITS = ("block", "matrix")


def check_positive(owner: str, **values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{owner}.{name} must be a positive whole number, got {value!r}")


@dataclass(frozen=True)
class Transformer:
    """``layers`` blocks of width ``hidden`` with ``heads`` heads, sequences of ``seq`` tokens, a
    vocabulary of ``vocab``, ``global_batch`` sequences per step. ``value_bytes``: 2 for bf16 or
    fp16 mixed precision, 4 for float32 throughout (this course's runs). ``tied_head``: the
    output layer reuses the token embedding (GPT-2, Megatron's GPT). ``ffn``: the MLP's width
    (default 4 hidden); ``gated_mlp``: three matrices instead of two (SwiGLU, Llama);
    ``kv_heads``: grouped-query attention's key/value heads (default ``heads``); ``dropout``:
    dropout after attention and the MLP (masks kept for backward); ``learned_positions``: a
    position embedding of ``seq`` x ``hidden`` (GPT-2) rather than rotary positions (Llama)."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    global_batch: int
    value_bytes: int = 2
    tied_head: bool = True
    ffn: int | None = None
    gated_mlp: bool = False
    kv_heads: int | None = None
    dropout: bool = True
    learned_positions: bool = True

    def __post_init__(self):
        check_positive("Transformer", layers=self.layers, hidden=self.hidden, heads=self.heads,
                  seq=self.seq, vocab=self.vocab, global_batch=self.global_batch)
        if self.value_bytes not in (2, 4):
            raise ValueError(f"Transformer.value_bytes must be 2 (bf16 mixed precision) or 4 "
                             f"(float32), got {self.value_bytes!r}")
        if self.ffn is not None:
            check_positive("Transformer", ffn=self.ffn)
        if self.kv_heads is not None:
            check_positive("Transformer", kv_heads=self.kv_heads)
            if self.heads % self.kv_heads:
                raise ValueError(f"Transformer.kv_heads = {self.kv_heads} must divide heads = "
                                 f"{self.heads} (each key/value head serves a group of heads)")
        if self.hidden % self.heads:
            raise ValueError(f"Transformer.hidden = {self.hidden} must split into heads = "
                             f"{self.heads} equal heads")

    @property
    def ffn_width(self) -> int:
        return 4 * self.hidden if self.ffn is None else self.ffn

    @property
    def kv_width(self) -> int:
        """Width of the keys (and of the values): hidden x kv_heads / heads."""
        return self.hidden * (self.heads if self.kv_heads is None else self.kv_heads) // self.heads

    @property
    def layer_parameters(self) -> int:
        """One block: attention's q and output projection 2 h^2, keys and values 2 h k (k: the
        key width), their biases; the MLP's 2 h f (3 h f gated) and biases; two LayerNorms 4 h.
        For GPT-2's shape, 12 h^2 + 13 h. (A model without biases, like Llama, has a few h
        fewer: under 0.01 %.)"""
        h, k, f = self.hidden, self.kv_width, self.ffn_width
        attention = 2 * h * h + 2 * h * k + 2 * h + 2 * k
        mlp = (3 * h * f + 2 * f + h) if self.gated_mlp else (2 * h * f + f + h)
        return attention + mlp + 4 * h

    @property
    def embedding_parameters(self) -> int:
        return self.vocab * self.hidden + (self.seq * self.hidden if self.learned_positions else 0)

    @property
    def head_parameters(self) -> int:
        """The output layer's own parameters: none when tied to the embedding; else its weight,
        bias and the final norm (:class:`course_lib.models.TinyGPT`)."""
        return 0 if self.tied_head else self.vocab * self.hidden + self.vocab + 2 * self.hidden

    @property
    def parameters(self) -> int:
        return (self.layers * self.layer_parameters + self.embedding_parameters
                + self.head_parameters)

    def forward_flops_per_token(self) -> dict:
        """One token's forward FLOPs: ``layer`` (2 per weight, and attention's scores and
        weighted sum over the whole sequence, 4 h s, as Megatron-LM counts them) and ``head``
        (the logits, 2 V h). Backward costs twice the forward."""
        return dict(layer=2 * self.layer_parameters + 4 * self.hidden * self.seq,
                    head=2 * self.vocab * self.hidden)

    def model_flops(self) -> float:
        """Model FLOPs of one step: 3 x the forward (6 per matrix weight and token, plus
        attention), with no recomputation -- the numerator of MFU."""
        per = self.forward_flops_per_token()
        return 3 * (self.layers * per["layer"] + per["head"]) * self.global_batch * self.seq

    def recomputed_flops_per_token(self, recompute: bool, attention: str) -> float:
        """Forward FLOPs per token and layer that backward repeats: the whole layer with full
        recomputation; attention's scores with selective recomputation (Korthikanti et al.
        2022: ``attention="recomputed"``); none otherwise. (FlashAttention also recomputes its
        scores inside its backward kernel; like everyone who reports MFU, we count that as the
        kernel's speed, not as FLOPs.)"""
        if recompute:
            return self.forward_flops_per_token()["layer"]
        return 4 * self.hidden * self.seq if attention == "recomputed" else 0.0

    def hardware_flops(self, recompute: bool = False, attention: str = "stored") -> float:
        """FLOPs one step executes: model FLOPs plus what backward recomputes. With full
        recomputation this is Megatron-LM's count, 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
        (Narayanan et al. 2021, equation 3)."""
        extra = self.layers * self.recomputed_flops_per_token(recompute, attention)
        return self.model_flops() + extra * self.global_batch * self.seq


@dataclass(frozen=True)
class Cluster:
    """GPUs: ``gpus_per_node`` on each of ``nodes``; ``memory`` bytes and ``peak_flops`` each;
    links inside a node (``intra_*``) and between nodes (``inter_*``, per GPU): bandwidth in
    bytes/s, latency in seconds. ``mfu``: the share of peak the kernels reach on the FLOPs they
    execute (a measured layer's speed, not a fit to the runs compared)."""

    gpus_per_node: int
    nodes: int
    memory: float
    peak_flops: float
    intra_bandwidth: float
    inter_bandwidth: float
    intra_latency: float = 5e-6
    inter_latency: float = 10e-6
    mfu: float = 0.5

    def __post_init__(self):
        check_positive("Cluster", gpus_per_node=self.gpus_per_node, nodes=self.nodes)
        for name in ("memory", "peak_flops", "intra_bandwidth", "inter_bandwidth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not value > 0:
                raise ValueError(f"Cluster.{name} must be positive, got {value!r}")
        for name in ("intra_latency", "inter_latency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not value >= 0:
                raise ValueError(f"Cluster.{name} must be zero or positive, got {value!r}")
        if isinstance(self.mfu, bool) or not 0 < self.mfu <= 1:
            raise ValueError(f"Cluster.mfu must be in (0, 1], got {self.mfu!r}")

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def speed(self) -> float:
        """FLOP/s a GPU's kernels reach: peak x mfu."""
        return self.peak_flops * self.mfu

    def link(self, size: int, stride: int) -> tuple[float, float]:
        """(alpha, beta) of a group of ``size`` ranks ``stride`` apart."""
        if size * stride > self.gpus_per_node:
            return self.inter_latency, 1 / self.inter_bandwidth
        return self.intra_latency, 1 / self.intra_bandwidth


@dataclass(frozen=True)
class Plan:
    """Data-parallel ``dp``, tensor-parallel ``tp`` and pipeline ``pp`` degrees; ZeRO ``zero``
    stage over the data-parallel ranks; ``micro_batches`` per step on each data-parallel rank;
    full ``recompute`` of every layer; ``attention``: its s x s scores ``"stored"`` for
    backward, ``"recomputed"`` in backward (selective recomputation, Korthikanti et al. 2022)
    or never materialised (``"flash"``: FlashAttention, Dao et al. 2022);
    ``sequence_parallel``: the tensor-parallel group also splits the norms and dropouts along
    the sequence (Korthikanti et al. 2022); ``chunks``: interleaved 1F1B's model chunks per
    GPU, v (Narayanan et al. 2021; 1: plain 1F1B); ``stages``: the layers of each pipeline stage
    (default: equal), e.g. fewer on the first and last, which hold the embedding and the head
    (BLOOM, Llama 3); ``gather_unit``: what ZeRO-3 gathers at a time, a ``"block"`` (FSDP2's
    unit, lesson 11: gathered once for forward, once for backward) or each weight
    ``"matrix"`` (DeepSpeed's submodules, which it gathers again for a recomputed forward);
    ``cp``: context parallelism, each sequence split over ``cp`` ranks that pass keys and values
    around a ring (ring attention, Liu et al. 2023; Llama 3 trained at 128K tokens with cp 16).
    ZeRO then shards over the dp x cp ranks that hold the same layers. ``ep``: expert
    parallelism, a model's experts spread over ep of its data-parallel ranks (GShard; DeepSeek-V3
    spread them over 64); the planner does not model it yet."""

    dp: int
    tp: int
    pp: int
    zero: int = 0
    micro_batches: int = 1
    recompute: bool = False
    attention: str = "stored"
    sequence_parallel: bool = False
    chunks: int = 1
    stages: tuple | None = None
    gather_unit: str = "block"
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        check_positive("Plan", dp=self.dp, tp=self.tp, pp=self.pp, micro_batches=self.micro_batches,
                  chunks=self.chunks, cp=self.cp, ep=self.ep)
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ValueError(f"Plan.zero must be a ZeRO stage 0, 1, 2 or 3, got {self.zero!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"Plan.attention must be one of {ATTENTION}, got "
                             f"{self.attention!r}")
        if self.gather_unit not in GATHER_UNITS:
            raise ValueError(f"Plan.gather_unit must be one of {GATHER_UNITS}, got "
                             f"{self.gather_unit!r}")
        if not isinstance(self.recompute, bool) or not isinstance(self.sequence_parallel, bool):
            raise ValueError(f"Plan.recompute and Plan.sequence_parallel are True or False, got "
                             f"{self.recompute!r}, {self.sequence_parallel!r}")
        if self.chunks > 1 and self.pp == 1:
            raise ValueError(f"Plan.chunks = {self.chunks}: interleaving needs a pipeline "
                             f"(pp > 1)")
        if self.stages is not None:
            stages = tuple(self.stages)
            object.__setattr__(self, "stages", stages)
            if len(stages) != self.pp:
                raise ValueError(f"Plan.stages gives {len(stages)} stages, but pp = {self.pp}")
            check_positive("Plan", **{f"stages[{i}]": n for i, n in enumerate(stages)})

    @property
    def gpus(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def recomputation(self) -> str:
        """``"full"``, ``"selective"`` (attention's scores only) or ``"none"``."""
        if self.recompute:
            return "full"
        return "selective" if self.attention == "recomputed" else "none"

    def __str__(self):
        stages = f" ({stage_text(self.stages)})" if self.stages else ""
        extras = [f"v {self.chunks}"] if self.chunks > 1 else []
        extras += [f"ep {self.ep}"] if self.ep > 1 else []
        extras += [f"ZeRO-{self.zero}", f"m {self.micro_batches}"]
        extras += ["flash"] if self.attention == "flash" else []
        extras += ["selective"] if self.recomputation == "selective" else []
        extras += ["SP"] if self.sequence_parallel else []
        extras += ["recompute"] if self.recompute else []
        extras += ["per matrix"] if self.zero == 3 and self.gather_unit == "matrix" else []
        cp = f" x cp {self.cp}" if self.cp > 1 else ""
        return f"dp {self.dp}{cp} x tp {self.tp} x pp {self.pp}{stages}, " + ", ".join(extras)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def stage_text(stages) -> str:
    """Layers per stage in short: ``(5, 6, 6, 5)`` as ``5+6x2+5``."""
    out, i = [], 0
    while i < len(stages):
        j = i
        while j + 1 < len(stages) and stages[j + 1] == stages[i]:
            j += 1
        out.append(f"{stages[i]}x{j - i + 1}" if j > i else f"{stages[i]}")
        i = j + 1
    return "+".join(out)
