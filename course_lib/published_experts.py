"""A published run with expert parallelism, to check the planner's ep axis against (lesson 13).

Lecture: the seed article's "hybrid parallel modes", with the axis of mixtures of experts. As in
:mod:`course_lib.published`, every number is copied from the source named beside it, and
nothing is fitted to it. Its cluster: H800 GPUs, an H100's compute with a slower NVLink.
"""

from __future__ import annotations

from course_lib.plans import Transformer
from course_lib.published import Run

DEEPSEEK_2024 = "DeepSeek-AI 2024, DeepSeek-V3 technical report, sections 3.1-3.2 and 4.2"

# DeepSeek-V3: 2,048 H800 GPUs, pipeline 16 x experts over 64 GPUs (8 nodes) x ZeRO-1 data
# parallelism, no tensor parallelism; 61 layers 7,168 wide, 128 heads, 256 routed experts of
# 2,048 (gated) per block, each token sent to 8 and to one shared expert; 15,360 sequences of
# 4,096 tokens a step (after the warm-up of the batch size), vocabulary 129,280; 180K GPU-hours
# per trillion tokens: 1,543 tokens a second per GPU. Our shape differs: standard attention for
# its multi-head latent attention (whose scores are 128 x 192 wide, not 7,168: about 16% more
# of a layer's FLOPs than counted), the first 3 blocks' dense MLP (18,432 wide: 9 experts' FLOPs)
# counted as experts (5% more parameters), no multi-token prediction. Not modelled: its FP8
# matrix products, its DualPipe schedule, and what it does to fit in memory (activations kept
# in FP8, norms recomputed): the planner's memory for it is over 80 GiB.
DEEPSEEK_V3 = Transformer(layers=61, hidden=7168, heads=128, seq=4096, vocab=129_280,
                          global_batch=15_360, ffn=2048, gated_mlp=True, dropout=False,
                          learned_positions=False, tied_head=False, experts=256, top_k=8,
                          shared_experts=1)
_SECONDS = DEEPSEEK_V3.global_batch * DEEPSEEK_V3.seq / (2048 * 1e12 / (180e3 * 3600))
EXPERT_RUN = Run("DeepSeek-V3 671B", DEEPSEEK_2024, DEEPSEEK_V3, "h800", 2048,
                 dict(tp=1, pp=16, dp=128, ep=64, zero=1),
                 DEEPSEEK_V3.model_flops() / (_SECONDS * 2048) / 1e12, convention="model",
                 seconds=_SECONDS, options=dict(attention=("flash",), recompute=(False,),
                                                sequence_parallel=(False,), chunks=(1,),
                                                ep=(1, 8, 64)))
