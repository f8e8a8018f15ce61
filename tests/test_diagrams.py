"""Diagrams drawn from the objects a lesson runs (course_lib.diagrams)."""

import matplotlib.pyplot as plt
import pytest
import torch

from course_lib import diagrams, zero
from course_lib import overlap as ov
from course_lib.models import tiny_gpt


def texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts] + \
        [ax.get_title() for ax in fig.axes]


def test_the_process_tree_shows_the_kernel_what_is_between_and_every_rank():
    fig = diagrams.plot_process_tree(100, {201: 150, 202: 150, 150: 100}, {0: 201, 1: 202})
    shown = texts(fig)
    assert "notebook kernel\npid 100" in shown and "process\npid 150" in shown
    named = texts(diagrams.plot_process_tree(100, {201: 150, 202: 150, 150: 100}, {0: 201, 1: 202},
                                             names={150: "course_lib fork server"}))
    assert "course_lib fork server\npid 150" in named
    assert {"rank 0\npid 201", "rank 1\npid 202"} <= set(shown)
    cold = texts(diagrams.plot_process_tree(100, {201: 100}, {0: 201}))  # no fork server
    assert not any("process" in t for t in cold) and "rank 0\npid 201" in cold
    with pytest.raises(ValueError, match="share one parent"):
        diagrams.plot_process_tree(100, {201: 150, 202: 100, 150: 100}, {0: 201, 1: 202})
    with pytest.raises(ValueError, match="ranks is empty"):
        diagrams.plot_process_tree(100, {}, {})
    plt.close("all")


def test_the_layer_chain_labels_every_tensor_both_ways():
    shapes = [(8, 64), (8, 32), (8, 32), (8, 10), ()]
    grads = [(8, 64), (8, 32), (8, 32), (8, 10), ()]
    fig = diagrams.plot_layer_chain(["linear", "relu", "linear", "loss"], shapes, grads)
    shown = texts(fig)
    assert [t for t in shown if t in ("8×64", "8×32", "8×10", "scalar")] == \
        ["8×64", "8×64", "8×32", "8×32", "8×32", "8×32", "8×10", "8×10", "scalar", "scalar"]
    other = texts(diagrams.plot_layer_chain(["a"], [(2, 3), (2, 4)], [(5,), (2, 4)]))
    assert "5" in other  # what backward handed down is drawn as measured
    with pytest.raises(ValueError, match="3 layers need 4 shapes"):
        diagrams.plot_layer_chain(["linear", "relu", "linear"], shapes[:3], grads[:3])
    plt.close("all")


def test_buckets_are_drawn_in_the_order_backward_fills_them():
    params = list(tiny_gpt().parameters())
    buckets = ov.assign_buckets(params, 0.5)
    sizes = [p.numel() * p.element_size() for p in params]
    fig = diagrams.plot_buckets(sizes, buckets)
    bars = fig.axes[0].patches
    assert len(bars) == len(params)
    assert bars[-1].get_x() + bars[-1].get_width() == pytest.approx(sum(sizes) / 2**10)
    assert bars[0].get_width() == pytest.approx(sizes[buckets[0][0]] / 2**10)  # the last layer's
    assert sum(t.startswith("bucket ") for t in texts(fig)) == len(buckets)
    with pytest.raises(ValueError, match="exactly once"):
        diagrams.plot_buckets(sizes, buckets[1:])
    for unit in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="unit must be a positive number of bytes"):
            diagrams.plot_buckets(sizes, buckets, unit=unit)
    plt.close("all")


def test_zero_stages_shard_state_then_gradients_then_parameters():
    n, p = 1000, 4
    fig = diagrams.plot_zero_stages(n, [zero.shard_bounds(n, p, r) for r in range(p)])
    per_stage = [sorted(round(b.get_width(), 3) for b in ax.patches) for ax in fig.axes[:4]]
    assert per_stage[0] == [1.0] * 12                       # every rank holds everything
    assert per_stage[1] == [0.25] * 4 + [1.0] * 8           # its quarter of the state
    assert per_stage[2] == [0.25] * 8 + [1.0] * 4           # ... and of the gradients
    assert per_stage[3] == [0.25] * 12                      # ... and of the parameters
    starts = sorted(b.get_x() for b in fig.axes[3].patches)
    assert starts[::3] == [0.0, 0.25, 0.5, 0.75]             # each rank its own shard
    for numel in (0, float("nan"), 2.5, True):
        with pytest.raises(ValueError, match="numel must be a whole number of at least 1"):
            diagrams.plot_zero_stages(numel, [(0, 0, 0)])
    plt.close("all")


def test_the_rank_grid_places_each_rank_of_the_mesh():
    layout = torch.arange(16).view(2, 2, 4).tolist()   # dp 2, pp 2, tp 4, as train_gpt's mesh
    fig = diagrams.plot_rank_grid(layout, gpus_per_node=8)
    panels = [ax for ax in fig.axes if ax.get_title().startswith("replica")]
    assert [ax.get_title() for ax in panels] == ["replica 0", "replica 1"]
    numbers = [t.get_text() for t in panels[1].texts]
    assert numbers == [str(r) for r in range(8, 16)]
    colours = {b.get_facecolor() for b in panels[0].patches}
    assert len(colours) == 1  # ranks 0-7: one node
    wide = diagrams.plot_rank_grid(torch.arange(64).view(8, 1, 8).tolist(), gpus_per_node=8)
    assert [ax.get_title() for ax in wide.axes][-1] == "replica 3 (of 8)"
    for bad in (0, 2.5, float("nan"), True):
        with pytest.raises(ValueError, match="gpus_per_node must be a whole number"):
            diagrams.plot_rank_grid(layout, gpus_per_node=bad)
    plt.close("all")


def test_the_server_star_draws_a_line_per_worker_as_thick_as_its_share():
    panels = {"sync": {"shares": [0.25] * 4, "labels": ["0"] * 4},
              "async": {"shares": [0.3, 0.3, 0.3, 0.1], "labels": ["a", "b", "c", "late"]}}
    fig = diagrams.plot_server_star(panels, title="two runs")
    widths = {ax.get_title(): [round(line.get_linewidth(), 3) for line in ax.lines]
              for ax in fig.axes}
    assert widths == {"sync": [3.5] * 4, "async": [4.1, 4.1, 4.1, 1.7]}
    assert {"S", "1", "4", "late"} <= set(texts(fig))
    assert [t.get_text() for t in fig.texts] == ["two runs"]
    with pytest.raises(ValueError, match="panels is empty"):
        diagrams.plot_server_star({})
    with pytest.raises(ValueError, match="one share .* per worker, got 2 shares and 1 labels"):
        diagrams.plot_server_star({"x": {"shares": [0.5, 0.5], "labels": ["a"]}})
    plt.close("all")


def test_gossip_graphs_draw_an_edge_per_positive_weight():
    from course_lib import decentralized as dec

    panels = {name: dec.mixing_matrix(graph).tolist() for name, graph in dec.GRAPHS.items()}
    fig = diagrams.plot_graphs(panels)
    edges = {ax.get_title(): len(ax.lines) for ax in fig.axes}
    assert edges == {name: sum(len(v) for v in graph.values()) // 2
                     for name, graph in dec.GRAPHS.items()}
    ring = next(ax for ax in fig.axes if ax.get_title() == "ring")
    assert sorted({round(line.get_linewidth(), 3) for line in ring.lines}) == [0.5 + 6 / 3]
    with pytest.raises(ValueError, match="panels is empty"):
        diagrams.plot_graphs({})
    plt.close("all")


def test_the_masks_and_their_sum_are_drawn_row_by_row():
    from course_lib import fl_security as sec

    masks = sec.pairwise_masks(4, 6, seed=7)
    fig = diagrams.plot_masks(masks.tolist())
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[:4] == ["client 0", "client 1", "client 2", "client 3"]
    assert labels[4].startswith("sum (|·| ≤ ") and float(labels[4][10:-1]) < 1e-9
    cells = [t.get_text() for t in fig.axes[0].texts]
    assert len(cells) == 5 * 6 and cells[-6:] == ["0"] * 6  # the masks cancel
    assert cells[:6] == [f"{v:.0f}" if abs(v) >= 0.5 else "0" for v in masks[0].tolist()]
    for empty in ([], [[], []]):
        with pytest.raises(ValueError, match="masks is empty"):
            diagrams.plot_masks(empty)
    plt.close("all")


def test_the_plan_terms_stack_to_each_plans_predicted_step():
    from course_lib import planner as P

    model = P.Transformer(layers=32, hidden=4096, heads=32, seq=2048, vocab=51_200,
                          global_batch=512)
    cluster = P.Cluster(gpus_per_node=8, nodes=4, memory=80 * 2**30, peak_flops=312e12,
                        intra_bandwidth=300e9, inter_bandwidth=25e9)
    fits = [r for r in P.rank_plans(model, cluster) if r.fits][:5]
    fig = diagrams.plot_plan_terms(fits, P.TERMS, title="7B")
    ax = fig.axes[0]
    for i, r in enumerate(fits):  # each bar's segments end where the plan's total does
        ends = [p.get_x() + p.get_width() for p in ax.patches if abs(p.get_y() + 0.4 - i) < 1e-9]
        assert len(ends) == len(P.TERMS)
        assert max(ends) == pytest.approx(r.time["total"])
    assert [t for t in texts(fig) if "GiB" in t] == \
        [f"  {r.plan}  ({r.memory['total'] / 2**30:.0f} GiB)" for r in fits]
    some = [t for t in P.TERMS if any(r.time[t] > 0 for r in fits)]  # no experts, no cp here
    assert "expert_parallel" not in some and "context_parallel" not in some and "compute" in some
    assert [t.get_text() for t in ax.get_legend().get_texts()] == \
        [t.replace("_", " ") for t in some]  # the legend named every term, zero in every bar
    empty = diagrams.plot_plan_terms([], P.TERMS, empty="no plan fits: more GPUs")
    assert "no plan fits: more GPUs" in texts(empty) and empty.axes[0].get_legend() is None
    assert list(empty.axes[0].get_xticks()) == [] and empty.axes[0].get_xlabel() == ""
    plt.close("all")


@pytest.mark.filterwarnings("ignore:.*oversubscribed")  # 4 ranks on 2 cores: a trace, no times
def test_the_ring_steps_show_whose_keys_each_rank_holds_and_what_causality_skips():
    from course_lib import context_parallel as cp
    from course_lib import launch

    p = 4
    q, k, v, d_out = (torch.randn(2, 16, 4, dtype=torch.float64) for _ in range(4))
    results = launch(cp.run_context_parallel, p, args=(q, k, v, d_out),
                     kwargs=dict(causal=True, layout="contiguous"))
    traces = [r["counts"]["trace"] for r in results]
    for r, trace in enumerate(traces):  # rank r holds rank (r - s) mod p's block at step s
        assert [(s, o) for s, o, _ in trace] == [(s, (r - s) % p) for s in range(p)]
        assert [computed for *_, computed in trace] == [(r - s) % p <= r for s in range(p)]
    fig = diagrams.plot_ring_steps(traces)
    shown = texts(fig)
    assert sum("skipped" in t for t in shown) == sum(r["counts"]["skipped"] for r in results) == 6
    assert {f"step {s}" for s in range(p)} <= set(shown) and "rank 3" in shown
    with pytest.raises(ValueError, match="traces is empty"):
        diagrams.plot_ring_steps([])
    plt.close("all")


def test_the_causal_work_shares_are_each_ranks_unmasked_pairs():
    from course_lib.context_parallel import LAYOUTS, sequence_positions

    tokens, p = 16, 4
    splits = {layout: [sequence_positions(tokens, p, r, layout) for r in range(p)]
              for layout in LAYOUTS}
    fig = diagrams.plot_causal_work(splits, tokens)
    titles = [ax.get_title() for ax in fig.axes]
    pairs = [sum(q + 1 for q in range(4 * r, 4 * r + 4)) for r in range(p)]  # contiguous rows
    assert titles[0] == "contiguous\nrank shares: " + ", ".join(
        f"{w / sum(pairs):.0%}" for w in pairs)
    assert titles[1] == "zigzag\nrank shares: 25%, 25%, 25%, 25%"
    with pytest.raises(ValueError, match="the same number of ranks"):
        diagrams.plot_causal_work({"a": [[0, 1], [2, 3]], "b": [[0], [1], [2], [3]]}, 4)
    for positions in ([[], []], [[0, 1], [2, 4]], [[-1], [2]]):
        with pytest.raises(ValueError, match=r"positions must lie in 0..3"):
            diagrams.plot_causal_work({"a": positions}, 4)
    plt.close("all")


def test_the_token_path_dashes_exactly_the_dropped_routes():
    from course_lib import experts as ex

    torch.manual_seed(0)
    chosen, gates, _ = ex.route(torch.randn(6, 4), 2)
    slots = ex.assign_slots(chosen, 4, 2)
    fig = diagrams.plot_token_path(chosen, slots, gates, experts_per_rank=2)
    arrows = [a for a in fig.axes[0].texts if getattr(a, "arrow_patch", None) is not None]
    dashed = [a for a in arrows if a.arrow_patch.get_linestyle() in ("--", "dashed")]
    dropped = int((slots < 0).sum())
    # each token to its router; each route dispatched; each kept route combined back
    assert len(arrows) == 6 + 12 + (12 - dropped) and len(dashed) == dropped > 0
    assert "expert 3\nrank 1" in texts(fig) and "token 5" in texts(fig)
    assert "output 5" in texts(fig) and {"all-to-all: dispatch", "all-to-all: combine"} <= set(
        texts(fig))
    e, g = chosen[0].tolist(), gates[0].tolist()
    assert f"router\nE{e[0]} {g[0]:.2f}, E{e[1]} {g[1]:.2f}" in texts(fig)
    later = diagrams.plot_token_path(chosen[3:], slots[3:], gates[3:], 2, first=3)
    assert [t for t in texts(later) if t.startswith("token")] == ["token 3", "token 4", "token 5"]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="experts_per_rank must be a whole number"):
            diagrams.plot_token_path(chosen, slots, gates, bad)
    plt.close("all")
