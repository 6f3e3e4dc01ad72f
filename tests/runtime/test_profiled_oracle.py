"""ProfiledOracle: the Oracle protocol, plan checks, and caching by plan hash (memory and disk)."""

from __future__ import annotations

import numpy as np
import pytest

from graphs.compgraph import CompGraph
from graphs.cpu_cluster import cpu_cluster
from graphs.plan import Plan
from placement_env.oracles.base import Oracle
from placement_env.oracles.profiled import ProfiledOracle
from runtime.execute import ExecResult
from runtime.spec import plan_hash

pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def setup(tmp_path):
    g = CompGraph.build(3, [(0, 1), (1, 2)], flops=1.0, name=["linear", "relu", "mean"])
    c = cpu_cluster(2, calibration={})
    oracle = ProfiledOracle(g, c, model={"factory": "runtime.toy:branchy"}, cache_dir=tmp_path)
    return g, c, oracle, tmp_path


def fake_result(h: str) -> ExecResult:
    return ExecResult(
        step_time=0.25,
        step_times=[0.25],
        compute=[0.1, 0.2],
        comm=[0.05, 0.0],
        idle=[0.1, 0.05],
        loss=1.0,
        devices=[0, 1],
        mode="oplevel",
        world_size=2,
        microbatches=1,
        schedule="1f1b",
        plan_hash=h,
    )


def test_protocol_and_disk_cache(setup):
    g, c, oracle, folder = setup
    assert isinstance(oracle, Oracle)
    placement = np.array([0, 1, 1])
    h = plan_hash(Plan.for_graph(placement, g, c, microbatches=1, schedule="1f1b"))
    fake_result(h).save(folder / f"{h}.json")
    res = oracle.evaluate(placement)
    assert res.step_time == 0.25 and oracle.runs == 0 and oracle.calls == 1
    assert res.device_busy.tolist() == [0.1, 0.2]
    assert res.peak_memory.shape == (2,) and res.link_bytes.shape == (len(c.links),)
    again = oracle.evaluate(Plan.for_graph(placement, g, c, microbatches=1, schedule="1f1b"))
    assert again is res and oracle.calls == 2 and oracle.runs == 0  # same hash: memory cache


def test_bad_placements_are_refused(setup):
    g, c, oracle, _ = setup
    with pytest.raises(ValueError, match="expected \\(3,\\)"):
        oracle.evaluate(np.array([0, 1]))
    with pytest.raises(ValueError, match="on device 2"):
        oracle.evaluate(np.array([0, 1, 2]))
    other = CompGraph.build(3, [(0, 1)], name=["a", "b", "c"])
    with pytest.raises(ValueError, match="made for graph"):
        oracle.evaluate(Plan.for_graph(np.zeros(3, int), other, c))
    assert oracle.calls == 0


def test_plans_the_runtime_cannot_run_are_refused_naming_the_field(setup):
    g, c, oracle, _ = setup
    p = np.array([0, 1, 1])
    with pytest.raises(ValueError, match="Plan.schedule='interleaved'"):
        oracle.evaluate(Plan.for_graph(p, g, c, schedule="interleaved"))
    with pytest.raises(ValueError, match="Plan.tp_degree: all degrees must be equal"):
        oracle.evaluate(Plan.for_graph(p, g, c, tp_degree={0: 2, 1: 3}))
    two_stages_one_device = Plan.for_graph(
        np.zeros(3, int), g, c, stage=[0, 1, 1], stage_device=(0, 0), schedule="1f1b"
    )
    with pytest.raises(ValueError, match="schedule '1f1b'"):
        oracle.evaluate(two_stages_one_device)
    assert oracle.runs == 0
