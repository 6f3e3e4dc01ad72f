"""Tests of CompGraph: construction, validation errors, hashing, topo order and networkx view."""

from __future__ import annotations

import re

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphs.compgraph import BWD, FWD, OPT, CompGraph


def diamond(**kw) -> CompGraph:
    """a -> b, a -> c, b -> d, c -> d with hand-picked costs."""
    args = dict(
        flops=[1e9, 2e9, 3e9, 4e9],
        bytes_accessed=[10.0, 20.0, 30.0, 40.0],
        out_bytes=[100.0, 200.0, 300.0, 400.0],
        param_bytes=[16.0, 0.0, 32.0, 0.0],
        act_bytes=[5.0, 6.0, 7.0, 8.0],
        name=["a", "b", "c", "d"],
        module=["m.a", "m.b", "m.c", ""],
        meta={"name": "diamond", "bytes_per_param": 16},
    )
    args.update(kw)
    return CompGraph.build(4, [(0, 1), (0, 2), (1, 3), (2, 3)], **args)


# ------------------------------------------------------------------ build
def test_build_defaults_and_broadcast():
    g = CompGraph.build(3, [(0, 1), (1, 2)], flops=5.0, out_bytes=[1.0, 2.0, 3.0])
    assert g.num_nodes == 3 and g.num_edges == 2
    np.testing.assert_array_equal(g.flops, [5.0, 5.0, 5.0])
    # edge bytes default to the source's out_bytes
    np.testing.assert_array_equal(g.edge_bytes, [1.0, 2.0])
    np.testing.assert_array_equal(g.group, [0, 1, 2])
    assert g.name == ("n0", "n1", "n2")
    assert g.module == ("", "", "")
    assert g.kind.dtype == np.int8 and (g.kind == FWD).all()


def test_kind_names_accepted():
    g = CompGraph.build(3, [(0, 1), (1, 2)], kind=["fwd", "bwd", "opt"])
    np.testing.assert_array_equal(g.kind, [FWD, BWD, OPT])


def test_totals_and_params():
    g = diamond()
    assert g.total_flops() == pytest.approx(10e9)
    assert g.total_flops(FWD) == pytest.approx(10e9)
    assert g.total_flops(BWD) == 0.0
    assert g.num_params == pytest.approx(48.0 / 16)
    assert g.num_groups == 4
    assert len(g) == 4


def test_arrays_are_read_only():
    g = diamond()
    with pytest.raises(ValueError):
        g.flops[0] = 1.0
    with pytest.raises(ValueError):
        g.src[0] = 3


def test_predecessors_successors_index():
    g = diamond()
    assert sorted(g.predecessors(3).tolist()) == [1, 2]
    assert sorted(g.successors(0).tolist()) == [1, 2]
    assert g.index("c") == 2
    with pytest.raises(KeyError, match="'zz'"):
        g.index("zz")


def test_group_index():
    g = CompGraph.build(4, [(0, 1), (1, 2), (2, 3)], group=[7, 3, 7, 9])
    ids, inv = g.group_index()
    np.testing.assert_array_equal(ids, [3, 7, 9])
    np.testing.assert_array_equal(inv, [1, 0, 1, 2])
    assert g.num_groups == 3


# ------------------------------------------------------------- validation
def test_cycle_names_a_node():
    with pytest.raises(ValueError, match="cycle through node 'b'|cycle through node 'c'"):
        CompGraph.build(3, [(0, 1), (1, 2), (2, 1)], name=["a", "b", "c"])


def test_self_loop_names_the_node():
    with pytest.raises(ValueError, match="self loop on node 'b'"):
        CompGraph.build(2, [(0, 1), (1, 1)], name=["a", "b"])


@pytest.mark.parametrize("edge", [(0, 3), (-1, 1), (5, 0)])
def test_dangling_edge(edge):
    with pytest.raises(ValueError, match=r"edge 1 .* dangling"):
        CompGraph.build(3, [(0, 1), edge])


@pytest.mark.parametrize(
    "field", ["flops", "bytes_accessed", "out_bytes", "param_bytes", "act_bytes"]
)
@pytest.mark.parametrize("bad", [-1.0, np.nan, np.inf])
def test_bad_node_cost_names_node_and_field(field, bad):
    vals = [1.0, bad, 1.0]
    with pytest.raises(ValueError, match=rf"node 'b' has {field}="):
        CompGraph.build(3, [(0, 1)], name=["a", "b", "c"], **{field: vals})


@pytest.mark.parametrize("bad", [-1.0, np.nan, np.inf])
def test_bad_edge_bytes_names_edge(bad):
    with pytest.raises(ValueError, match=r"edge '1 \(b -> c\)' has bytes="):
        CompGraph.build(3, [(0, 1), (1, 2)], name=["a", "b", "c"], edge_bytes=[1.0, bad])


def test_duplicate_names():
    with pytest.raises(ValueError, match="node name 'x' is used twice"):
        CompGraph.build(3, [], name=["x", "y", "x"])


def test_bad_kind_int_names_node():
    with pytest.raises(ValueError, match="node 'b' has kind 3"):
        CompGraph.build(2, [], kind=[0, 3], name=["a", "b"])


def test_bad_kind_string():
    with pytest.raises(ValueError, match="unknown node kind"):
        CompGraph.build(2, [], kind=["fwd", "forward"])


def test_wrong_array_length():
    with pytest.raises(ValueError, match="'flops' has length 2, expected 3"):
        CompGraph.build(3, [], flops=[1.0, 2.0])
    with pytest.raises(ValueError, match="'module' has length 1, expected 2"):
        CompGraph.build(2, [], module=["x"])


def test_times_validation():
    # NaN (no measurement) and +inf (cannot run) are fine
    g = CompGraph.build(3, [(0, 1)], times={"gpu": [1.0, np.nan, np.inf]})
    assert np.isnan(g.times["gpu"][1]) and np.isinf(g.times["gpu"][2])
    with pytest.raises(ValueError, match=r"node 'b' has negative times\['gpu'\]"):
        CompGraph.build(2, [], name=["a", "b"], times={"gpu": [1.0, -2.0]})
    with pytest.raises(ValueError, match=r"node 'a' has negative times\['cpu'\]"):
        CompGraph.build(2, [], name=["a", "b"], times={"cpu": [-np.inf, 1.0]})
    with pytest.raises(ValueError, match=r"times\['gpu'\] has shape \(3,\), expected \(2,\)"):
        CompGraph.build(2, [], times={"gpu": [1.0, 2.0, 3.0]})


def test_edge_time_validation():
    g = CompGraph.build(3, [(0, 1), (1, 2)], edge_time=[1.5, np.nan])
    assert g.edge_time[0] == 1.5
    with pytest.raises(ValueError, match="edge 1 has invalid edge_time"):
        CompGraph.build(3, [(0, 1), (1, 2)], edge_time=[1.0, np.inf])
    with pytest.raises(ValueError, match="edge 0 has invalid edge_time"):
        CompGraph.build(3, [(0, 1), (1, 2)], edge_time=[-1.0, 0.0])
    with pytest.raises(ValueError, match=r"edge_time has shape \(1,\), expected \(2,\)"):
        CompGraph.build(3, [(0, 1), (1, 2)], edge_time=[1.0])


def test_negative_node_count():
    with pytest.raises(ValueError, match=">= 0"):
        CompGraph.build(-1)


def test_empty_graph():
    g = CompGraph.build(0)
    assert g.num_nodes == 0 and len(g.topo_order) == 0


# ---------------------------------------------------------------- hashing
def test_content_hash_stable_and_sensitive():
    g = diamond()
    assert g.content_hash() == diamond().content_hash()
    assert len(g.content_hash()) == 16
    # meta and module do not change the hash (they do not affect cost)
    assert diamond(meta={"name": "other"}).content_hash() == g.content_hash()
    others = [
        diamond(flops=[1e9, 2e9, 3e9, 4e9 + 1]),
        diamond(param_bytes=[16.0, 0.0, 32.0, 1.0]),
        diamond(act_bytes=[5.0, 6.0, 7.0, 9.0]),
        diamond(name=["a", "b", "c", "e"]),
        diamond(kind=[0, 0, 0, 1]),
        diamond(group=[0, 0, 2, 3]),
        diamond(layer=[0, 1, 1, 2]),
        diamond(times={"v100": [1.0, 2.0, 3.0, 4.0]}),
        diamond(edge_time=[1.0, 1.0, 1.0, 1.0]),
        CompGraph.build(4, [(0, 1), (0, 2), (1, 3)], name=["a", "b", "c", "d"]),
    ]
    hashes = {o.content_hash() for o in others}
    assert g.content_hash() not in hashes
    assert len(hashes) == len(others)


def test_replace_revalidates_and_rehashes():
    g = diamond()
    g2 = g.replace(flops=np.array([0.0, 0.0, 0.0, 1.0]))
    assert g2.total_flops() == 1.0 and g.total_flops() == pytest.approx(10e9)
    assert g2.content_hash() != g.content_hash()
    with pytest.raises(ValueError, match="cycle"):
        g.replace(src=np.array([0, 0, 1, 3]), dst=np.array([1, 2, 3, 1]))


# ---------------------------------------------------------------- networkx
def test_to_networkx_round_trip():
    g = diamond(kind=[0, 0, 1, 2], group=[0, 0, 1, 1], layer=[0, 0, 1, 1])
    nxg = g.to_networkx()
    assert nxg.graph["name"] == "diamond"
    assert set(nxg.edges) == {(0, 1), (0, 2), (1, 3), (2, 3)}
    assert nxg.nodes[2]["kind"] == "bwd" and nxg.nodes[3]["kind"] == "opt"
    assert nxg.edges[0, 2]["bytes"] == 100.0
    # rebuild a CompGraph from the networkx view: identical content hash
    nodes = sorted(nxg.nodes)
    edges = list(nxg.edges)
    back = CompGraph.build(
        len(nodes),
        edges,
        **{
            f: [nxg.nodes[i][f] for i in nodes]
            for f in (
                "flops",
                "bytes_accessed",
                "out_bytes",
                "param_bytes",
                "act_bytes",
                "kind",
                "group",
                "layer",
                "name",
                "module",
            )
        },
        edge_bytes=[nxg.edges[e]["bytes"] for e in edges],
    )
    assert back.content_hash() == g.content_hash()


# ----------------------------------------------------------- topo order
def test_topo_order_diamond():
    order = diamond().topo_order.tolist()
    assert order[0] == 0 and order[-1] == 3 and sorted(order) == [0, 1, 2, 3]


@st.composite
def random_dags(draw):
    n = draw(st.integers(1, 25))
    perm = draw(st.permutations(range(n)))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    chosen = draw(st.lists(st.sampled_from(pairs), max_size=60)) if pairs else []
    # relabel so node indices are not already topologically sorted
    edges = [(perm[i], perm[j]) for i, j in chosen]
    return n, edges


@settings(max_examples=60, deadline=None)
@given(random_dags())
def test_topo_order_is_valid(dag):
    n, edges = dag
    g = CompGraph.build(n, edges)
    order = g.topo_order
    assert sorted(order.tolist()) == list(range(n))
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    assert (pos[g.src] < pos[g.dst]).all()
    # agrees with networkx on acyclicity and edge count (parallel edges collapse there)
    nxg = g.to_networkx()
    assert nx.is_directed_acyclic_graph(nxg)
    assert nxg.number_of_edges() == len(set(edges))


@settings(max_examples=40, deadline=None)
@given(random_dags(), st.data())
def test_back_edge_makes_cycle(dag, data):
    n, edges = dag
    if not edges:
        return
    g = CompGraph.build(n, edges)
    s, d = edges[data.draw(st.integers(0, len(edges) - 1))]
    with pytest.raises(ValueError, match="cycle"):
        CompGraph.build(n, [*edges, (d, s)], name=g.name)


def test_build_refuses_fractions_wrapped_integers_and_non_string_names() -> None:
    # found by fuzzing (29 Nov 2026): kind 256 / 257 wrapped to 0 / 1 in int8, group 0.5 and
    # the edge (0.7, 1.2) were truncated to 0 and 0 -> 1, a name 5 broke content_hash later
    import numpy as np

    for kw, says in (
        (dict(kind=np.array([256, 257])), "'kind' value 257 is out of range"),
        (dict(group=[0.5, 1.9]), "'group' must hold integers, got 0.5"),
        (dict(layer=[0, float("nan")]), "'layer' must hold integers, got nan"),
        (dict(name=["a", 5]), "name[1] is 5; expected a string"),
        (dict(module=["m", None]), "module[1] is None; expected a string"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            CompGraph.build(2, [(0, 1)], **kw)
    with pytest.raises(ValueError, match=re.escape("'edges' must hold integers, got 0.7")):
        CompGraph.build(2, [[0.7, 1.2]])
    g = CompGraph.build(2, [(0.0, 1.0)], group=[0.0, 0.0], layer=np.array([3, 4], np.int32))
    assert g.src.tolist() == [0] and g.group.tolist() == [0, 0] and g.layer.tolist() == [3, 4]
    # a graph made directly or by dataclasses.replace skipped these checks: group 0.5 was
    # taken, a name 3 broke the hash, float edges a numpy cast error (fuzzing, 2 Dec 2026)
    import dataclasses

    for kw, says in (
        (dict(group=np.array([0, 0.5])), "'group' must hold integers, got 0.5"),
        (dict(name=("a", 3)), "name[1] is 3; expected a string"),
        (dict(module=("m", None)), "module[1] is None; expected a string"),
        (dict(src=np.array([0.7]), dst=np.array([1.2])), "'src' must hold integers, got 0.7"),
        (dict(kind=np.array([0, 300])), "'kind' value 300 is out of range"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            dataclasses.replace(g, **kw)
    same = dataclasses.replace(g, group=np.array([0.0, 0.0]), layer=[3, 4], name=["n0", "n1"])
    assert same.group.dtype == np.int64 and same.name == ("n0", "n1")
    assert same.content_hash() == g.content_hash()
