"""Tests for graphs.coarsening: hand-checked merges, conservation, acyclicity, colocation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphs.coarsening import coarsen
from graphs.compgraph import BWD, FWD, OPT, CompGraph
from graphs.training import with_backward

FIELDS = ("flops", "bytes_accessed", "param_bytes", "act_bytes")


def _chain4() -> CompGraph:
    # a -> b -> c -> d in layers 0,0,1,1; b and c own one parameter each
    fwd = CompGraph.build(
        4,
        [(0, 1), (1, 2), (2, 3)],
        flops=[4.0, 1.0, 1.0, 4.0],
        out_bytes=[4.0, 2.0, 3.0, 1.0],
        act_bytes=[1.0, 1.0, 1.0, 1.0],
        param_bytes=[0.0, 16.0, 16.0, 0.0],
        layer=[0, 0, 1, 1],
        name=["a", "b", "c", "d"],
        module=["l.0.x", "l.0.y", "l.1.x", "l.1.y"],
        meta={"name": "chain4", "bytes_per_param": 16.0},
    )
    return with_backward(fwd)


def test_chain_into_two_groups_follows_layers() -> None:
    # weights (flops share + 0.5 param share): a .22, b .53, c .53, d .22; merging b+c crosses
    # the layer boundary (x4), so a+b and c+d merge
    g = coarsen(_chain4(), 2)
    assert g.name == ("a+1", "c+1", "bwd:a+1", "bwd:c+1", "opt:a+1", "opt:c+1")
    assert g.meta["members"][:2] == [["a", "b"], ["c", "d"]]
    assert g.meta["members"][2] == ["bwd:a", "bwd:b"]
    assert g.kind.tolist() == [FWD, FWD, BWD, BWD, OPT, OPT]
    assert g.group.tolist() == [0, 1, 0, 1, 0, 1]
    assert g.meta["members"][4] == ["opt:b"]
    np.testing.assert_allclose(g.flops, [5, 5, 10, 10, 12, 12])
    np.testing.assert_allclose(g.param_bytes, [16, 16, 0, 0, 0, 0])
    np.testing.assert_allclose(g.act_bytes, [2, 2, 0, 0, 0, 0])
    edges = {(g.name[s], g.name[d]): b for s, d, b in zip(g.src, g.dst, g.edge_bytes)}
    assert edges[("a+1", "c+1")] == 2.0  # b's output crosses the cut
    assert edges[("bwd:c+1", "bwd:a+1")] == 2.0
    assert edges[("a+1", "bwd:a+1")] == 2.0  # saved activations of a and b
    assert g.module[0] == "l.0" and g.layer.tolist()[:2] == [0, 1]


def test_one_group_and_identity() -> None:
    g = coarsen(_chain4(), 1)
    assert g.num_nodes == 3 and g.num_edges == 2  # fwd -> bwd -> opt
    same = coarsen(_chain4(), 100)
    assert same.num_groups == 4 and same.meta["members"][0] == ["a"]
    assert same.name[:4] == ("a", "b", "c", "d")


def test_tensor_to_one_group_moves_once() -> None:
    # x feeds y and z; y, z in one coarse node: x's tensor crosses once
    fwd = CompGraph.build(
        4, [(0, 1), (0, 2), (1, 3), (2, 3)], flops=[100.0, 1.0, 1.0, 1.0], out_bytes=[8, 1, 1, 1]
    )
    g = coarsen(fwd, 2)
    assert g.meta["members"] == [["n0"], ["n1", "n2", "n3"]]
    assert g.edge_bytes.tolist() == [8.0]


def test_colocated_groups_stay_whole() -> None:
    # a and c share a colocation group around b: the three must end together
    fwd = CompGraph.build(4, [(0, 1), (1, 2), (2, 3)], flops=1.0, group=[0, 1, 0, 2])
    g = coarsen(with_backward(fwd), 3)
    owner = {m: k for k, ms in enumerate(g.meta["members"]) for m in ms}
    assert owner["n0"] == owner["n1"] == owner["n2"]


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="max_groups must be an integer >= 1"):
        coarsen(_chain4(), 0)
    bad = CompGraph.build(2, [(0, 1)], kind=["fwd", "bwd"])
    with pytest.raises(ValueError, match="has no forward node"):
        coarsen(bad, 1)


@st.composite
def training_graphs(draw: st.DrawFn) -> CompGraph:
    n = draw(st.integers(1, 25))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, min(n, i + 5))]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=40)) if pairs else []
    floats = st.lists(st.floats(0, 100), min_size=n, max_size=n)
    groups = draw(st.lists(st.integers(0, n), min_size=n, max_size=n))
    fwd = CompGraph.build(
        n, edges, flops=draw(floats), bytes_accessed=draw(floats), out_bytes=draw(floats),
        act_bytes=draw(floats), param_bytes=draw(floats), group=groups,
        layer=draw(st.lists(st.integers(-1, 3), min_size=n, max_size=n)),
    )  # fmt: skip
    return with_backward(fwd)


@settings(max_examples=60, deadline=None)
@given(training_graphs(), st.integers(1, 12))
def test_random_dags_conserve_and_stay_acyclic(g: CompGraph, k: int) -> None:
    c = coarsen(g, k)  # construction validates acyclicity
    assert c.num_groups <= k
    for f in FIELDS:
        assert np.isclose(getattr(c, f).sum(), getattr(g, f).sum())
    for grp in np.unique(c.group):  # at most one node of each kind per group
        kinds = c.kind[c.group == grp]
        assert len(kinds) == len(set(kinds.tolist()))
    owner = {m: c.group[i] for i, ms in enumerate(c.meta["members"]) for m in ms}
    assert sorted(owner) == sorted(g.name)
    for grp in np.unique(g.group):  # input colocation respected
        assert len({owner[g.name[i]] for i in np.flatnonzero(g.group == grp)}) == 1


def test_partly_measured_times_are_refused_or_filled_not_dropped() -> None:
    """Found by fuzzing: a coarse node with one measured member (50 ms) and one unmeasured
    summed to NaN, so the simulator used the roofline (0.011 ms) for the whole node."""
    import numpy as np

    from graphs import CompGraph, clusters
    from graphs.coarsening import coarsen, fill_times
    from placement_env.oracles import Simulator

    cl = clusters.load("k40_2")
    g = CompGraph.build(
        3, [(0, 1), (1, 2)], flops=1e6, out_bytes=10.0,
        times={"k40": [50000.0, np.nan, 7.0], "v100": [1.0, 2.0, 3.0]}, layer=0,
    )  # fmt: skip
    with pytest.raises(
        ValueError, match=r"times\['k40'\] measures 2 of the 3 nodes of coarse node"
    ):
        coarsen(g, 1)
    filled = fill_times(g, cl)
    assert filled.times["k40"][0] == 50000.0 and filled.times["k40"][2] == 7.0
    assert filled.times["v100"].tolist() == [1.0, 2.0, 3.0]  # no v100 in k40_2: untouched
    c = coarsen(filled, 1)
    zero = np.zeros
    t_fine = Simulator(g, cl).evaluate(zero(3, dtype=np.int64)).step_time
    t_coarse = Simulator(c, cl).evaluate(zero(1, dtype=np.int64)).step_time
    assert t_coarse == pytest.approx(t_fine, rel=1e-9) and t_fine > 0.05
    # all measured or none measured: coarsened as before
    assert coarsen(g.replace(times={"v100": g.times["v100"]}), 1).times["v100"].tolist() == [6.0]
    assert np.isnan(coarsen(g.replace(times={"k40": np.full(3, np.nan)}), 1).times["k40"]).all()


def test_measured_edge_times_merge_as_bytes_do_on_the_fiddle_graph() -> None:
    # fiddle_tiny_training: 1->2->3 forward (costs 0.1, 0.2), 3->4 (0.3), 4->5 (0.3),
    # 5->6 (0.2), 1->6 (0.1), 2->5 (0.2); coarse nodes {1,2}, {3}, {6,5}, {4}. The edge
    # {1,2} -> {6,5} moves two tensors (1's and 2's): 0.1 + 0.2. Until 29 Nov 2026 every
    # edge_time was dropped and the coarse graph's transfers (0 bytes) were free.
    from pathlib import Path

    from graphs import io

    g, _ = io.read_fiddle(Path(__file__).parents[1] / "data" / "fiddle_tiny_training.json")
    c = coarsen(g, 2)
    assert c.meta["members"] == [["1", "2"], ["3"], ["6", "5"], ["4"]]
    got = {(int(s), int(d)): t for s, d, t in zip(c.src, c.dst, c.edge_time)}
    assert got == pytest.approx({(0, 1): 0.2, (0, 2): 0.3, (1, 3): 0.3, (3, 2): 0.3})
    assert (c.edge_bytes == 0).all()


def test_partly_measured_transfers_into_one_coarse_edge_are_refused() -> None:
    g = _chain4()
    et = np.full(g.num_edges, np.nan)
    et[0] = 5.0  # a -> b only; a+b -> c+d then merges b->c (unmeasured) alone: fine
    k = int(np.flatnonzero((g.src == 1) & (g.dst == 2))[0])
    et[k] = 7.0
    ok = g.replace(edge_time=et)
    c = coarsen(ok, 2)
    fwd = int(np.flatnonzero((c.src == 0) & (c.dst == 1))[0])
    assert c.edge_time[fwd] == 7.0  # b -> c measured, a -> b inside a coarse node
    assert np.isnan(c.edge_time[np.arange(c.num_edges) != fwd]).all()
    # two measured and one unmeasured transfer into one coarse edge: refused, named
    g2 = CompGraph.build(
        3, [(0, 2), (1, 2)], flops=[1.0, 1.0, 1.0], out_bytes=[1.0, 1.0, 1.0],
        edge_time=[3.0, np.nan], name=["p", "q", "r"], layer=[0, 0, 1],
    )  # fmt: skip
    with pytest.raises(
        ValueError, match=r"edge_time measures 1 of the 2 transfers .*'p\+1' -> 'r'"
    ):
        coarsen(g2, 2)


def test_recoarsening_keeps_the_original_names_as_members() -> None:
    from graphs import zoo

    g = zoo.build("gpt2", n_layer=2, d_model=64, n_head=4, vocab=100, seq=16, batch=2)
    once = coarsen(g, 8)
    twice = coarsen(once, 3)
    flat = [m for ms in twice.meta["members"] for m in ms]
    assert sorted(flat) == sorted(g.name)  # every original node, once, by its own name
    # a forward coarse node is named after its first original member
    for c, ms in enumerate(twice.meta["members"]):
        if twice.kind[c] == FWD:
            assert twice.name[c] == (ms[0] if len(ms) == 1 else f"{ms[0]}+{len(ms) - 1}")


def test_coarse_names_that_collide_with_a_member_name_are_numbered() -> None:
    # nodes x, y, "x+1", z: the coarse node {x, y} would be named "x+1" like the third node
    fwd = CompGraph.build(
        4, [(0, 1), (1, 2), (2, 3)], flops=[100.0, 1.0, 100.0, 100.0],
        out_bytes=[1.0] * 4, name=["x", "y", "x+1", "z"], layer=[0, 0, 1, 2],
    )  # fmt: skip
    c = coarsen(fwd, 3)
    assert len(set(c.name)) == c.num_nodes
    assert sorted(m for ms in c.meta["members"] for m in ms) == ["x", "x+1", "y", "z"]
