"""ProfiledOracle: the Oracle protocol, plan checks, caching by plan hash, memory caps, failed runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graphs.compgraph import CompGraph
from graphs.cpu_cluster import cpu_cluster
from graphs.plan import Plan
from placement_env.oracles import profiled
from placement_env.oracles.base import Oracle
from placement_env.oracles.profiled import ProfiledOracle
from placement_env.oracles.simulator import Simulator
from runtime.execute import ExecResult
from runtime.launch import RankFailure
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


def test_lower_bound_is_the_simulators_on_the_same_cluster(setup):
    g, c, oracle, _ = setup
    sim = Simulator(g, c, microbatches=1, schedule="1f1b")
    assert oracle.lower_bound() == sim.lower_bound() > 0
    assert oracle.runs == 0  # nothing was executed for it


def test_measured_peak_over_the_device_cap_is_oom(tmp_path):
    g = CompGraph.build(3, [(0, 1), (1, 2)], flops=1.0, name=["linear", "relu", "mean"])
    c = cpu_cluster(2, calibration={"device": {"memory": 100 * 2**20}})
    oracle = ProfiledOracle(g, c, model={"factory": "runtime.toy:branchy"}, cache_dir=tmp_path)
    placement = np.array([0, 1, 1])
    h = plan_hash(Plan.for_graph(placement, g, c, microbatches=1, schedule="1f1b"))
    ex = fake_result(h)
    ex.peak_memory = [50 * 2**20, 300 * 2**20]
    ex.save(tmp_path / f"{h}.json")
    res = oracle.evaluate(placement)
    assert res.oom and not res.feasible and res.step_time == 0.25
    assert res.peak_memory.tolist() == [50 * 2**20, 300 * 2**20]
    assert "cpu1" in res.extra["oom"] and "300.0 MiB" in res.extra["oom"]


def test_predicted_oom_is_not_run(monkeypatch):
    g = CompGraph.build(
        3, [(0, 1), (1, 2)], flops=1.0, param_bytes=1e6, name=["linear", "relu", "mean"]
    )
    c = cpu_cluster(2, calibration={"device": {"memory": 2e5}})
    oracle = ProfiledOracle(g, c, model={"factory": "runtime.toy:branchy"})
    monkeypatch.setattr(profiled, "execute", _must_not_run)
    res = oracle.evaluate(np.array([0, 1, 1]))
    assert res.oom and math.isinf(res.step_time) and oracle.runs == 0
    assert res.extra["oom"].startswith("predicted") and res.peak_memory.max() > 2e5


def _must_not_run(*args, **kwargs):
    raise AssertionError("execute must not be called")


@pytest.mark.parametrize(
    ("error_type", "message", "oom"),
    [
        ("ValueError", "Number of microbatches (1) must be >= the number of stages (2)", False),
        ("MemoryError", "", True),
        ("RuntimeError", "DefaultCPUAllocator: can't allocate memory: you tried ...", True),
    ],
)
def test_rank_failure_is_an_infeasible_or_oom_result(setup, monkeypatch, error_type, message, oom):
    g, c, oracle, folder = setup

    def failing(*args, **kwargs):
        raise RankFailure(1, error_type, message)

    monkeypatch.setattr(profiled, "execute", failing)
    res = oracle.evaluate(np.array([0, 1, 1]))
    assert math.isinf(res.step_time) and not res.feasible and res.oom is oom
    assert oracle.runs == 1 and not list(folder.glob("*.json"))  # failures are not kept on disk
    if oom:
        assert res.infeasible_reason is None and "rank 1" in res.extra["oom"]
    else:
        assert "rank 1 failed with ValueError: Number of microbatches" in res.infeasible_reason
    assert oracle.evaluate(np.array([0, 1, 1])) is res and oracle.runs == 1


def test_oracles_sharing_a_cache_run_a_plan_once(setup, monkeypatch):
    g, c, _, _ = setup
    shared: dict = {}
    runs = []

    def fake_execute(plan, *args, **kwargs):
        runs.append(plan)
        return fake_result(plan_hash(plan))

    monkeypatch.setattr(profiled, "execute", fake_execute)
    a = ProfiledOracle(g, c, model={"factory": "runtime.toy:branchy"}, cache=shared)
    b = ProfiledOracle(g, c, model={"factory": "runtime.toy:branchy"}, cache=shared)
    assert a.evaluate(np.array([0, 1, 1])) is b.evaluate(np.array([0, 1, 1]))
    assert len(runs) == 1 and (a.runs, b.runs, b.calls) == (1, 0, 1)


@pytest.mark.timeout(120)
def test_a_real_run_over_its_memory_cap_is_reported_oom():
    from runtime.model import graph_for_model

    model = {"factory": "runtime.toy:branchy", "config": {"batch": 8}}
    g = graph_for_model(model)
    # every CPU process holds far more than 32 MiB (Python and torch), the simulator
    # predicts the tiny model well under it: the run happens and its measured peak is over
    c = cpu_cluster(2, calibration={"device": {"memory": 32 * 2**20}})
    oracle = ProfiledOracle(g, c, model=model, steps=1, warmup=0)
    res = oracle.evaluate(g.group % 2)
    assert oracle.runs == 1 and res.oom and res.extra["oom"].startswith("measured")
    assert np.isfinite(res.step_time) and (res.peak_memory > 32 * 2**20).all()
    assert res.extra["measured"]["peak_memory"] == res.peak_memory.tolist()


def _hybrid_setup(cap_mib: float):
    from runtime.model import graph_for_model
    from tests.placement_env.test_hybrid_cpu import MODEL, calibration

    g = graph_for_model(MODEL)
    c = cpu_cluster(2, calibration={"device": {"memory": cap_mib * 2**20}, "hybrid": calibration()})
    oracle = ProfiledOracle(g, c, model=MODEL)
    plan = Plan.hybrid(
        g, c, dp=2, tp=1, pp=1, microbatch_size=4, global_batch=8, meta={"model": MODEL}
    )
    return oracle, plan


def test_hybrid_plan_over_the_calibrated_model_cap_is_refused_without_running(monkeypatch):
    oracle, plan = _hybrid_setup(200)  # the calibrated base alone is 340 MiB
    monkeypatch.setattr(profiled, "execute", _must_not_run)
    res = oracle.evaluate(plan)
    assert res.oom and math.isinf(res.step_time) and oracle.runs == 0
    assert "CpuHybridModel" in res.extra["oom"] and res.extra["oom"].endswith("not run")
    assert res.peak_memory.min() > 340 * 2**20


def test_hybrid_plan_that_fits_is_executed_and_reports_step_memory(monkeypatch):
    oracle, plan = _hybrid_setup(4096)
    seen = []

    def fake_execute(p, graph, cluster, **kw):
        seen.append(p)
        ex = fake_result(plan_hash(p))
        ex.mode, ex.peak_memory = "hybrid", [400 * 2**20, 410 * 2**20]
        ex.base_memory, ex.step_memory = [350 * 2**20] * 2, [50 * 2**20, 60 * 2**20]
        return ex

    monkeypatch.setattr(profiled, "execute", fake_execute)
    res = oracle.evaluate(plan)
    assert seen == [plan] and oracle.runs == 1 and not res.oom and res.step_time == 0.25
    assert res.extra["step_memory"] == [50 * 2**20, 60 * 2**20]
    assert res.peak_memory.tolist() == [400 * 2**20, 410 * 2**20]
