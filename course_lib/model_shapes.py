"""The shape of a model, as the planner counts it: parameters and FLOPs (lessons 12 and 13).

Lecture: the seed article's "choose a strategy" step. :class:`Transformer` describes a GPT-style
model (GPT-2 and Megatron's GPT by default; grouped-query attention, a gated MLP and no dropout
describe Llama-style models; ``experts`` a mixture of experts, as in Switch Transformer, Mixtral
and DeepSeek-V3), checked once, when it is made.

FLOPs are counted two ways, and every printed figure says which (Chowdhery et al. 2022, PaLM,
appendix B; Korthikanti et al. 2022, section 6): **model FLOPs** are the work the model needs,
6 per parameter a token uses and token, plus attention; **hardware FLOPs** add what
recomputation repeats. A mixture of experts counts only the experts a token is sent to.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, fields

ATTENTION = ("stored", "recomputed", "flash")  # how attention's scores are kept

def check_positive(owner: str, **values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{owner}.{name} must be a positive whole number, got {value!r}")


def plain_ints(shape) -> None:
    """Make a frozen dataclass's whole numbers from numpy (``np.int64(4)``) Python ints, so a
    shape or plan built from an array prints, compares and hashes as one typed by hand."""
    for field in fields(shape):
        value = getattr(shape, field.name)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool | int):
            object.__setattr__(shape, field.name, int(value))



@dataclass(frozen=True)
class Transformer:
    """``layers`` blocks of width ``hidden`` with ``heads`` heads, sequences of ``seq`` tokens, a
    vocabulary of ``vocab``, ``global_batch`` sequences per step. ``value_bytes``: 2 for bf16 or
    fp16 mixed precision, 4 for float32 throughout (this course's runs). ``tied_head``: the
    output layer reuses the token embedding (GPT-2, Megatron's GPT). ``ffn``: the MLP's width
    (default 4 hidden); ``gated_mlp``: three matrices instead of two (SwiGLU, Llama);
    ``kv_heads``: grouped-query attention's key/value heads (default ``heads``); ``dropout``:
    dropout after attention and the MLP (masks kept for backward); ``learned_positions``: a
    position embedding of ``seq`` x ``hidden`` (GPT-2) rather than rotary positions (Llama).
    ``experts``: a mixture of experts in every block instead of one MLP (0: none): that many MLPs
    of width ``ffn`` and a router, each token sent to ``top_k`` of them (Switch Transformer: 1;
    Mixtral: 2; DeepSeek-V3: 8), plus ``shared_experts`` that every token passes through
    (DeepSeek-V3: 1)."""

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
    experts: int = 0
    top_k: int = 1
    shared_experts: int = 0

    def __post_init__(self):
        plain_ints(self)
        check_positive("Transformer", layers=self.layers, hidden=self.hidden, heads=self.heads,
                  seq=self.seq, vocab=self.vocab, global_batch=self.global_batch)
        if self.value_bytes not in (2, 4) or isinstance(self.value_bytes, bool | float):
            raise ValueError(f"Transformer.value_bytes must be 2 (bf16 mixed precision) or 4 "
                             f"(float32), got {self.value_bytes!r}")
        if self.ffn is not None:
            check_positive("Transformer", ffn=self.ffn)
        if self.kv_heads is not None:
            check_positive("Transformer", kv_heads=self.kv_heads)
            if self.heads % self.kv_heads:
                raise ValueError(f"Transformer.kv_heads = {self.kv_heads} must divide heads = "
                                 f"{self.heads} (each key/value head serves a group of heads)")
        for name in ("tied_head", "gated_mlp", "dropout", "learned_positions"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Transformer.{name} is True or False, got "
                                 f"{getattr(self, name)!r}")
        for name in ("experts", "shared_experts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Transformer.{name} must be a whole number >= 0, got {value!r}")
        check_positive("Transformer", top_k=self.top_k)
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"Transformer.top_k = {self.top_k} sends each token to more "
                             f"experts than the {self.experts} there are")
        if (self.shared_experts or self.top_k != 1) and not self.experts:
            raise ValueError("Transformer.shared_experts and top_k need experts > 0 (a mixture "
                             "of experts)")
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
    def mlp_parameters(self) -> int:
        """One MLP (or one expert): 2 h f weights (3 h f gated) and their biases."""
        h, f = self.hidden, self.ffn_width
        return (3 * h * f + 2 * f + h) if self.gated_mlp else (2 * h * f + f + h)

    def _block_parameters(self, mlps: int) -> int:
        h, k = self.hidden, self.kv_width
        attention = 2 * h * h + 2 * h * k + 2 * h + 2 * k
        router = h * self.experts
        return attention + mlps * self.mlp_parameters + router + 4 * h

    @property
    def expert_parameters(self) -> int:
        """One block's routed experts (0 without experts): what expert parallelism spreads."""
        return self.experts * self.mlp_parameters

    @property
    def layer_parameters(self) -> int:
        """One block: attention's q and output projection 2 h^2, keys and values 2 h k (k: the
        key width), their biases; the MLP's 2 h f (3 h f gated) and biases; two LayerNorms 4 h.
        For GPT-2's shape, 12 h^2 + 13 h. (A model without biases, like Llama, has a few h
        fewer: under 0.01 %.) With experts: every expert's MLP, the shared ones' and the
        router's h x experts instead of the one MLP."""
        return self._block_parameters(self.experts + self.shared_experts or 1)

    @property
    def active_layer_parameters(self) -> int:
        """The parameters of one block a token uses: the MLPs of its top_k experts and the
        shared ones (and the router); the whole block without experts."""
        return self._block_parameters(self.top_k + self.shared_experts if self.experts else 1)

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
        """One token's forward FLOPs: ``layer`` (2 per weight it uses, and attention's scores
        and weighted sum over the whole sequence, 4 h s, as Megatron-LM counts them) and
        ``head`` (the logits, 2 V h). Backward costs twice the forward."""
        return dict(layer=2 * self.active_layer_parameters + 4 * self.hidden * self.seq,
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
        if not isinstance(recompute, bool) or attention not in ATTENTION:
            raise ValueError(f"recompute is True or False and attention one of {ATTENTION}, got "
                             f"{recompute!r} and {attention!r}")
        if recompute:
            return self.forward_flops_per_token()["layer"]
        return 4 * self.hidden * self.seq if attention == "recomputed" else 0.0

    def hardware_flops(self, recompute: bool = False, attention: str = "stored") -> float:
        """FLOPs one step executes: model FLOPs plus what backward recomputes. With full
        recomputation this is Megatron-LM's count, 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
        (Narayanan et al. 2021, equation 3)."""
        extra = self.layers * self.recomputed_flops_per_token(recompute, attention)
        return self.model_flops() + extra * self.global_batch * self.seq
