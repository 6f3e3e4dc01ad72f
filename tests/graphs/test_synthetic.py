"""Tests of graphs.synthetic: determinism, shape, size bounds and op cost formulas."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphs import synthetic as S
from graphs.compgraph import BWD, FWD, OPT

GENERATORS = {
    "layered": lambda seed, training=True: S.layered_dag(5, 4, rng=seed, training=training),
    "series_parallel": lambda seed, training=True: S.series_parallel(
        30, rng=seed, training=training
    ),
    "nasnet": lambda seed, training=True: S.nasnet_cells(3, blocks=3, rng=seed, training=training),
    "sample": lambda seed, training=True: S.sample(seed, training=training),
}


@pytest.mark.parametrize("gen", sorted(GENERATORS))
def test_same_seed_same_graph_different_seed_different(gen):
    f = GENERATORS[gen]
    a, b = f(7), f(7)
    assert a.content_hash() == b.content_hash() and a.name == b.name
    assert len({f(s).content_hash() for s in (7, 8, 9)}) == 3
    # an np.random.Generator in the same state gives the same graph
    assert f(np.random.default_rng(3)).content_hash() == f(np.random.default_rng(3)).content_hash()


@pytest.mark.parametrize("gen", sorted(GENERATORS))
def test_training_graph_structure(gen):
    g = GENERATORS[gen](1)
    fwd = np.flatnonzero(g.kind == FWD)
    assert nx.is_directed_acyclic_graph(g.to_networkx())
    assert (g.kind == BWD).sum() == len(fwd)  # every forward op has gradient work
    owners = [i for i in fwd if g.param_bytes[i] > 0]
    assert (g.kind == OPT).sum() == len(owners) > 0
    for i in owners:
        j, k = g.index("bwd:" + g.name[i]), g.index("opt:" + g.name[i])
        assert g.group[i] == g.group[j] == g.group[k]
    assert g.meta["bytes_per_param"] == 16.0
    assert g.meta["batch"] >= 1 and g.meta["name"] and g.meta["tokens"] >= g.meta["batch"]
    for arr in (g.flops, g.bytes_accessed, g.out_bytes, g.param_bytes, g.act_bytes):
        assert np.isfinite(arr).all() and (arr >= 0).all()
    assert g.total_flops(FWD) > 0


def test_forward_only():
    g = S.series_parallel(10, rng=0, training=False)
    assert g.num_nodes == 10 and (g.kind == FWD).all()


def test_layered_exact_widths_and_edges_between_layers():
    widths = [2, 3, 1, 4]
    g = S.layered_dag(4, widths, rng=5, training=False, skip_prob=0.0, edge_prob=0.0)
    assert g.num_nodes == 10
    np.testing.assert_array_equal(g.layer, [0, 0, 1, 1, 1, 2, 3, 3, 3, 3])
    # with edge_prob = skip_prob = 0 every op of layer l > 0 reads exactly one op of layer l - 1
    for v in range(2, 10):
        preds = g.predecessors(v)
        assert len(preds) == 1 and g.layer[preds[0]] == g.layer[v] - 1
    dense = S.layered_dag(4, widths, rng=5, training=False, edge_prob=1.0, skip_prob=0.0)
    assert dense.num_edges == 2 * 3 + 3 * 1 + 1 * 4


def test_layered_random_width_bounds():
    for seed in range(5):
        g = S.layered_dag(6, 3, rng=seed, training=False)
        assert 6 <= g.num_nodes <= 18 and g.layer.max() == 5


def test_series_parallel_two_terminal():
    for seed in range(5):
        g = S.series_parallel(25, rng=seed, training=False)
        assert g.num_nodes == 25
        indeg = np.bincount(g.dst, minlength=25)
        outdeg = np.bincount(g.src, minlength=25)
        assert np.flatnonzero(indeg == 0).tolist() == [0]
        assert np.flatnonzero(outdeg == 0).tolist() == [1]
        # joins combine their branches with an add
        assert all(g.name[v].startswith("add_") for v in np.flatnonzero(indeg > 1))
    chain = S.series_parallel(6, p_series=1.0, rng=0, training=False)
    assert chain.num_edges == 5  # only subdivisions: a path


def test_nasnet_node_count_and_cells():
    for cells, blocks in [(1, 1), (3, 2), (4, 5)]:
        g = S.nasnet_cells(cells, blocks=blocks, rng=0, training=False)
        assert g.num_nodes == 1 + cells * (3 * blocks + 3) + 2
        assert g.module[0] == "stem" and g.module[-1] == "head.fc"
        assert sum(m.endswith(".concat") for m in g.module) == cells
    # the same cell structure repeats: normal cells 0 and 1 have the same op sequence
    g = S.nasnet_cells(3, blocks=4, reduction_every=3, rng=2, training=False)
    ops = [
        [n.split("_")[0] for n, m in zip(g.name, g.module) if m.startswith(f"cell{c}.")]
        for c in range(3)
    ]
    assert ops[0] == ops[1]
    # channels double in the reduction cell (cell 2): its 1x1 prep conv has 2x the output channels
    t = lambda i: g.out_bytes[i]  # noqa: E731
    p0, p2 = (
        g.index(next(n for n, m in zip(g.name, g.module) if m == "cell0.prep1")),
        g.index(next(n for n, m in zip(g.name, g.module) if m == "cell2.prep1")),
    )
    assert t(p2) == pytest.approx(t(p0) * 2 / 4)  # x2 channels, /4 positions (stride 2)


@pytest.mark.parametrize("kind", ["layered", "series_parallel", "nasnet", "mixed"])
def test_sample_size_bounds(kind):
    for seed in range(6):
        g = S.sample(seed, kind, min_nodes=30, max_nodes=120, training=False)
        assert 30 <= g.num_nodes <= 120
        if kind != "mixed":
            assert g.meta["generator"].startswith(kind)


def test_sample_default_sizes_vary():
    sizes = [int((S.sample(s).kind == FWD).sum()) for s in range(30)]
    assert min(sizes) >= 20 and max(sizes) <= 200
    assert max(sizes) - min(sizes) > 60
    assert len({S.sample(s).meta["generator"] for s in range(30)}) == 3


def test_matmul_and_conv_costs_follow_the_formulas():
    """Weighted ops with one input: flops, params and bytes from the input and output widths."""
    checked = 0
    for seed in range(6):
        g = S.sample(seed, training=False)
        tokens = g.meta["tokens"]
        for v in range(g.num_nodes):
            op = g.name[v].split("_")[0]
            preds = g.predecessors(v)
            if op != "matmul" or len(preds) != 1 or g.meta["generator"] == "nasnet_cells":
                continue
            cin = g.out_bytes[preds[0]] / (2 * tokens)
            cout = g.out_bytes[v] / (2 * tokens)
            assert g.flops[v] == pytest.approx(2 * tokens * cin * cout)
            assert g.param_bytes[v] == pytest.approx(16 * (cin * cout + cout))
            assert g.act_bytes[v] == pytest.approx(2 * tokens * cin)
            checked += 1
    assert checked > 5


def test_op_cost_table_hand_computed():
    i, o = S._Shape(10, 4), S._Shape(10, 8)
    assert S.OPS["matmul"](i, o, 1) == (2 * 10 * 4 * 8, 40 + 40 + 80, 4 * 8 + 8, 40)
    assert S.OPS["conv"](i, o, 3) == (2 * 10 * 9 * 4 * 8, 40 + (9 * 32 + 8) + 80, 9 * 32 + 8, 40)
    assert S.OPS["add"](o, o, 1) == (80, 240, 0.0, 0.0)
    assert S.OPS["identity"](i, i, 1) == (0.0, 0.0, 0.0, 0.0)
    assert S.OPS["embedding"](i, o, 100)[2] == 800


@pytest.mark.parametrize(
    "call, msg",
    [
        (
            lambda: S.sample(0, "ring"),
            r"unknown synthetic graph kind 'ring'; expected one of \['mixed', 'layered'",
        ),
        (lambda: S.sample(0, min_nodes=50, max_nodes=10), "min_nodes <= max_nodes"),
        (
            lambda: S.sample(0, "nasnet", min_nodes=2, max_nodes=5),
            "could not make a 'nasnet' graph",
        ),
        (lambda: S.series_parallel(1), "n must be an integer >= 2, got 1"),
        (lambda: S.series_parallel(5, p_series=2.0), r"p_series must be in \[0, 1\]"),
        (lambda: S.layered_dag(0, 3), "n_layers must be an integer >= 1, got 0"),
        (lambda: S.layered_dag(2, [1]), "width list must have 2 entries"),
        (lambda: S.layered_dag(2, 0), "width must be an integer >= 1, got 0"),
        (lambda: S.layered_dag(2, 2, edge_prob=-0.1), r"edge_prob must be in \[0, 1\]"),
        (lambda: S.layered_dag(2, 2, domain="audio"), "unknown domain 'audio'"),
        (lambda: S.nasnet_cells(0), "n_cells must be an integer >= 1, got 0"),
        (lambda: S.sample("seed"), "rng must be a numpy Generator, an int seed or None"),
        # 2 Dec 2026, found by fuzzing: numpy / comparison TypeErrors, or taken silently
        (lambda: S.layered_dag(2.5, 3), "n_layers must be an integer >= 1, got 2.5"),
        (lambda: S.layered_dag(3, [1.9, 2.9, 2.9]), r"width\[\] must be an integer >= 1, got 1.9"),
        (lambda: S.layered_dag(3, "123"), "width must be an integer or a list of integers"),
        (lambda: S.layered_dag(3, 2, training="no"), "training must be true or false, got 'no'"),
        (lambda: S.series_parallel(2.5), "n must be an integer >= 2, got 2.5"),
        (lambda: S.series_parallel("3"), "n must be an integer >= 2, got '3'"),
        (lambda: S.series_parallel(5, rng=-1), "a seed must be an integer >= 0, got -1"),
        (
            lambda: S.nasnet_cells(6, reduction_every=float("nan")),
            "reduction_every must be an integer",
        ),
        (lambda: S.nasnet_cells(6, max_reductions=2.5), "max_reductions must be an integer >= 0"),
        (lambda: S.sample(0, max_nodes=float("inf")), "max_nodes must be an integer >= 2, got inf"),
        (lambda: S.sample(0, min_nodes=2.5), "min_nodes must be an integer >= 2, got 2.5"),
        (lambda: S.layered_dag(3, 2, edge_prob="x"), r"edge_prob must be in \[0, 1\], got x"),
        (lambda: S.layered_dag(3, 2, skip_prob=None), r"skip_prob must be in \[0, 1\], got None"),
    ],
)
def test_errors(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(5, 60),
    st.sampled_from(["layered", "series_parallel", "nasnet", "mixed"]),
)
def test_sample_properties(seed, lo, kind):
    hi = lo + 60
    g = S.sample(seed, kind, min_nodes=lo, max_nodes=hi, training=False)
    assert lo <= g.num_nodes <= hi
    assert (
        S.sample(seed, kind, min_nodes=lo, max_nodes=hi, training=False).content_hash()
        == g.content_hash()
    )
    pos = np.empty(g.num_nodes, dtype=np.int64)
    pos[g.topo_order] = np.arange(g.num_nodes)
    assert (pos[g.src] < pos[g.dst]).all()
