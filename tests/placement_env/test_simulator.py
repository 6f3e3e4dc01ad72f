"""Simulator: hand-computed schedules, memory, max-load, bad inputs, and equality with the reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphs.cluster import Cluster, Device, Link
from graphs.clusters import load
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from placement_env.oracles import Oracle, Simulator
from tests.placement_env.reference_sim import reference_max_load, reference_simulate

US = 1e-6


def dev(name: str, kind: str = "x", memory: float = 1e12) -> Device:
    """1 TFLOP/s, effectively infinite memory bandwidth, no launch overhead: 1e6 flops = 1 us."""
    return Device(name, kind, peak_flops=1e12, mem_bw=1e18, memory=memory)


def full_mesh(D: int, bw: float = 1e9, lat: float = 0.0, **kw) -> Cluster:
    links = tuple(Link(a, b, bw, lat) for a in range(D) for b in range(D) if a != b)
    return Cluster("mesh", tuple(dev(f"d{i}", **kw) for i in range(D)), links)


def chain(n: int, flops: float = 1e6, out_bytes: float = 1e3, **kw) -> CompGraph:
    return CompGraph.build(
        n, [(i, i + 1) for i in range(n - 1)], flops=flops, out_bytes=out_bytes, **kw
    )


# ------------------------------------------------------------ hand-computed
def test_chain_one_device_vs_split_shows_latency_and_bandwidth() -> None:
    # 3 nodes of 1 us; edge 1000 B over a 1 GB/s link with 2 us latency = 3 us per transfer
    c = full_mesh(2, bw=1e9, lat=2e-6)
    sim = Simulator(chain(3), c)
    one = sim.evaluate(np.array([0, 0, 0]))
    assert one.step_time == pytest.approx(3 * US)
    assert one.link_bytes.tolist() == [0.0, 0.0]
    split = sim.evaluate(np.array([0, 1, 1]))
    assert split.step_time == pytest.approx((1 + 2 + 1 + 1 + 1) * US)
    link01 = next(k for k, ln in enumerate(c.links) if (ln.src, ln.dst) == (0, 1))
    assert split.link_bytes[link01] == 1000.0
    assert split.link_bytes.sum() == 1000.0
    assert split.device_busy == pytest.approx([1 * US, 2 * US])
    assert sim.calls == 2
    assert isinstance(sim, Oracle)


def test_diamond_branches_run_in_parallel() -> None:
    # a -> {b, c} -> d; b, c take 2 us; free transfers (0 bytes, 0 latency)
    g = CompGraph.build(
        4, [(0, 1), (0, 2), (1, 3), (2, 3)], flops=[1e6, 2e6, 2e6, 1e6], out_bytes=0.0
    )
    sim = Simulator(g, full_mesh(2))
    assert sim.evaluate(np.zeros(4, np.int64)).step_time == pytest.approx(6 * US)
    assert sim.evaluate(np.array([0, 0, 1, 0])).step_time == pytest.approx(4 * US)


def test_two_transfers_contend_on_one_link() -> None:
    # a, b: zero-time sources; each sends 1e4 B (10 us at 1 GB/s) to its consumer on device 1
    g = CompGraph.build(4, [(0, 2), (1, 3)], flops=[0, 0, 1e6, 1e6], out_bytes=1e4)
    sim = Simulator(g, full_mesh(3))
    shared = sim.evaluate(np.array([0, 0, 1, 1]))  # both over link 0->1: second waits
    assert shared.step_time == pytest.approx((10 + 10 + 1) * US)
    apart = sim.evaluate(np.array([0, 2, 1, 1]))  # links 0->1 and 2->1 in parallel
    assert apart.step_time == pytest.approx((10 + 1 + 1) * US)


def test_one_transfer_per_destination_device() -> None:
    # a feeds b and c, both on device 1: a single 1000 B transfer (the larger edge)
    g = CompGraph.build(3, [(0, 1), (0, 2)], flops=1e6, out_bytes=0.0, edge_bytes=[1000.0, 400.0])
    r = Simulator(g, full_mesh(2)).evaluate(np.array([0, 1, 1]))
    assert r.link_bytes.sum() == 1000.0
    assert r.step_time == pytest.approx((1 + 1 + 1 + 1) * US)


def test_multi_hop_route_is_store_and_forward() -> None:
    # d0 -> sw (1 GB/s, 1 us) -> d1 (2 GB/s, 1 us): 1000 B takes (1+1) + (1+0.5) = 3.5 us
    links = (
        Link(0, 2, 1e9, 1e-6),
        Link(2, 1, 2e9, 1e-6),
        Link(1, 2, 1e9, 1e-6),
        Link(2, 0, 1e9, 1e-6),
    )
    c = Cluster("hop", (dev("d0"), dev("d1")), links, switches=("sw",))
    assert c.route(0, 1) == (0, 1)
    r = Simulator(chain(2), c).evaluate(np.array([0, 1]), record=True)
    assert r.step_time == pytest.approx((1 + 3.5 + 1) * US)
    assert r.link_bytes.tolist() == [1000.0, 1000.0, 0.0, 0.0]
    hops = [e for e in r.events if e.resource == "link"]
    assert [(e.index, e.start / US, e.end / US) for e in hops] == [
        (0, pytest.approx(1.0), pytest.approx(3.0)),
        (1, pytest.approx(3.0), pytest.approx(4.5)),
    ]


def test_explicit_edge_time_overrides_link_model() -> None:
    g = chain(2, edge_time=[7.0])  # microseconds
    r = Simulator(g, full_mesh(2, lat=1.0)).evaluate(np.array([0, 1]))
    assert r.step_time == pytest.approx((1 + 7 + 1) * US)
    assert r.link_bytes.sum() == 0.0


def test_explicit_times_and_launch_overhead() -> None:
    d = Device("g", "gpu", peak_flops=1e12, mem_bw=1e9, memory=1e12, efficiency=0.5)
    d2 = Device("h", "tpu", peak_flops=1e12, mem_bw=1e9, memory=1e12, launch_overhead=3e-6)
    c = Cluster("c", (d, d2), (Link(0, 1, 1e9, 0), Link(1, 0, 1e9, 0)))
    # node 0: 1e6 flops at 0.5 TFLOP/s = 2 us vs 4000 B at 1 GB/s = 4 us -> 4 us on d, 7 us on d2
    g = CompGraph.build(
        2, [], flops=1e6, bytes_accessed=4000.0, times={"gpu": [np.nan, 10.0]}, meta={}
    )
    t = Simulator(g, c, microbatches=2).node_times()
    assert t[0] == pytest.approx([2 * US, (2 + 3) * US])  # per microbatch: halved, +launch
    assert t[1] == pytest.approx([5 * US, (2 + 3) * US])  # explicit 10 us / 2 microbatches


def test_gpipe_uniform_stages_match_formula_and_1f1b_caps_in_flight() -> None:
    for p, M in [(4, 8), (3, 5), (2, 1)]:
        g, c, pl = pipeline(p, M, tf=1.0, tb=2.0)
        gp = Simulator(g, c, microbatches=M, schedule="gpipe").evaluate(pl)
        assert gp.step_time == pytest.approx((M + p - 1) * 3 * US)
        assert gp.extra["microbatches_in_flight"].tolist() == [M] * p
        f1 = Simulator(g, c, microbatches=M, schedule="1f1b").evaluate(pl)
        assert f1.step_time == pytest.approx((M + p - 1) * 3 * US)
        assert f1.extra["microbatches_in_flight"].tolist() == [min(M, p - s) for s in range(p)]


def pipeline(p: int, M: int, tf: float, tb: float) -> tuple[CompGraph, Cluster, np.ndarray]:
    """p stages: forwards f0..f{p-1}, backwards b0..b{p-1}; stage s on device s; free links."""
    edges = [(s, s + 1) for s in range(p - 1)] + [(p - 1, 2 * p - 1)]
    edges += [(p + s + 1, p + s) for s in range(p - 1)] + [(s, p + s) for s in range(p)]
    times = np.array([tf * M] * p + [tb * M] * p)  # whole batch, microseconds
    g = CompGraph.build(
        2 * p, edges, kind=[0] * p + [1] * p, times={"x": times}, group=list(range(p)) * 2
    )
    return g, full_mesh(p), np.array(list(range(p)) * 2)


def test_memory_params_activations_in_flight_and_oom() -> None:
    # f -> b on one device, f keeps 8e8 B of activations, 4 microbatches
    g = CompGraph.build(
        2, [(0, 1)], kind=[0, 1], flops=1e6, param_bytes=[1e8, 0], act_bytes=[8e8, 0],
        out_bytes=[4e6, 8e6],
    )  # fmt: skip
    c = full_mesh(2, memory=5e8)
    gp = Simulator(g, c, microbatches=4, schedule="gpipe").evaluate(np.array([0, 0]))
    # all 4 microbatches in flight: 1e8 + 8e8/4*4 + largest out_bytes/4 (2e6)
    assert gp.peak_memory[0] == pytest.approx(1e8 + 8e8 + 2e6)
    assert gp.oom and not gp.feasible
    f1 = Simulator(g, c, microbatches=4, schedule="1f1b")
    r = f1.evaluate(np.array([0, 0]))
    assert r.peak_memory[0] == pytest.approx(1e8 + 2e8 + 2e6)
    assert not r.oom and r.feasible
    assert f1.static_memory(np.array([0, 0])) == pytest.approx([1e8 + 2e8 + 2e6, 0.0])
    # persistent state alone can overflow
    big = CompGraph.build(2, [(0, 1)], flops=1e6, param_bytes=3e8)
    s = Simulator(big, c)
    assert s.evaluate(np.array([0, 0])).oom
    assert not s.evaluate(np.array([0, 1])).oom


def test_optimizer_runs_once_after_all_microbatches() -> None:
    # f -> b -> o ; o (opt) runs once, after b of every microbatch
    g = CompGraph.build(
        3, [(0, 1), (1, 2)], kind=[0, 1, 2], times={"x": [4.0, 8.0, 5.0]}, group=[0, 0, 0]
    )
    r = Simulator(g, full_mesh(1), microbatches=4).evaluate(np.zeros(3, np.int64), record=True)
    # 4 x (1 + 2) us of fwd/bwd, then 5 us of optimizer
    assert r.step_time == pytest.approx(17 * US)
    opt = [e for e in r.events if e.node == 2]
    assert len(opt) == 1 and opt[0].microbatch == -1 and opt[0].start == pytest.approx(12 * US)


def test_infeasible_kind_is_reported() -> None:
    g = CompGraph.build(2, [(0, 1)], flops=1e6, times={"fpga": [np.inf, 1.0]})
    c = Cluster("c", (dev("f", "fpga"), dev("c", "cpu")), (Link(0, 1, 1e9, 0), Link(1, 0, 1e9, 0)))
    for objective in ("makespan", "max_load"):
        sim = Simulator(g, c, objective=objective)
        r = sim.evaluate(np.array([0, 0]))
        assert math.isinf(r.step_time) and not r.feasible
        assert "'n0'" in r.infeasible_reason and "fpga" in r.infeasible_reason
        assert sim.evaluate(np.array([1, 0])).feasible


def test_lower_bound_definition() -> None:
    # diamond, 2 devices: critical path 1+2+1 = 4 us; work (1+2+2+1)/2 = 3 us
    g = CompGraph.build(4, [(0, 1), (0, 2), (1, 3), (2, 3)], flops=[1e6, 2e6, 2e6, 1e6])
    assert Simulator(g, full_mesh(2)).lower_bound() == pytest.approx(4 * US)
    # independent nodes: work bound dominates: 4 x 3 us / 2 devices
    w = CompGraph.build(4, [], flops=3e6)
    assert Simulator(w, full_mesh(2)).lower_bound() == pytest.approx(6 * US)


# ------------------------------------------------------------------ max-load
def fiddle_like() -> tuple[CompGraph, Cluster]:
    """4 nodes, 2 accelerators ("fpga") and one CPU; one transfer cost per source node."""
    # 0 -> 1 -> 3, 0 -> 2 -> 3; costs per source: 0: 5, 1: 7, 2: 11
    g = CompGraph.build(
        4,
        [(0, 1), (0, 2), (1, 3), (2, 3)],
        times={"fpga": [10.0, 20.0, 30.0, np.inf], "cpu": [100.0, 200.0, 300.0, 40.0]},
        edge_time=[5.0, 5.0, 7.0, 11.0],
        param_bytes=[6.0, 5.0, 1.0, 0.0],
    )
    fp = Device("fpga0", "fpga", 1e12, 1e12, memory=10.0)
    fp1 = Device("fpga1", "fpga", 1e12, 1e12, memory=10.0)
    cpu = Device("cpu0", "cpu", 1e12, 1e12, memory=math.inf)
    links = tuple(Link(a, b, 1e9, 0.0) for a in range(3) for b in range(3) if a != b)
    return g, Cluster("fiddle", (fp, fp1, cpu), links)


def test_max_load_by_hand() -> None:
    g, c = fiddle_like()
    sim = Simulator(g, c, objective="max_load")
    r = sim.evaluate(np.array([0, 0, 1, 2]))
    # fpga0: 10 + 20 compute; node 0 sends to fpga1 (+5), node 1 sends to the cpu (+7) -> 42
    # fpga1: 30 compute; receives node 0 (+5), sends node 2 to the cpu (+11) -> 46
    # cpu: 40 compute, pays no communication
    assert r.extra["loads"].tolist() == [42.0, 46.0, 40.0]
    assert r.extra["load"] == 46.0
    assert r.step_time == pytest.approx(46 * US)
    assert r.peak_memory.tolist() == [11.0, 1.0, 0.0]
    assert r.oom  # 11 bytes on a 10-byte accelerator
    # all on fpga0 except the unsupported node: 60 compute + node 1 and 2 send to cpu (7 + 11)
    r2 = sim.evaluate(np.array([0, 0, 0, 2]))
    assert r2.extra["loads"].tolist() == [78.0, 0.0, 40.0]
    # a node consumed on two other devices pays once at home, each consumer pays once
    r3 = sim.evaluate(np.array([2, 0, 1, 2]))
    assert r3.extra["loads"].tolist() == [20.0 + 5 + 7, 30.0 + 5 + 11, 140.0]
    assert sim.lower_bound() == pytest.approx(max(40.0, (10 + 20 + 30 + 40) / 3) * US)


def test_max_load_link_model_without_edge_time() -> None:
    # 1000 B over a 1 GB/s link with 2 us latency = 3 us, charged to sender and receiver
    sim = Simulator(chain(2), full_mesh(2, lat=2e-6), objective="max_load")
    r = sim.evaluate(np.array([0, 1]))
    assert r.extra["loads"] == pytest.approx([1.0 + 3.0, 1.0 + 3.0])
    assert r.link_bytes.sum() == 1000.0


# ---------------------------------------------------------------- bad input
def test_bad_inputs_are_refused() -> None:
    g, c = chain(3), full_mesh(2)
    sim = Simulator(g, c)
    with pytest.raises(ValueError, match="expected \\(3,\\)"):
        sim.evaluate(np.array([0, 1]))
    with pytest.raises(ValueError, match="device 5"):
        sim.evaluate(np.array([0, 1, 5]))
    other = chain(4)
    with pytest.raises(ValueError, match="made for graph"):
        sim.evaluate(Plan(np.array([0, 0, 0]), graph_hash=other.content_hash()))
    with pytest.raises(ValueError, match="made for cluster"):
        sim.evaluate(Plan(np.array([0, 0, 0]), graph_hash=g.content_hash(), cluster_hash="x"))
    assert sim.evaluate(Plan.for_graph([0, 1, 1], g, c)).step_time > 0
    with pytest.raises(ValueError, match="'1f1b', 'gpipe'"):
        Simulator(g, c, schedule="pipedream")
    with pytest.raises(ValueError, match="makespan"):
        Simulator(g, c, objective="latency")
    # True was taken as 1 microbatch; 2**21 ran (the plans' bound is 2**20)
    for bad in (True, 2.5, "4", 0, 2**21):
        with pytest.raises(
            ValueError, match=r"microbatches must be an integer in \[1, 1,048,576\]"
        ):
            Simulator(g, c, microbatches=bad)
    assert Simulator(g, c, microbatches=np.int64(4)).microbatches == 4
    # record="yes" and record=1 were taken (fuzzing)
    for bad in ("yes", 1, None):
        with pytest.raises(TypeError, match="record must be True or False, got"):
            sim.evaluate(np.array([0, 1, 1]), record=bad)
    assert sim.evaluate(np.array([0, 1, 1]), record=np.bool_(True)).events is not None


def test_plan_fields_the_simulator_cannot_model_are_refused() -> None:
    g, c = chain(3), full_mesh(2)
    sim = Simulator(g, c, microbatches=2, schedule="1f1b")
    interleaved = Plan.for_graph([0, 1, 1], g, c, schedule="interleaved", microbatches=2)
    with pytest.raises(ValueError, match="Plan.schedule='interleaved'"):
        sim.evaluate(interleaved)
    with pytest.raises(ValueError, match="Plan.schedule='interleaved'"):
        sim.static_memory(interleaved)
    tp = Plan.for_graph([0, 1, 1], g, c, tp_degree={0: 2})
    with pytest.raises(ValueError, match=r"Plan.tp_degree=\{0: 2\}"):
        sim.evaluate(tp)
    # degree 1 means "no tensor parallelism": nothing is ignored
    plain = Plan.for_graph([0, 1, 1], g, c, tp_degree={0: 1}, microbatches=2, schedule="1f1b")
    assert sim.evaluate(plain).step_time == sim.evaluate(np.array([0, 1, 1])).step_time
    with pytest.raises(ValueError, match="microbatches"):
        Simulator(g, c, microbatches=0)


def test_a_plan_of_other_microbatches_or_schedule_is_refused() -> None:
    """Found by fuzzing: a plan made for 8 microbatches under GPipe was scored with the
    simulator's own 2 under 1F1B (a third of its step time), without a word."""
    g, c = chain(3), full_mesh(2)
    plan = Plan.for_graph([0, 1, 1], g, c, microbatches=8, schedule="gpipe")
    for m, sched in ((2, "1f1b"), (8, "1f1b"), (2, "gpipe")):
        with pytest.raises(ValueError, match=r"the plan is for 8 microbatches, schedule 'gpipe'"):
            Simulator(g, c, microbatches=m, schedule=sched).evaluate(plan)
    own = Simulator(g, c, microbatches=8, schedule="gpipe")
    assert own.evaluate(plan).step_time == own.evaluate(plan.placement).step_time
    # one microbatch: GPipe and 1F1B are the same pipeline, so either simulator takes it
    one = Plan.for_graph([0, 1, 1], g, c)  # 1 microbatch, "1f1b"
    assert (
        Simulator(g, c).evaluate(one).step_time == Simulator(g, c).evaluate(one.placement).step_time
    )
    with pytest.raises(ValueError, match="this simulator runs 1, 'in_order'"):
        Simulator(g, c, schedule="in_order").evaluate(one)


# ------------------------------------------------- fast == reference (property)
@st.composite
def instances(draw: st.DrawFn) -> tuple[CompGraph, Cluster, np.ndarray]:
    n = draw(st.integers(1, 14))
    D = draw(st.integers(1, 4))
    edges = [
        (i, j) for i in range(n) for j in range(i + 1, min(n, i + 4)) if draw(st.integers(0, 2)) > 0
    ]
    edges += edges[: draw(st.integers(0, 2))]  # parallel edges
    kind = draw(st.lists(st.sampled_from([0, 0, 1, 1, 2]), min_size=n, max_size=n))
    kind = sorted(kind)  # forwards first, then backwards, then optimizer (like training graphs)
    vals = st.sampled_from([0.0, 1e5, 1e6, 3e6, 1e7])
    flops = draw(st.lists(vals, min_size=n, max_size=n))
    out = draw(st.lists(st.sampled_from([0.0, 1e3, 5e3, 2e4]), min_size=n, max_size=n))
    times = None
    if draw(st.booleans()):
        times = {"a": draw(st.lists(st.sampled_from([np.nan, 2.0, 8.0]), min_size=n, max_size=n))}
    edge_time = None
    if edges and draw(st.booleans()):
        edge_time = draw(
            st.lists(st.sampled_from([np.nan, 3.0]), min_size=len(edges), max_size=len(edges))
        )
    g = CompGraph.build(
        n, edges, kind=kind, flops=flops, out_bytes=out, bytes_accessed=1e3,
        act_bytes=np.arange(n) * 1e3, param_bytes=np.arange(n)[::-1] * 1e3,
        times=times, edge_time=edge_time,
    )  # fmt: skip
    devices = tuple(
        Device(
            f"g{d}", draw(st.sampled_from(["a", "b", "cpu"])), peak_flops=1e12 * (d + 1),
            mem_bw=1e9, memory=2e4, launch_overhead=draw(st.sampled_from([0.0, 1e-6])),
            transfer_overhead=draw(st.sampled_from([0.0, 0.0, 2e-6])),
        )
        for d in range(D)
    )  # fmt: skip
    if draw(st.booleans()):  # star through a switch: two hops, shared links
        links = []
        for d in range(D):
            links += [Link(d, D, 1e9, 1e-6), Link(D, d, 2e9, 0.0)]
        c = Cluster("star", devices, tuple(links), switches=("sw",))
    else:
        bw = draw(st.sampled_from([1e9, 5e9]))
        links = tuple(Link(a, b, bw, 1e-6) for a in range(D) for b in range(D) if a != b)
        c = Cluster("mesh", devices, links)
    p = np.array(draw(st.lists(st.integers(0, D - 1), min_size=n, max_size=n)), dtype=np.int64)
    return g, c, p


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances(), M=st.integers(1, 4), schedule=st.sampled_from(["gpipe", "1f1b"]))
def test_fast_simulator_equals_reference(inst, M: int, schedule: str) -> None:
    g, c, p = inst
    sim = Simulator(g, c, microbatches=M, schedule=schedule)
    r = sim.evaluate(p)
    ref = reference_simulate(g, c, p, microbatches=M, schedule=schedule)
    if math.isinf(ref["step_time"]):
        assert math.isinf(r.step_time) and r.infeasible_reason
        return
    assert r.step_time == ref["step_time"]
    assert r.device_busy.tolist() == ref["busy"]
    assert r.peak_memory.tolist() == ref["peak_memory"]
    assert r.link_bytes.tolist() == ref["link_bytes"]
    assert r.oom == ref["oom"]
    assert r.lower_bound <= r.step_time * (1 + 1e-12)
    assert (sim.static_memory(p) >= r.peak_memory * (1 - 1e-12)).all() or schedule == "1f1b"


@settings(max_examples=60, deadline=None)
@given(inst=instances())
def test_fast_max_load_equals_reference(inst) -> None:
    g, c, p = inst
    r = Simulator(g, c, objective="max_load").evaluate(p)
    ref = reference_max_load(g, c, p)
    if math.isinf(ref["load"]):
        assert math.isinf(r.step_time)
        return
    assert r.extra["load"] == ref["load"]
    assert r.extra["loads"].tolist() == ref["loads"]
    assert r.lower_bound <= r.step_time * (1 + 1e-12)


@settings(max_examples=25, deadline=None)
@given(inst=instances(), M=st.integers(1, 3), schedule=st.sampled_from(["gpipe", "1f1b"]))
def test_recorded_schedule_is_consistent(inst, M: int, schedule: str) -> None:
    g, c, p = inst
    r = Simulator(g, c, microbatches=M, schedule=schedule).evaluate(p, record=True)
    if not r.feasible and r.infeasible_reason:
        return
    runs = sum(M if k != 2 else 1 for k in g.kind)
    dev_events = [e for e in r.events if e.resource == "device"]
    assert len(dev_events) == runs
    for d in range(c.num_devices):
        evs = sorted((e.start, e.end) for e in dev_events if e.index == d)
        assert all(a[1] <= b[0] + 1e-15 for a, b in zip(evs, evs[1:]))  # one stream
        assert sum(e - s for s, e in evs) == pytest.approx(r.device_busy[d])
    for lk in range(len(c.links)):
        evs = sorted((e.start, e.end) for e in r.events if e.resource == "link" and e.index == lk)
        assert all(a[1] <= b[0] + 1e-15 for a, b in zip(evs, evs[1:]))  # FIFO, one at a time
    assert max(e.end for e in r.events) == pytest.approx(r.step_time)


def test_dgx1_pipeline_placement_runs_and_respects_bound() -> None:
    c = load("dgx1_v100_8")
    g, _, _ = pipeline(8, 8, tf=100.0, tb=200.0)
    g = g.replace(times={"v100": g.times["x"]})
    sim = Simulator(g, c, microbatches=8, schedule="1f1b")
    r = sim.evaluate(np.array(list(range(8)) * 2))
    assert r.lower_bound <= r.step_time
    assert r.step_time >= (8 + 7) * 300 * US


def test_fiddle_file_evaluates_like_the_reference_tool(tmp_path) -> None:
    # the rules of msr-fiddle/dnn-partitioning computeLoadForResultOrg, applied by hand
    io = pytest.importorskip("graphs.io")
    doc = {
        "maxSizePerFPGA": 10.0,
        "maxFPGAs": 2,
        "maxCPUs": 1,
        "nodes": [
            {"id": 7, "supportedOnFpga": 1, "cpuLatency": 9.5, "fpgaLatency": 1.25,
             "isBackwardNode": 0, "size": 4.0},
            {"id": 8, "supportedOnFpga": 1, "cpuLatency": 8.0, "fpgaLatency": 2.5,
             "isBackwardNode": 0, "size": 7.0},
            {"id": 9, "supportedOnFpga": 0, "cpuLatency": 3.0, "fpgaLatency": 0.0,
             "isBackwardNode": 0, "size": 0.0},
        ],
        "edges": [
            {"sourceId": 7, "destId": 8, "cost": 0.75},
            {"sourceId": 7, "destId": 9, "cost": 0.75},
            {"sourceId": 8, "destId": 9, "cost": 0.5},
        ],
    }  # fmt: skip
    path = tmp_path / "w.json"
    path.write_text(__import__("json").dumps(doc))
    g, c = io.read_fiddle(path)
    sim = Simulator(g, c, objective="max_load")
    # devices: fpga0, fpga1, cpu0. 7 on fpga0, 8 on fpga1, 9 on the cpu:
    # fpga0 = 1.25 + 0.75 (7 sends) ; fpga1 = 2.5 + 0.75 (receives 7) + 0.5 (8 sends) ; cpu = 3
    r = sim.evaluate(np.array([0, 1, 2]))
    assert r.extra["loads"].tolist() == [2.0, 3.75, 3.0]
    assert r.extra["load"] == 3.75 and not r.oom
    both = sim.evaluate(np.array([0, 0, 2]))  # 11 bytes on a 10-byte accelerator
    assert both.extra["loads"].tolist() == [1.25 + 2.5 + 0.75 + 0.5, 0.0, 3.0] and both.oom
    assert not sim.evaluate(np.array([0, 1, 0])).feasible  # node 9 is not supported on FPGA


def test_zero_length_hop_waiting_for_a_link_ends_before_the_dispatch() -> None:
    """The instance hypothesis found: forward-only chain with zero-byte edges, 4 devices on a
    star with asymmetric links, 2 microbatches, GPipe, over memory (OOM).

    n2's zero-byte transfer to g2 waits behind n0's second microbatch on the switch->g2 link,
    which frees at 8.75 us. It ends that same instant, so g2 picks n5 (microbatch 0) over
    n1 (microbatch 1), which became ready at 8.75 too: step 12.75 us. (The reference used to
    start the waiting hop only after g2 had picked, giving 12.25 us.)"""
    g = CompGraph.build(
        9,
        [(0, 1), (1, 2), (2, 5)],
        flops=np.zeros(9),
        bytes_accessed=np.full(9, 1000.0),
        out_bytes=[5000.0, 0, 0, 0, 0, 0, 0, 0, 0],
        param_bytes=[8000.0, 7000, 6000, 5000, 4000, 3000, 2000, 1000, 0],
        act_bytes=[0.0, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000],
        edge_bytes=[5000.0, 0, 0],
    )
    devs = tuple(
        Device(f"g{i}", "a", (i + 1) * 1e12, 1e9, 20000.0, efficiency=1.0, launch_overhead=0.0)
        for i in range(4)
    )
    links = []
    for i in range(4):
        links += [Link(i, 4, 1e9, 1e-6), Link(4, i, 2e9, 0.0)]
    c = Cluster("star", devs, tuple(links), switches=("sw",))
    p = np.array([0, 2, 0, 0, 0, 2, 0, 0, 0])
    r = Simulator(g, c, microbatches=2, schedule="gpipe").evaluate(p, record=True)
    ref = reference_simulate(g, c, p, microbatches=2, schedule="gpipe")
    assert r.step_time == ref["step_time"] == pytest.approx(12.75e-6)
    assert ref["starts"][(5, 0)] == pytest.approx(8.75e-6)
    assert ref["starts"][(1, 1)] == pytest.approx(9.25e-6)
    starts = {(e.node, e.microbatch): e.start for e in r.events if e.resource == "device"}
    assert starts == pytest.approx(ref["starts"])


def test_memory_floor_by_hand():
    """3 nodes of 100 B parameters and 80 B activations (whole batch), M = 4: any placement
    needs 300 + 240 / 4 = 360 B over all devices; max-load counts parameters only (300 B)."""
    from graphs.cluster import Cluster, Device, Link
    from graphs.compgraph import CompGraph
    from placement_env.oracles.simulator import memory_floor

    g = CompGraph.build(
        3, [(0, 1), (1, 2)], flops=1e6, param_bytes=100.0, act_bytes=80.0, meta={"name": "g3"}
    )

    def two(mem: float) -> Cluster:
        devs = tuple(Device(f"d{i}", "acc", 1e12, 1e12, mem) for i in range(2))
        return Cluster("two", devs, (Link(0, 1, 1e9, 1e-6), Link(1, 0, 1e9, 1e-6)))

    why = memory_floor(g, two(179.0), microbatches=4)
    assert why is not None and "360" not in why  # GiB, not bytes
    assert "'g3' needs at least" in why and "'two' (2 devices)" in why
    assert memory_floor(g, two(180.0), microbatches=4) is None  # 360 B exactly
    assert memory_floor(g, two(179.0), microbatches=1) is not None  # 300 + 240 > 358
    assert memory_floor(g, two(150.0), objective="max_load") is None  # 300 B exactly
    assert memory_floor(g, two(149.0), objective="max_load") is not None


@pytest.mark.parametrize("objective", ["makespan", "max_load"])
def test_read_only_inputs_compile_no_second_kernel(objective):
    """A read-only placement or graph array is another numba signature: every kernel was
    compiled again for it (3-17 s each in a fresh environment) before the simulator made
    writeable copies."""
    from placement_env.oracles import _kernels

    g = CompGraph.build(
        5, [(0, 1), (1, 2), (1, 3), (2, 4), (3, 4)], flops=1e9, out_bytes=1e6,
        param_bytes=1e6, meta={"name": "diamond5"},
    )  # fmt: skip
    cl = load("cpu_2")
    p = np.array([0, 0, 1, 1, 1], dtype=np.int64)
    want = Simulator(g, cl, objective=objective).evaluate(p).step_time
    kernels = [k for k in vars(_kernels).values() if hasattr(k, "signatures")]
    before = {k.__name__: len(k.signatures) for k in kernels}
    for name in ("param_bytes", "act_bytes", "out_bytes", "topo_order"):
        getattr(g, name).flags.writeable = False
    ro = p.copy()
    ro.flags.writeable = False
    sim = Simulator(g, cl, objective=objective)
    assert sim.evaluate(ro).step_time == want
    assert sim.evaluate(Plan.for_graph(ro, g, cl)).step_time == want
    assert {k.__name__: len(k.signatures) for k in kernels} == before


def test_a_graph_no_device_can_run_or_time_is_refused_by_name():
    """Found by fuzzing: a node with no kernel on any device of the cluster gave an inf
    lower bound and the same cost for every plan (an env's reward was constant); a Fiddle
    graph (times for fpga / cpu, no FLOPs) on a GPU cluster scored every plan 0 s."""
    from pathlib import Path

    from graphs.io import read_fiddle

    devs = tuple(Device(f"d{i}", "x", peak_flops=1e12, mem_bw=1e18, memory=1e12) for i in range(2))
    cl = Cluster("m", devs, (Link(0, 1, 1e9, 0.0), Link(1, 0, 1e9, 0.0)))
    g = CompGraph.build(
        3, [(0, 1), (1, 2)], flops=1e6, out_bytes=0.0, times={"x": np.array([1.0, np.inf, 1.0])}
    )
    with pytest.raises(ValueError, match=r"node\(s\) 'n1' of .* can run on no device of 'm'"):
        Simulator(g, cl).lower_bound()
    fid, _ = read_fiddle(Path(__file__).parents[1] / "data" / "fiddle_tiny_training.json")
    gpus = Cluster("gpus", tuple(Device(f"gpu{i}", "v100", 1e13, 1e12, 1e4) for i in range(2)),
                   (Link(0, 1, 1e9, 0.0), Link(1, 0, 1e9, 0.0)))  # fmt: skip
    with pytest.raises(ValueError, match=r"measured times for device kinds \['cpu', 'fpga'\] only"):
        Simulator(fid, gpus, objective="max_load").evaluate(np.zeros(fid.num_nodes, int))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_relabelling_devices_by_a_symmetry_of_the_topology_leaves_the_step_time(seed) -> None:
    """Permuting the GPUs inside each node of `h100_2x8` and swapping the two nodes maps the
    cluster onto itself, so a placement and its relabelled copy must take as long. Same-instant
    transfers on a shared link were ordered by destination device index: up to 2.9 % apart
    on random bert-base placements (1 Dec 2026). Now by the destination's rank among the
    producer run's destinations, in the order of their first consumer."""
    from graphs import synthetic

    rng = np.random.default_rng(seed)
    g = synthetic.layered_dag(12, 3, rng=int(rng.integers(1 << 30)), domain="language")
    c = load("h100_2x8")
    _, unit_of = g.group_index()  # a random placement of the colocation groups
    up = rng.integers(0, 16, int(unit_of.max()) + 1)
    perm = np.concatenate([rng.permutation(8), 8 + rng.permutation(8)])
    if rng.random() < 0.5:
        perm = np.concatenate([perm[8:], perm[:8]])
    sim = Simulator(g, c, microbatches=2, schedule="1f1b")
    a = sim.evaluate(up[unit_of]).step_time
    b = sim.evaluate(perm[up][unit_of]).step_time
    assert b == pytest.approx(a, rel=1e-12)
