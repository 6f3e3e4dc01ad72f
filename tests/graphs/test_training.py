"""Tests for graphs.training.with_backward on hand-checked chains and diamonds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphs.compgraph import BWD, FWD, OPT, CompGraph
from graphs.training import with_backward


def _edges(g: CompGraph) -> dict[tuple[str, str], float]:
    return {(g.name[s], g.name[d]): float(b) for s, d, b in zip(g.src, g.dst, g.edge_bytes)}


def _chain() -> CompGraph:
    return CompGraph.build(
        3,
        [(0, 1), (1, 2)],
        flops=[1.0, 2.0, 3.0],
        bytes_accessed=[10.0, 20.0, 30.0],
        out_bytes=[10.0, 20.0, 4.0],
        act_bytes=[5.0, 0.0, 7.0],
        param_bytes=[16.0, 0.0, 32.0],
        group=[0, 1, 1],
        layer=[0, 0, 1],
        name=["a", "b", "c"],
        module=["m.a", "m.b", "m.c"],
        meta={"name": "chain", "bytes_per_param": 16.0},
    )


def test_chain_nodes_and_costs() -> None:
    g = with_backward(_chain())
    assert g.name == ("a", "b", "c", "bwd:a", "bwd:b", "bwd:c", "opt:a", "opt:c")
    assert g.kind.tolist() == [FWD] * 3 + [BWD] * 3 + [OPT] * 2
    np.testing.assert_allclose(g.flops, [1, 2, 3, 2, 4, 6, 12, 24])
    np.testing.assert_allclose(g.bytes_accessed, [10, 20, 30, 20, 40, 60, 32, 64])
    np.testing.assert_allclose(g.param_bytes, [16, 0, 32, 0, 0, 0, 0, 0])
    np.testing.assert_allclose(g.act_bytes, [5, 0, 7, 0, 0, 0, 0, 0])
    # bwd:c produces the gradient of b's output (20 B), bwd:b that of a's (10 B)
    np.testing.assert_allclose(g.out_bytes, [10, 20, 4, 0, 10, 20, 0, 0])
    assert g.group.tolist() == [0, 1, 1, 0, 1, 1, 0, 1]
    assert g.layer.tolist() == [0, 0, 1, 0, 0, 1, 0, 1]
    assert g.module[3] == "m.a" and g.module[7] == "m.c"
    assert g.num_params == pytest.approx(3.0)


def test_chain_edges() -> None:
    assert _edges(with_backward(_chain())) == {
        ("a", "b"): 10.0,
        ("b", "c"): 20.0,
        ("bwd:b", "bwd:a"): 10.0,
        ("bwd:c", "bwd:b"): 20.0,
        ("a", "bwd:a"): 5.0,
        ("b", "bwd:b"): 0.0,
        ("c", "bwd:c"): 7.0,
        ("bwd:a", "opt:a"): 2.0,  # 1 parameter x 2 B fp16 gradient
        ("bwd:c", "opt:c"): 4.0,
    }


def test_diamond_edges_and_order() -> None:
    fwd = CompGraph.build(
        4,
        [(0, 1), (0, 2), (1, 3), (2, 3)],
        flops=[4.0, 1.0, 1.0, 2.0],
        out_bytes=[8.0, 3.0, 5.0, 1.0],
        name=["a", "b", "c", "d"],
    )
    g = with_backward(fwd, bwd_flops_factor=np.array([1.0, 2.0, 3.0, 0.5]), optimizer=True)
    assert g.num_nodes == 8  # no parameters -> no optimizer nodes
    e = _edges(g)
    assert e[("bwd:d", "bwd:b")] == 3.0 and e[("bwd:d", "bwd:c")] == 5.0
    assert e[("bwd:b", "bwd:a")] == 8.0 and e[("bwd:c", "bwd:a")] == 8.0
    np.testing.assert_allclose(g.flops[4:], [4.0, 2.0, 3.0, 1.0])
    np.testing.assert_allclose(g.out_bytes[4:], [0.0, 8.0, 8.0, 8.0])
    order = {g.name[i]: k for k, i in enumerate(g.topo_order)}
    assert order["d"] < order["bwd:d"] < order["bwd:b"] < order["bwd:a"]
    assert order["bwd:c"] < order["bwd:a"]


def test_requires_grad_and_no_optimizer() -> None:
    g = with_backward(_chain(), optimizer=False, requires_grad=np.array([False, True, True]))
    assert g.name == ("a", "b", "c", "bwd:b", "bwd:c")
    assert ("bwd:b", "bwd:a") not in _edges(g)
    assert g.total_flops(OPT) == 0.0


def test_opt_without_backward_hangs_off_forward() -> None:
    g = with_backward(_chain(), requires_grad=np.array([False, True, True]))
    assert _edges(g)[("a", "opt:a")] == 2.0


def test_times_scaled_and_edge_time_copied() -> None:
    fwd = _chain().replace(
        times={"gpu": np.array([1.0, np.nan, np.inf])}, edge_time=np.array([0.5, 0.25])
    )
    g = with_backward(fwd)
    t = g.times["gpu"]
    assert t[0] == 1.0 and np.isnan(t[1]) and np.isinf(t[2]) and t[3] == 2.0
    assert np.isnan(t[4]) and np.isinf(t[5]) and np.isnan(t[6:]).all()
    e = {(g.name[s], g.name[d]): x for s, d, x in zip(g.src, g.dst, g.edge_time)}
    assert e[("bwd:b", "bwd:a")] == 0.5 and e[("bwd:c", "bwd:b")] == 0.25
    assert np.isnan(e[("a", "bwd:a")])


def test_rejects_bad_input() -> None:
    g = with_backward(_chain())
    with pytest.raises(ValueError, match="forward-only"):
        with_backward(g)
    with pytest.raises(ValueError, match="bwd_flops_factor has length 2, expected"):
        with_backward(_chain(), bwd_flops_factor=np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"bwd_flops_factor\[0\]"):
        with_backward(_chain(), bwd_flops_factor=np.array([-1.0, 2.0, 2.0]))
    with pytest.raises(ValueError, match="requires_grad has length"):
        with_backward(_chain(), requires_grad=np.array([True]))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 12), st.data())
def test_random_dag_invariants(n: int, data: st.DataObject) -> None:
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = data.draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
    params = data.draw(st.lists(st.sampled_from([0.0, 16.0, 48.0]), min_size=n, max_size=n))
    fwd = CompGraph.build(n, edges, flops=np.arange(n, dtype=float), param_bytes=params)
    g = with_backward(fwd)
    assert g.total_flops(BWD) == pytest.approx(2 * fwd.total_flops())
    assert (g.kind == OPT).sum() == sum(p > 0 for p in params)
    assert g.num_edges == 2 * len(edges) + n + sum(p > 0 for p in params)
    assert g.param_bytes.sum() == fwd.param_bytes.sum()
    for i in range(n):  # every bwd node is colocated with its forward node
        assert g.group[g.index(f"bwd:{fwd.name[i]}")] == fwd.group[i]
