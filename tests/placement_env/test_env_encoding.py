"""Tests of the unit graph and observation encoding: hand-computed features and invariants."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from graphs.compgraph import CompGraph
from placement_env.encoding import observation_space, prepare, unflatten, unit_graph
from placement_env.types import DEVICE_FEATURES, NODE_FEATURES, Bounds, EpisodeState, Instance
from tests.placement_env.test_envs import make_cluster


def test_unit_graph_by_hand() -> None:
    # f0 -> f1 -> b1 -> b0 -> opt0; groups {f0, b0, opt0} = 0, {f1, b1} = 1
    g = CompGraph.build(
        5,
        [(0, 1), (1, 2), (2, 3), (3, 4)],
        flops=[1.0, 2.0, 4.0, 8.0, 16.0],
        out_bytes=[10.0, 20.0, 30.0, 40.0, 0.0],
        param_bytes=[5.0, 7.0, 0.0, 0.0, 0.0],
        group=[0, 1, 1, 0, 0],
    )
    ug = unit_graph(g)
    assert ug.num_units == 2 and ug.node_unit.tolist() == [0, 1, 1, 0, 0]
    assert ug.flops.tolist() == [25.0, 6.0] and ug.param_bytes.tolist() == [5.0, 7.0]
    # edges: 0->1 (f0->f1, 10 bytes), 1->0 (b1->b0, 30 bytes); internal edges dropped
    assert list(zip(ug.src.tolist(), ug.dst.tolist(), ug.edge_bytes.tolist())) == [
        (0, 1, 10.0),
        (1, 0, 30.0),
    ]
    enc = prepare(Instance(g, make_cluster(2, 100.0)), Bounds(3, 3, 3), lower_bound=1.0)
    state = EpisodeState(placement=np.array([0, 1]), visited=np.array([True, False]), current=1)
    obs = unflatten(enc.encode(state), enc.bounds)
    assert observation_space(enc.bounds).contains(enc.encode(state))
    assert obs["edge_index"].tolist() == [[0, 1, 0], [1, 0, 0]]
    assert obs["edge_feat"][:, 3].tolist() == [1.0, 1.0, 0.0]  # both unit edges cut
    assert obs["placement"].tolist() == [0, 1, -1] and obs["current"].tolist() == [1]
    dev = obs["device_feat"]
    D_, N_ = (
        {n: i for i, n in enumerate(DEVICE_FEATURES)},
        {n: i for i, n in enumerate(NODE_FEATURES)},
    )
    assert np.allclose(dev[:2, D_["used_frac"]], [0.05, 0.07])  # 5/100, 7/100
    assert dev[1, D_["current_dev"]] == 1.0 and dev[0, D_["current_dev"]] == 0.0
    assert np.allclose(dev[:2, D_["speed_pos"]], [0.25, 0.75])  # two equal devices
    assert np.allclose(dev[:2, D_["mem_pos"]], [0.25, 0.75])
    node = obs["node_feat"]
    assert node[1, N_["current"]] == 1.0 and node[0, N_["visited"]] == 1.0
    assert node[1, N_["boundary"]] == 1.0 and node[0, N_["boundary"]] == 0.0
    assert np.allclose(node[:2, N_["mem_pos"]], [2.5 / 12, 8.5 / 12])  # params 5, 7
    assert np.allclose(node[:2, N_["cut_frac"]], [1.0, 1.0])  # all edge bytes cross devices


@st.composite
def graphs_with_groups(draw):
    n = draw(st.integers(1, 12))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=20)) if pairs else []
    group = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    eb = draw(st.lists(st.floats(0, 1e6), min_size=len(edges), max_size=len(edges)))
    perm = draw(st.permutations(range(n)))  # node ids not in topological order
    e = [(perm[a], perm[b]) for a, b in edges]
    return CompGraph.build(n, e, group=group, edge_bytes=eb, flops=1.0)


@settings(max_examples=60, deadline=None)
@given(graphs_with_groups())
def test_unit_graph_invariants(g: CompGraph) -> None:
    ug = unit_graph(g)
    assert ug.num_units == g.num_groups
    # same group <=> same unit
    assert all(
        (g.group[a] == g.group[b]) == (ug.node_unit[a] == ug.node_unit[b])
        for a in range(g.num_nodes)
        for b in range(g.num_nodes)
    )
    # units numbered by their first topological position
    pos = np.empty(g.num_nodes, int)
    pos[g.topo_order] = np.arange(g.num_nodes)
    first = [pos[ug.node_unit == u].min() for u in range(ug.num_units)]
    assert first == sorted(first)
    # bytes between distinct units conserved, no self loops, one edge per ordered pair
    cross = ug.node_unit[g.src] != ug.node_unit[g.dst]
    assert np.isclose(ug.edge_bytes.sum(), g.edge_bytes[cross].sum())
    assert (ug.src != ug.dst).all()
    assert len(set(zip(ug.src.tolist(), ug.dst.tolist()))) == ug.num_edges
    # a unit placement expands to a colocation-respecting node placement
    p = np.arange(ug.num_units) % 3
    node_p = ug.node_placement(p)
    assert all(node_p[a] == p[ug.node_unit[a]] for a in range(g.num_nodes))
