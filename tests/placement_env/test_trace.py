"""Trace export: Chrome-trace JSON tracks and intervals, Gantt PNG."""

from __future__ import annotations

import json

import numpy as np
import pytest

from graphs.cluster import Cluster, Device, Link
from graphs.compgraph import CompGraph
from placement_env.oracles import Simulator
from placement_env.oracles.trace import chrome_trace, plot_gantt, write_chrome_trace


def setup() -> tuple[CompGraph, Cluster, Simulator]:
    # f0 -> f1 -> b1 -> b0 over two devices, 1000 B per edge (1 us at 1 GB/s)
    g = CompGraph.build(
        4, [(0, 1), (1, 2), (2, 3), (0, 3)], kind=[0, 0, 1, 1], flops=1e6, out_bytes=1e3,
        meta={"name": "toy"},
    )  # fmt: skip
    devs = tuple(Device(f"d{i}", "x", 1e12, 1e18, 1e12) for i in range(2))
    c = Cluster("two", devs, (Link(0, 1, 1e9, 0.0, "nvlink"), Link(1, 0, 1e9, 0.0, "nvlink")))
    return g, c, Simulator(g, c, microbatches=2)


def test_chrome_trace_has_a_track_per_device_and_link(tmp_path) -> None:
    g, c, sim = setup()
    r = sim.evaluate(np.array([0, 1, 1, 0]), record=True)
    path = tmp_path / "t.json"
    write_chrome_trace(r, g, c, path)
    data = json.loads(path.read_text())
    evs = data["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs if e["name"] == "thread_name"}
    assert threads == {(0, 0): "d0 (x)", (0, 1): "d1 (x)", (1, 0): "d0->d1 (nvlink)", (1, 1): "d1->d0 (nvlink)"}  # fmt: skip
    xs = [e for e in evs if e["ph"] == "X"]
    compute = [e for e in xs if e["pid"] == 0]
    assert len(compute) == 4 * 2  # 4 nodes x 2 microbatches
    # each run is 0.5 us (1e6 flops / 2 microbatches at 1 TFLOP/s)
    assert all(e["dur"] == pytest.approx(0.5) for e in compute)
    hops = [e for e in xs if e["pid"] == 1]
    assert {e["tid"] for e in hops} == {0, 1}
    assert all(e["dur"] == pytest.approx(0.5) for e in hops)  # 500 B per microbatch
    assert max(e["ts"] + e["dur"] for e in xs) == pytest.approx(r.step_time * 1e6)
    assert data["otherData"]["graph"] == "toy"
    assert chrome_trace(r, g, c)["traceEvents"] == evs


def test_gantt_png_and_missing_schedule(tmp_path) -> None:
    g, c, sim = setup()
    r = sim.evaluate(np.array([0, 1, 1, 0]), record=True)
    out = tmp_path / "g.png"
    r.gantt(g, c, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="record=True"):
        plot_gantt(sim.evaluate(np.array([0, 1, 1, 0])), g, c, tmp_path / "x.png")
    with pytest.raises(ValueError, match="record=True"):
        sim.evaluate(np.zeros(4, np.int64)).to_chrome_trace(g, c, str(tmp_path / "x.json"))


def test_another_graph_or_cluster_is_named_and_folders_are_made(tmp_path) -> None:
    """A trace drawn with another cluster named devices and links it does not have, and the
    Gantt chart failed with a bare KeyError / IndexError (fuzzing, 2 Dec 2026)."""
    g, c, sim = setup()
    r = sim.evaluate(np.array([0, 1, 1, 0]), record=True)
    devs = tuple(Device(f"e{i}", "x", 1e12, 1e18, 1e12) for i in range(3))
    three = Cluster("three", devs, tuple(Link(a, b, 1e9, 0.0) for a in range(3) for b in range(3) if a != b))  # fmt: skip
    for draw in (plot_gantt, write_chrome_trace):
        with pytest.raises(ValueError, match=r"cluster of 2 devices and 2 links, not on 'three'"):
            draw(r, g, three, tmp_path / "x.out")
        small = CompGraph.build(2, [(0, 1)], meta={"name": "pair"})
        with pytest.raises(ValueError, match=r"node 3, but graph 'pair' has 2 nodes"):
            draw(r, small, c, tmp_path / "x.out")
    assert not (tmp_path / "x.out").exists()
    r.gantt(g, c, str(tmp_path / "new" / "g.png"))  # a missing folder is made
    r.to_chrome_trace(g, c, str(tmp_path / "new2" / "t.json"))
    assert (tmp_path / "new" / "g.png").is_file() and (tmp_path / "new2" / "t.json").is_file()
