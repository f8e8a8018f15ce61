"""What a parallel plan is made of: the model, the cluster and the plan itself (lesson 12).

Lecture: the seed article's "choose a strategy" step. Three descriptions, each checked once, when
it is made, so that a plan that cannot exist is refused with the field that is wrong:

* :class:`Transformer` (:mod:`course_lib.model_shapes`): the model, its parameters and FLOPs;
* :class:`Cluster`: GPUs in nodes, their memory, peak speed and links;
* :class:`Plan`: data x tensor x pipeline degrees (and context and expert parallelism), a ZeRO
  stage, micro-batches, and how the activations are kept (recomputation, attention's scores,
  sequence parallelism, interleaving, layers per stage).

Throughput and model FLOPs utilisation (MFU) use model FLOPs; step time uses hardware FLOPs.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, fields

from course_lib.model_shapes import (  # noqa: F401  (the plan's vocabulary, in one place)
    ATTENTION,
    Transformer,
    check_positive,
    plain_ints,
)

GATHER_UNITS = ("block", "matrix")


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
        plain_ints(self)
        check_positive("Cluster", gpus_per_node=self.gpus_per_node, nodes=self.nodes)

        def real(value) -> bool:  # a number, not a bool or text
            return not isinstance(value, bool) and isinstance(value, numbers.Real)

        for name in ("memory", "peak_flops", "intra_bandwidth", "inter_bandwidth"):
            value = getattr(self, name)
            if not (real(value) and 0 < value < float("inf")):
                raise ValueError(f"Cluster.{name} must be positive and finite, got {value!r}")
        for name in ("intra_latency", "inter_latency"):
            value = getattr(self, name)
            if not (real(value) and 0 <= value < float("inf")):
                raise ValueError(f"Cluster.{name} must be zero or positive and finite, got "
                                 f"{value!r}")
        if not (real(self.mfu) and 0 < self.mfu <= 1):
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
    spread them over 64), two all-to-alls per mixture-of-experts layer forward; ZeRO then shards
    an expert's state over the dp x cp / ep ranks that hold it."""

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
        plain_ints(self)
        check_positive("Plan", dp=self.dp, tp=self.tp, pp=self.pp, micro_batches=self.micro_batches,
                  chunks=self.chunks, cp=self.cp, ep=self.ep)
        if self.zero not in (0, 1, 2, 3) or not isinstance(self.zero, int) or \
                isinstance(self.zero, bool):
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
            if isinstance(self.stages, str | bytes) or not hasattr(self.stages, "__len__"):
                raise ValueError(f"Plan.stages is a tuple of each stage's layers, e.g. (5, 6, 6, "
                                 f"5), got {self.stages!r}")
            stages = tuple(self.stages)
            if len(stages) != self.pp:
                raise ValueError(f"Plan.stages gives {len(stages)} stages, but pp = {self.pp}")
            check_positive("Plan", **{f"stages[{i}]": n for i, n in enumerate(stages)})
            object.__setattr__(self, "stages", tuple(map(int, stages)))

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
