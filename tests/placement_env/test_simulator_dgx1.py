"""Simulator equals the reference exactly on training graphs over DGX-1's multi-hop, contended links."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphs import synthetic
from graphs.clusters import load
from placement_env.oracles import Simulator
from tests.placement_env.reference_sim import reference_simulate

DGX1 = load("dgx1_v100_8")


def _placement(g, rng: np.random.Generator, how: str) -> np.ndarray:
    """Random per colocation group, all on PCIe-only device pairs, or a contiguous pipeline."""
    _, inv = g.group_index()
    ng = int(inv.max()) + 1
    if how == "random":
        return rng.integers(0, 8, ng)[inv].astype(np.int64)
    if how == "pcie":  # devices 0 and 5 share no NVLink: every transfer takes the PCIe route
        return rng.choice([0, 5], ng)[inv].astype(np.int64)
    return (np.arange(ng) * 8 // ng)[inv].astype(np.int64)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    family=st.sampled_from(["layered", "series_parallel", "mixed"]),
    how=st.sampled_from(["random", "pcie", "pipeline"]),
    M=st.sampled_from([1, 3, 8]),
    schedule=st.sampled_from(["gpipe", "1f1b"]),
)
def test_dgx1_training_graphs_match_reference_including_start_times(
    seed: int, family: str, how: str, M: int, schedule: str
) -> None:
    rng = np.random.default_rng(seed)
    g = synthetic.sample(rng, family, min_nodes=6, max_nodes=14)
    p = _placement(g, rng, how)
    r = Simulator(g, DGX1, microbatches=M, schedule=schedule).evaluate(p, record=True)
    ref = reference_simulate(g, DGX1, p, microbatches=M, schedule=schedule)
    assert r.step_time == ref["step_time"]
    assert r.device_busy.tolist() == ref["busy"]
    assert r.peak_memory.tolist() == ref["peak_memory"]
    assert r.link_bytes.tolist() == ref["link_bytes"]
    starts = {(e.node, e.microbatch): e.start for e in r.events if e.resource == "device"}
    assert starts == ref["starts"]


def test_pcie_route_is_multi_hop_and_contended() -> None:
    """The instances above exercise what the fast kernel optimises: routes of several hops."""
    assert len(DGX1.route(0, 5)) > 2
    g = synthetic.sample(np.random.default_rng(1), "layered", min_nodes=10, max_nodes=12)
    p = _placement(g, np.random.default_rng(2), "pcie")
    r = Simulator(g, DGX1, microbatches=4, schedule="1f1b").evaluate(p, record=True)
    hops = [e for e in r.events if e.resource == "link"]
    assert len(hops) > 2 * len({(e.node, e.microbatch) for e in hops})  # > 2 hops per transfer
    ref = reference_simulate(g, DGX1, p, microbatches=4, schedule="1f1b")
    assert r.step_time == ref["step_time"]
