"""Tests of Plan: JSON round trip, hash checks, placement validation, colocation, stages."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphs.cluster import Cluster, Device, Link
from graphs.compgraph import CompGraph
from graphs.plan import Plan, check_placement


@pytest.fixture
def graph() -> CompGraph:
    # fwd a -> fwd b -> bwd b -> bwd a ; (a, bwd:a) share group 0, (b, bwd:b) group 1
    return CompGraph.build(
        4,
        [(0, 1), (1, 2), (2, 3)],
        name=["a", "b", "bwd:b", "bwd:a"],
        kind=["fwd", "fwd", "bwd", "bwd"],
        group=[0, 1, 1, 0],
        flops=[1.0, 2.0, 4.0, 2.0],
        meta={"name": "toy"},
    )


@pytest.fixture
def cluster() -> Cluster:
    devs = tuple(Device(f"g{i}", "gpu", 1e12, 1e11, 1e9) for i in range(3))
    links = tuple(Link(a, b, 1e9, 0.0) for a in range(3) for b in range(3) if a != b)
    return Cluster("tri", devs, links)


def test_for_graph_stamps_hashes(graph, cluster):
    p = Plan.for_graph([0, 1, 1, 0], graph, cluster)
    assert p.graph_hash == graph.content_hash()
    assert p.cluster_hash == cluster.content_hash()
    assert p.placement.dtype == np.int64 and not p.placement.flags.writeable
    assert p.num_devices_used == 2


def test_json_round_trip(tmp_path, graph, cluster):
    p = Plan.for_graph(
        [0, 1, 1, 0],
        graph,
        cluster,
        stage=[0, 1, 1, 0],
        stage_device=(0, 1),
        microbatches=4,
        schedule="gpipe",
        tp_degree={1: 2},
        meta={"algo": "test", "step_time": np.float64(0.5), "arr": np.arange(2)},
    )
    f = tmp_path / "plan.json"
    p.save(f)
    d = json.loads(f.read_text())
    assert d["format"] == "devplace.plan" and d["version"] == 1
    q = Plan.load(f)
    np.testing.assert_array_equal(q.placement, p.placement)
    np.testing.assert_array_equal(q.stage, p.stage)
    assert q.stage_device == (0, 1)
    assert (q.microbatches, q.schedule, dict(q.tp_degree)) == (4, "gpipe", {1: 2})
    assert (q.graph_hash, q.cluster_hash) == (p.graph_hash, p.cluster_hash)
    assert q.meta == {"algo": "test", "step_time": 0.5, "arr": [0, 1]}
    q.check(graph, cluster)


def test_hash_mismatch_refused(graph, cluster):
    p = Plan.for_graph([0, 0, 0, 0], graph, cluster)
    other_graph = graph.replace(flops=np.array([1.0, 2.0, 4.0, 3.0]))
    with pytest.raises(ValueError, match=f"made for graph {graph.content_hash()}, not for 'toy'"):
        p.check(other_graph, cluster)
    other_cluster = cluster.subset([0, 1, 2], name="copy")
    p.check(graph, other_cluster)  # same figures: same hash, accepted
    smaller = Cluster(
        "faster",
        cluster.devices,
        tuple(Link(ln.src, ln.dst, 2e9, 0.0) for ln in cluster.links),
    )
    with pytest.raises(ValueError, match="made for cluster .* not for 'faster'"):
        p.check(graph, smaller)


def test_unstamped_plan_checks_placement_only(graph, cluster):
    Plan(np.array([2, 2, 2, 2])).check(graph, cluster)


def test_wrong_length_refused(graph, cluster):
    with pytest.raises(ValueError, match=r"shape \(3,\), expected \(4,\).*'toy'"):
        check_placement([0, 0, 0], graph, cluster)
    with pytest.raises(ValueError, match=r"expected \(4,\)"):
        Plan.for_graph([0, 0, 0, 0, 0], graph, cluster)


@pytest.mark.parametrize(
    "bad, node",
    [
        ([0, 3, 0, 0], "'b' \\(index 1\\) on device 3"),
        ([0, 0, -1, 0], "'bwd:b' \\(index 2\\) on device -1"),
    ],
)
def test_out_of_range_names_node(graph, cluster, bad, node):
    with pytest.raises(ValueError, match=f"puts node {node}.*devices 0..2"):
        check_placement(bad, graph, cluster)


def test_non_integer_placement(graph, cluster):
    with pytest.raises(ValueError, match="integer device indices"):
        check_placement([0.5, 0, 0, 0], graph, cluster)
    # found by fuzzing: booleans were devices 0 and 1; strings a numpy TypeError
    for bad, dtype in (([True, False, True, True], "bool"), (["0", "1", "2", "0"], "<U1")):
        with pytest.raises(ValueError, match=f"integer device indices, got dtype {dtype}"):
            check_placement(bad, graph, cluster)
    np.testing.assert_array_equal(
        check_placement([1.0, 0.0, 0.0, 2.0], graph, cluster), [1, 0, 0, 2]
    )
    with pytest.raises(ValueError, match="1-D integer array"):
        Plan(np.array([[0, 1]]))
    with pytest.raises(ValueError, match="1-D integer array"):
        Plan(np.array([0.5, 1.0]))


def test_placements_beyond_int64_and_complex_ones_are_named(graph, cluster):
    """Found by fuzzing: complex numbers raised numpy's "ufunc 'remainder' not supported",
    uint64 2**64-1 was cast to int64 and reported as device -1, Python ints beyond int64
    gave dtype object."""
    with pytest.raises(ValueError, match="integer device indices, got dtype complex128"):
        check_placement(np.zeros(4, complex), graph, cluster)
    big = np.array([0, 2**64 - 1, 0, 0], dtype=np.uint64)
    with pytest.raises(ValueError, match=r"'b' \(index 1\) on device 18446744073709551615"):
        check_placement(big, graph, cluster)
    with pytest.raises(ValueError, match=r"'a' \(index 0\) on device 1180591620717411303424"):
        check_placement([2**70, 0, 0, 0], graph, cluster)
    assert check_placement(np.array([0, 1, 2, 0], np.uint8), graph, cluster).dtype == np.int64
    np.testing.assert_array_equal(
        check_placement(np.array([2, 1, 0, 0], object), graph, cluster), [2, 1, 0, 0]
    )
    with pytest.raises(ValueError, match="device index 18446744073709551615, beyond any"):
        Plan(big)


def test_negative_devices_and_stages_are_refused_when_the_plan_is_made():
    """Plan(np.array([-1, 0])) was accepted until Plan.check (and Plan.save wrote it)."""
    with pytest.raises(ValueError, match=r"Plan.placement\[1\] is -1; device indices are >= 0"):
        Plan(np.array([0, -1, 0]))
    with pytest.raises(ValueError, match=r"Plan.stage\[2\] is -3; stage ids are >= 0"):
        Plan(np.array([0, 0, 0]), stage=np.array([0, 0, -3]))
    assert Plan(np.array([], np.int64)).placement.size == 0


def test_colocation_violations(graph):
    assert Plan(np.array([0, 1, 1, 0])).colocation_violations(graph) == []
    # bwd:a (group 0) away from a
    assert Plan(np.array([0, 1, 1, 2])).colocation_violations(graph) == [0]
    assert Plan(np.array([0, 1, 2, 1])).colocation_violations(graph) == [0, 1]


def test_stage_checks(graph, cluster):
    with pytest.raises(ValueError, match=r"stage has shape \(3,\), expected \(4,\)"):
        Plan(np.array([0, 0, 0, 0]), stage=np.array([0, 0, 0]))
    p = Plan(np.array([0, 1, 1, 0]), stage=np.array([0, 1, 1, 2]), stage_device=(0, 1))
    with pytest.raises(ValueError, match=r"stage values must be in \[0, 2\)"):
        p.check(graph, cluster)
    p = Plan(np.array([0, 1, 1, 0]), stage=np.array([0, 1, 0, 0]), stage_device=(0, 1))
    with pytest.raises(ValueError, match="node 'bwd:b' is in stage 0 whose device differs"):
        p.check(graph, cluster)


def test_bad_fields():
    with pytest.raises(ValueError, match="microbatches must be >= 1"):
        Plan(np.array([0]), microbatches=0)
    with pytest.raises(ValueError, match="schedule 'zigzag' is unknown"):
        Plan(np.array([0]), schedule="zigzag")


def test_load_errors(tmp_path):
    f = tmp_path / "p.json"
    f.write_text("{not json")
    with pytest.raises(ValueError, match=f"{f}: not valid JSON"):
        Plan.load(f)
    f.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a devplace plan"):
        Plan.load(f)
    f.write_text(json.dumps({"format": "devplace.plan", "version": 9, "placement": [0]}))
    with pytest.raises(ValueError, match="version 9 is not supported"):
        Plan.load(f)
    f.write_text(json.dumps({"format": "devplace.plan", "version": 1, "placement": 3}))
    with pytest.raises(
        ValueError, match="field 'placement' is 3; expected a list of device indices"
    ):
        Plan.load(f)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(0, 7), min_size=1, max_size=30),
    st.lists(st.integers(0, 4), min_size=1, max_size=30),
)
def test_colocation_violations_property(placement, groups):
    n = min(len(placement), len(groups))
    g = CompGraph.build(n, [], group=groups[:n])
    p = Plan(np.array(placement[:n]))
    expect = sorted(
        {gr for gr in groups[:n] if len({placement[i] for i in range(n) if groups[i] == gr}) > 1}
    )
    assert p.colocation_violations(g) == expect


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=4, max_size=4), st.integers(1, 8))
def test_round_trip_property(placement, mb):
    p = Plan(np.array(placement), "g" * 16, "c" * 16, microbatches=mb)
    q = Plan.from_dict(json.loads(json.dumps(p.to_dict())))
    assert q.to_dict() == p.to_dict()


def test_in_order_schedule_round_trips_for_op_placements_only(tmp_path, graph, cluster):
    # Simulator(schedule="in_order") scores the op-level runtime's order; the planners stamp
    # that schedule on their plans, which Plan used to refuse ("'in_order' is unknown")
    p = Plan.for_graph([0, 1, 1, 0], graph, cluster, schedule="in_order")
    p.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json").schedule == "in_order"
    # the op-level runtime has no tensor parallelism: such a plan used to fail on every rank
    with pytest.raises(ValueError, match="'in_order' runs op by op, without tensor parallel"):
        Plan.for_graph([0, 1, 1, 0], graph, cluster, schedule="in_order", tp_degree={1: 2})
    Plan.for_graph([0, 1, 1, 0], graph, cluster, schedule="in_order", tp_degree={1: 1})
    from dataclasses import replace

    from graphs import clusters
    from tests.graphs.test_layout import _toy_graph

    g, cl = _toy_graph(), clusters.load("dgx_a100_8")
    hyb = Plan.hybrid(g, cl, dp=2, tp=2, pp=2, microbatch_size=1, global_batch=8)
    with pytest.raises(ValueError, match="'in_order' is for op placements only"):
        replace(hyb, schedule="in_order")
    d = hyb.to_dict()
    d["schedule"] = "in_order"
    with pytest.raises(ValueError, match="'in_order' is for op placements only"):
        Plan.from_dict(d)


def test_a_hybrid_plans_fields_must_agree_with_its_layout(tmp_path):
    """A hybrid plan file whose schedule, microbatches or placement contradicted its layout
    was accepted and those fields ignored; each is refused by name (the layout decides)."""
    from graphs import clusters
    from tests.graphs.test_layout import _toy_graph

    g, cl = _toy_graph(), clusters.load("dgx_a100_8")
    hyb = Plan.hybrid(g, cl, dp=2, tp=2, pp=2, microbatch_size=1, global_batch=8)
    hyb.check(g, cl)
    assert Plan.from_dict(hyb.to_dict()).layout == hyb.layout
    for key, value, says in [
        ("schedule", "gpipe", "Plan.schedule 'gpipe' differs from its layout's schedule '1f1b'"),
        ("microbatches", 2, "Plan.microbatches 2 differs from its layout's 4"),
        # found by fuzzing: an edited tp_degree was ignored and the layout's tp ran
        (
            "tp_degree",
            {"1": 3},
            "Plan.tp_degree {1: 3} is for op-placement plans; a hybrid "
            "plan's tensor parallelism is its layout's tp (2)",
        ),
    ]:
        d = hyb.to_dict()
        d[key] = value
        with pytest.raises(ValueError, match=re.escape(says)):
            Plan.from_dict(d, source="p.json")
    from dataclasses import replace

    with pytest.raises(ValueError, match="Plan.stage / stage_device are for op-placement plans"):
        replace(hyb, stage=np.zeros(g.num_nodes, np.int64), stage_device=(0,))
    d = hyb.to_dict()
    d["placement"][0] = (d["placement"][0] + 3) % cl.num_devices
    moved = Plan.from_dict(d)
    moved.check(g, cl)  # the simulator's per-evaluation check stays O(1) in the nodes
    with pytest.raises(ValueError, match="Plan.placement differs from its layout's: node"):
        moved.check_layout_placement(g)  # what make_run_spec calls before a run


def test_plan_hybrid_names_a_wrong_argument_and_takes_numpy_integers():
    """Found by fuzzing: a cluster's name raised AttributeError ('str' object has no
    attribute 'num_devices'), a list as meta a dictionary-update TypeError, and numpy
    integers (what the planners' grids hold) were refused as "expected an integer"."""
    from graphs import clusters
    from tests.graphs.test_layout import _toy_graph

    g, cl = _toy_graph(), clusters.load("dgx_a100_8")
    kw = dict(tp=2, pp=2, microbatch_size=1, global_batch=8)
    plan = Plan.hybrid(g, cl, dp=np.int64(2), **{k: np.int64(v) for k, v in kw.items()})
    assert plan.layout == Plan.hybrid(g, cl, dp=2, **kw).layout
    assert type(plan.layout.dp) is int and json.dumps(plan.to_dict())  # JSON as before
    with pytest.raises(
        TypeError, match=r"cluster must be a Cluster \(graphs.clusters.load\('x'\)\)"
    ):
        Plan.hybrid(g, "x", dp=2, **kw)
    with pytest.raises(TypeError, match="Plan.hybrid: meta must be a mapping or None, got"):
        Plan.hybrid(g, cl, dp=2, meta=[1], **kw)
    with pytest.raises(TypeError, match="Plan.hybrid: graph must be a CompGraph"):
        Plan.hybrid("gpt", cl, dp=2, **kw)
    with pytest.raises(TypeError, match="layout must be a HybridLayout, got dict"):
        Plan.from_layout(g, cl, plan.layout.to_dict())
    with pytest.raises(ValueError, match=r"layout.dp = 2.5: expected an integer"):
        Plan.hybrid(g, cl, dp=2.5, **kw)


def test_for_graph_refuses_what_load_or_save_would_refuse(tmp_path) -> None:
    """Made, then refused by Plan.load (stage without stage_device, microbatches over the
    bound) or by save (meta JSON cannot hold) -- 2 Dec 2026, found by fuzzing."""
    import numpy as np

    from graphs import clusters, zoo
    from graphs.plan import Plan

    g = zoo.build(
        "gpt2", max_groups=16, n_layer=2, d_model=64, n_head=2, vocab=128, seq=16, batch=4
    )
    c = clusters.load("cpu_4")
    p = np.zeros(g.num_nodes, dtype=np.int64)
    for kw, says in (
        ({"stage": np.zeros(g.num_nodes, dtype=np.int64)}, "stage_device"),
        ({"microbatches": 10**9}, "microbatches"),
        ({"meta": {"x": {1, 2}}}, "meta must hold JSON values"),
        ({"meta": 5}, "meta must be a mapping or None"),
    ):
        with pytest.raises((ValueError, TypeError), match=says):
            Plan.for_graph(p, g, c, **kw)
    with pytest.raises(TypeError, match="Plan.for_graph: graph must be a CompGraph"):
        Plan.for_graph(p, "gpt2", c)
    ok = Plan.for_graph(p, g, c, microbatches=4, meta={"n": np.int64(2)})
    ok.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json").meta == {"n": 2}


def test_coarsen_and_simulator_name_bad_arguments() -> None:
    import math

    from graphs import clusters, zoo
    from graphs.coarsening import coarsen
    from placement_env.oracles import Simulator

    g = zoo.build(
        "gpt2", max_groups=16, n_layer=2, d_model=64, n_head=2, vocab=128, seq=16, batch=4
    )
    for bad in (None, math.nan, math.inf, True, 2.5):
        with pytest.raises(ValueError, match="coarsen: max_groups must be an integer >= 1"):
            coarsen(g, bad)
    assert coarsen(g, 8).num_groups <= 8
    with pytest.raises(TypeError, match="Simulator: graph must be a CompGraph"):
        Simulator("gpt2", clusters.load("cpu_4"))
    with pytest.raises(TypeError, match=r"Simulator: cluster must be a Cluster \(graphs.clusters"):
        Simulator(g, "cpu_4")
    with pytest.raises(ValueError, match=r"Simulator: unknown schedule \['1f1b'\]"):
        Simulator(g, clusters.load("cpu_4"), schedule=["1f1b"])
