"""Simulator schedule "in_order" (the op-level runtime's static order) and the per-transfer endpoint cost."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphs.cluster import Cluster, Device, Link
from graphs.compgraph import CompGraph
from placement_env.oracles import Simulator
from placement_env.oracles.simulator import forward_of
from tests.placement_env.reference_sim import reference_simulate

US = 1e-6


def mesh(D: int, ovh: float = 0.0, lat: float = 0.0, bw: float = 1e9) -> Cluster:
    """1 TFLOP/s devices (1e6 flops = 1 us), ``ovh`` seconds per transfer sent or received."""
    devs = tuple(
        Device(f"d{i}", "x", peak_flops=1e12, mem_bw=1e18, memory=1e12, transfer_overhead=ovh)
        for i in range(D)
    )
    return Cluster(
        "mesh", devs, tuple(Link(a, b, bw, lat) for a in range(D) for b in range(D) if a != b)
    )


def fwd_graph(
    n: int, edges: list[tuple[int, int]], us: list[float], out_bytes: float = 0.0
) -> CompGraph:
    return CompGraph.build(n, edges, flops=[u * 1e6 for u in us], out_bytes=out_bytes)


# ------------------------------------------------------------ hand-computed
def test_ping_pong_waits_in_order_where_gpipe_overlaps() -> None:
    # a -> b -> c on devices 0, 1, 0, free transfers, M = 2; flops are per step: 2 us each,
    # so one microbatch run takes 1 us
    g = fwd_graph(3, [(0, 1), (1, 2)], [2.0, 2.0, 2.0])  # 1 us per microbatch run
    c, p = mesh(2), np.array([0, 1, 0])
    # gpipe (work-conserving): dev0 a0 [0,1] a1 [1,2]; dev1 b0 [1,2] b1 [2,3];
    # dev0 c0 [2,3] c1 [3,4]
    assert Simulator(g, c, microbatches=2, schedule="gpipe").evaluate(p).step_time == pytest.approx(
        4 * US
    )
    # in_order: depths a 0, b 1, c 2; dev0 runs a0, c0, a1, c1 in that order and waits:
    # a0 [0,1], b0 [1,2], c0 [2,3], a1 [3,4], b1 [4,5], c1 [5,6]
    r = Simulator(g, c, microbatches=2, schedule="in_order").evaluate(p, record=True)
    assert r.step_time == pytest.approx(6 * US)
    starts = {(e.node, e.microbatch): e.start for e in r.events if e.resource == "device"}
    assert starts == pytest.approx({(0, 0): 0, (2, 0): 2 * US, (0, 1): 3 * US, (1, 0): 1 * US,
                                     (1, 1): 4 * US, (2, 1): 5 * US})  # fmt: skip
    # a contiguous split pipelines under both orders: a0 [0,1] a1 [1,2]; b/c on dev1 ...
    cut = np.array([0, 1, 1])
    assert Simulator(g, c, microbatches=2, schedule="in_order").evaluate(
        cut
    ).step_time == pytest.approx(
        Simulator(g, c, microbatches=2, schedule="gpipe").evaluate(cut).step_time
    )


def test_endpoint_cost_on_sender_and_receiver() -> None:
    # a -> b -> c, 1 us each, devices 0, 1, 0, o = 0.5 us, free link:
    # a: 1 + 0.5 (sends) = [0, 1.5]; b: 1 + 0.5 (receives) + 0.5 (sends) = [1.5, 3.5];
    # c: 1 + 0.5 (receives) = [3.5, 5]
    g = fwd_graph(3, [(0, 1), (1, 2)], [1.0, 1.0, 1.0])
    c = mesh(2, ovh=0.5 * US)
    for schedule in ("gpipe", "1f1b", "in_order"):
        r = Simulator(g, c, schedule=schedule).evaluate(np.array([0, 1, 0]), record=True)
        assert r.step_time == pytest.approx(5 * US)
        assert r.device_busy == pytest.approx([3 * US, 2 * US])
        ends = sorted(e.end for e in r.events if e.resource == "device")
        assert ends == pytest.approx([1.5 * US, 3.5 * US, 5 * US])
    # one transfer per destination device: a feeds b and c on device 1 -> one send, one receive
    g2 = fwd_graph(3, [(0, 1), (0, 2)], [1.0, 1.0, 1.0])
    r = Simulator(g2, c).evaluate(np.array([0, 1, 1]))
    assert r.device_busy == pytest.approx([1.5 * US, 2.5 * US])
    assert r.step_time == pytest.approx(4 * US)  # a [0,1.5], b [1.5,3] (+ receive), c [3,4]
    # a receive-only cost (receive_overhead) of 2 us more on device 1: b takes 1 + 0.5 + 2 + 0.5
    devs = tuple(replace(d, receive_overhead=2 * US * (i == 1)) for i, d in enumerate(c.devices))
    r = Simulator(g, Cluster("m", devs, c.links), schedule="in_order").evaluate(np.array([0, 1, 0]))
    assert r.device_busy == pytest.approx([3 * US, 4 * US]) and r.step_time == pytest.approx(7 * US)
    # o = 0 leaves every result as before
    assert Simulator(g, mesh(2)).evaluate(np.array([0, 1, 0])).step_time == pytest.approx(3 * US)


def test_partition_sends_after_its_last_run_and_receives_before_its_first() -> None:
    # x -> y on dev0 (one partition, depth 0); x -> c and y -> d on dev1, c -> d (depth 1).
    # x 1 us, y 3 us, c 1 us, d 1 us, free transfers.
    g = fwd_graph(4, [(0, 1), (0, 2), (1, 3), (2, 3)], [1.0, 3.0, 1.0, 1.0])
    p = np.array([0, 0, 1, 1])
    c = mesh(2)
    # gpipe: c starts when x is done: x [0,1], y [1,4], c [1,2], d [4,5]
    assert Simulator(g, c, schedule="gpipe").evaluate(p).step_time == pytest.approx(5 * US)
    # in_order: x's output leaves with y's at 4 (end of partition {x, y}); partition {c, d}
    # starts when both arrived: c [4,5], d [5,6]
    r = Simulator(g, c, schedule="in_order").evaluate(p, record=True)
    assert r.step_time == pytest.approx(6 * US)
    starts = {e.node: e.start for e in r.events if e.resource == "device"}
    assert starts == pytest.approx({0: 0.0, 1: 1 * US, 2: 4 * US, 3: 5 * US})


def training_chain(k: int, fwd_us: float, bwd_us: float) -> CompGraph:
    """k forward nodes f0 -> ... -> f{k-1}, their backward nodes (reverse chain) and optimizer nodes."""
    n = 3 * k
    edges = [(i, i + 1) for i in range(k - 1)]  # forward chain
    edges += [(k - 1, k + k - 1)]  # last forward -> its backward
    edges += [(k + i + 1, k + i) for i in range(k - 1)]  # backward chain (reverse)
    edges += [(i, k + i) for i in range(k - 1)]  # saved activations
    edges += [(k + i, 2 * k + i) for i in range(k)]  # backward -> optimizer
    names = (
        [f"f{i}" for i in range(k)]
        + [f"bwd:f{i}" for i in range(k)]
        + [f"opt:f{i}" for i in range(k)]
    )
    flops = [fwd_us * 1e6] * k + [bwd_us * 1e6] * k + [0.0] * k
    return CompGraph.build(
        n,
        edges,
        flops=flops,
        kind=[0] * k + [1] * k + [2] * k,
        group=list(range(k)) * 3,
        name=names,
    )


def test_backward_runs_in_reverse_microbatch_and_partition_order() -> None:
    # f0 on dev0, f1 on dev1 (2-stage pipeline), fwd 1 us, bwd 2 us per microbatch run (M = 2)
    g = training_chain(2, 2.0, 4.0)
    p = np.array([0, 1, 0, 1, 0, 1])
    r = Simulator(g, mesh(2), microbatches=2, schedule="in_order").evaluate(p, record=True)
    # dev0: f0m0 [0,1] f0m1 [1,2]; dev1: f1m0 [1,2] f1m1 [2,3] then backward m1 first:
    # b1m1 [3,5] b1m0 [5,7]; dev0: b0m1 [5,7] b0m0 [7,9]; optimizers take 0 s
    starts = {(e.node, e.microbatch): e.start for e in r.events if e.resource == "device"}
    assert starts[(3, 1)] == pytest.approx(3 * US) and starts[(3, 0)] == pytest.approx(5 * US)
    assert starts[(2, 1)] == pytest.approx(5 * US) and starts[(2, 0)] == pytest.approx(7 * US)
    assert r.step_time == pytest.approx(9 * US)
    # gpipe runs backward microbatch 0 first: b1m0 [3,5] b1m1 [5,7]; b0m0 [5,7] b0m1 [7,9]
    rg = Simulator(g, mesh(2), microbatches=2, schedule="gpipe").evaluate(p, record=True)
    sg = {(e.node, e.microbatch): e.start for e in rg.events if e.resource == "device"}
    assert sg[(3, 0)] == pytest.approx(3 * US) and rg.step_time == pytest.approx(9 * US)


def test_in_order_refuses_split_backward_and_unknown_forward() -> None:
    g = training_chain(2, 1.0, 1.0)
    sim = Simulator(g, mesh(2), schedule="in_order")
    with pytest.raises(ValueError, match="bwd:f1.*forward node 'f1'"):
        sim.evaluate(np.array([0, 1, 0, 0, 0, 1]))
    anon = CompGraph.build(3, [(0, 1), (1, 2)], kind=[0, 1, 1], group=[0, 1, 2])
    with pytest.raises(ValueError, match="in_order.*forward node"):
        Simulator(anon, mesh(1), schedule="in_order")
    assert forward_of(g).tolist() == [0, 1, 0, 1, -1, -1]


def test_static_memory_of_in_order_keeps_all_microbatches() -> None:
    g = training_chain(2, 1.0, 1.0).replace(act_bytes=np.array([10.0, 10.0, 0, 0, 0, 0]))
    sim = Simulator(g, mesh(2), microbatches=4, schedule="in_order")
    p = np.array([0, 1, 0, 1, 0, 1])
    r = sim.evaluate(p)
    assert r.extra["microbatches_in_flight"].tolist() == [4, 4]
    assert sim.static_memory(p) == pytest.approx(r.peak_memory)


# ------------------------------------------------- properties
@st.composite
def training_instances(draw: st.DrawFn) -> tuple[CompGraph, Cluster, np.ndarray]:
    """Random forward DAG + mirrored backward + some optimizer nodes, groups colocated."""
    k = draw(st.integers(1, 6))
    D = draw(st.integers(1, 3))
    fedges = [(i, j) for i in range(k) for j in range(i + 1, min(k, i + 3)) if draw(st.booleans())]
    has_opt = draw(st.lists(st.booleans(), min_size=k, max_size=k))
    opts = [i for i in range(k) if has_opt[i]]
    n = 2 * k + len(opts)
    edges = list(fedges)
    edges += [(i, k + i) for i in range(k)]
    edges += [(k + j, k + i) for i, j in fedges]
    edges += [(i, k + j) for i, j in fedges if draw(st.booleans())]  # saved inputs
    edges += [(k + i, 2 * k + r) for r, i in enumerate(opts)]
    names = (
        [f"f{i}" for i in range(k)] + [f"bwd:f{i}" for i in range(k)] + [f"opt:f{i}" for i in opts]
    )
    vals = st.sampled_from([0.0, 1e5, 1e6, 3e6])
    flops = draw(st.lists(vals, min_size=n, max_size=n))
    out = draw(st.lists(st.sampled_from([0.0, 1e3, 2e4]), min_size=n, max_size=n))
    g = CompGraph.build(
        n, edges, kind=[0] * k + [1] * k + [2] * len(opts), group=list(range(k)) * 2 + opts,
        name=names, flops=flops, out_bytes=out, act_bytes=1e3,
    )  # fmt: skip
    ovh = draw(st.sampled_from([0.0, 1e-6, 2.5e-6]))
    devs = tuple(
        Device(f"d{d}", "x", peak_flops=1e12 * (d + 1), mem_bw=1e18, memory=1e12,
               launch_overhead=draw(st.sampled_from([0.0, 1e-6])), transfer_overhead=ovh * (d + 1),
               receive_overhead=draw(st.sampled_from([0.0, 3e-6])))
        for d in range(D)
    )  # fmt: skip
    links = tuple(Link(a, b, 1e9, 1e-6) for a in range(D) for b in range(D) if a != b)
    fp = draw(st.lists(st.integers(0, D - 1), min_size=k, max_size=k))
    p = np.array(fp + fp + [draw(st.integers(0, D - 1)) for _ in opts], dtype=np.int64)
    return g, Cluster("mesh", devs, links), p


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    inst=training_instances(),
    M=st.integers(1, 3),
    schedule=st.sampled_from(["in_order", "gpipe", "1f1b"]),
)
def test_in_order_and_endpoint_cost_equal_reference(inst, M: int, schedule: str) -> None:
    g, c, p = inst
    r = Simulator(g, c, microbatches=M, schedule=schedule).evaluate(p, record=True)
    ref = reference_simulate(g, c, p, microbatches=M, schedule=schedule)
    assert r.step_time == pytest.approx(ref["step_time"], rel=1e-12, abs=1e-18)
    assert r.device_busy == pytest.approx(ref["busy"], rel=1e-12, abs=1e-18)
    assert r.link_bytes.tolist() == ref["link_bytes"]
    assert r.peak_memory.tolist() == ref["peak_memory"]
    starts = {(e.node, e.microbatch): e.start for e in r.events if e.resource == "device"}
    assert starts == pytest.approx(ref["starts"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=training_instances(), M=st.integers(1, 3))
def test_in_order_on_one_device_is_the_serial_sum(inst, M: int) -> None:
    g, c, _ = inst
    p = np.zeros(g.num_nodes, np.int64)
    sim = Simulator(g, c, microbatches=M, schedule="in_order")
    runs = np.where(g.kind == 2, 1, M)
    assert sim.evaluate(p).step_time == pytest.approx(float((sim.node_times()[:, 0] * runs).sum()))
    assert not math.isnan(sim.evaluate(p).step_time)
