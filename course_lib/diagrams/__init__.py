"""Diagrams of the lessons' ideas, drawn from the objects a lesson runs (not typed in).

A measurement shows what happened; a diagram shows the idea the measurement is about. Each
function here takes plain data a lesson reads off its own objects — the pids of the workers it
launched, the shapes its layers produced, the buckets its synchroniser built, the shards ZeRO
gives each rank, the ranks a plan's device mesh lays out — and draws the lectures' picture of
it. Nothing here computes the idea itself: a diagram is only as right as the objects it is given.

The diagrams live in modules by topic (``data_parallel``, ``model_parallel``, ``sequences``),
drawn with ``shapes``; every one is importable from here.
"""

from course_lib.diagrams.data_parallel import (  # noqa: F401
    plot_buckets,
    plot_graphs,
    plot_layer_chain,
    plot_masks,
    plot_process_tree,
    plot_server_star,
)
from course_lib.diagrams.model_parallel import (  # noqa: F401
    plot_plan_terms,
    plot_rank_grid,
    plot_zero_stages,
)
from course_lib.diagrams.sequences import (  # noqa: F401
    plot_causal_work,
    plot_ring_steps,
    plot_token_path,
)
from course_lib.diagrams.shapes import COLORS, NODE_COLORS  # noqa: F401
