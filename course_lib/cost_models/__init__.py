"""Every closed-form prediction of the course, in one vocabulary, and the fits of their constants.

Each lesson puts a measurement next to a formula from here. One vocabulary throughout:

* ``p``: the processes taking part (the lecture note's workers m, a pipeline's stages, ZeRO's
  N_d, the ranks of a collective), at least 1 (:func:`check_processes` refuses less);
* ``n_bytes``: the size of one message or vector; ``d``: the numbers (words) in a model;
* ``alpha`` (seconds per message) and ``beta`` (seconds per byte): the alpha-beta model of one
  message, t = alpha + beta n;
* ``f``: the parallel fraction of a program; ``micro_batches``: a pipeline's m;
* ``psi``: a model's parameter count (ZeRO's Psi).

Sources: the lecture note on parallel ERM (section 2.4), slides parts 1-3; Amdahl, Gustafson,
GPipe, Megatron-LM, ZeRO, nccl-tests.

The formulas live in modules by topic (``laws``, ``messages``, ``distributed_sgd``,
``model_parallel``, ``long_sequences``); every one of them is importable from here."""

from course_lib.cost_models.distributed_sgd import (  # noqa: F401
    async_staleness,
    federated_bytes_per_round,
    parameter_server_epoch_seconds,
    parameter_server_words,
    quantized_sum_error_bound,
)
from course_lib.cost_models.laws import (  # noqa: F401
    amdahl_speedup,
    bulk_synchronous_timeline,
    check_processes,
    check_sizes,
    fit_amdahl,
    fit_gustafson,
    gustafson_speedup,
    probability_any_fails,
)
from course_lib.cost_models.long_sequences import (  # noqa: F401
    CONTEXT_PARALLEL,
    all_to_all_time,
    context_parallel_bytes,
    expert_parallel_time,
    ring_attention_time,
    ring_ulysses_crossover,
    ulysses_time,
)
from course_lib.cost_models.messages import (  # noqa: F401
    ALL_REDUCE_ALGORITHMS,
    all_reduce_bytes,
    alpha_beta_time,
    bus_bandwidth,
    fit_alpha_beta,
    hidden_fraction_model,
    overlapped_messages,
    ring_all_reduce_time,
)
from course_lib.cost_models.model_parallel import (  # noqa: F401
    ZERO_STAGES,
    bubble_fraction,
    idle_fraction,
    megatron_all_reduces,
    megatron_bytes,
    pipeline_timeline,
    zero_bytes_per_rank,
)
