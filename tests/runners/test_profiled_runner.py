"""The profiled env's runner plumbing, with the runtime faked (no process is launched)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from placement_env.oracles import profiled
from placement_env.oracles.simulator import Simulator
from runners import common
from runtime.execute import ExecResult
from runtime.launch import RankFailure
from runtime.spec import plan_hash
from tests.runners.conftest import compose


@pytest.fixture(scope="module")
def problem() -> common.Problem:
    cfg = compose(["+env=cpu_profiled", "logger=none"])
    return common.build_problem(common.env_spec(cfg.env))


def fake_run(plan, graph, cluster, **kwargs) -> ExecResult:
    devices = sorted({int(d) for d in plan.placement})
    k = len(devices)
    return ExecResult(
        step_time=0.01 * k,
        step_times=[0.01 * k],
        compute=[0.008] * k,
        comm=[0.001] * k,
        idle=[0.001] * k,
        loss=6.0,
        devices=devices,
        mode="oplevel",
        world_size=k,
        microbatches=plan.microbatches,
        schedule=plan.schedule,
        plan_hash=plan_hash(plan),
        peak_memory=[300e6] * k,
    )


def test_factory_passes_the_envs_pipeline_settings(problem):
    oracle = problem.oracle()
    assert (oracle.microbatches, oracle.schedule) == (2, "1f1b")
    assert (oracle.steps, oracle.warmup) == (3, 1)  # env.oracle_options
    assert problem.oracle()._cache is oracle._cache  # one cache per run


def test_lower_bound_is_simulated_not_executed(problem, monkeypatch):
    monkeypatch.setattr(profiled, "execute", pytest.fail)
    sim = Simulator(problem.graph, problem.cluster, microbatches=2, schedule="1f1b")
    assert common.lower_bound(problem) == sim.lower_bound() > 0
    assert problem.oracle().lower_bound() == sim.lower_bound()


def test_a_rank_failure_in_a_baseline_is_that_baseline_failing(problem, monkeypatch):
    def failing(plan, *args, **kwargs):
        if len(set(plan.placement.tolist())) > 1:
            raise RankFailure(1, "ValueError", "Number of microbatches (1) must be >= 2")
        return fake_run(plan, *args, **kwargs)

    problem = common.Problem(
        problem.spec, problem.graph, problem.cluster, common.oracle_factory(problem.spec)
    )
    monkeypatch.setattr(profiled, "execute", failing)
    out = common.run_baselines(problem, ["single", "round_robin"], 5, echo=None)
    assert out["single"].step_time == pytest.approx(0.01) and out["single"].error is None
    rr = out["round_robin"]
    assert rr.step_time is None and not rr.oom
    assert "rank 1 failed with ValueError: Number of microbatches" in rr.error
    assert json.loads(json.dumps(rr.to_dict()))["error"] == rr.error


def test_measured_plan_artifacts_note_that_there_is_no_timeline(problem, monkeypatch, tmp_path):
    problem = common.Problem(
        problem.spec, problem.graph, problem.cluster, common.oracle_factory(problem.spec)
    )
    monkeypatch.setattr(profiled, "execute", fake_run)
    plan = problem.plan(problem.graph.group % 2, algorithm="test")
    assert plan.meta["model"]["name"] == "gpt2" and plan.meta["model"]["max_groups"] == 16
    assert plan.meta["cluster"] == "cpu_2" and plan.meta["algorithm"] == "test"
    res = common.write_plan_artifacts(problem, plan, tmp_path)
    assert res.step_time == pytest.approx(0.02) and not res.oom
    note = (tmp_path / "best_plan_timeline.txt").read_text()
    assert note.count("\n") == 1 and "no timeline" in note and "best_plan_measured.json" in note
    measured = json.loads((tmp_path / "best_plan_measured.json").read_text())
    assert measured["world_size"] == 2 and measured["plan_hash"] == plan_hash(plan)
    assert not (tmp_path / "best_plan_gantt.png").exists()
    assert np.array_equal(
        np.asarray(json.loads((tmp_path / "best_plan.json").read_text())["placement"]),
        plan.placement,
    )


def test_plan_on_a_profiled_env_says_that_it_executes_the_samples(monkeypatch, tmp_path):
    """runners.plan +env=cpu_profiled scores each distinct sample with a measured run (8.6 s
    each here); it now says so, with the number of runs it may take, before it starts."""
    from runners.plan import plan

    monkeypatch.setattr(profiled, "execute", fake_run)
    lines: list[str] = []
    res = plan(
        compose(["+env=cpu_profiled", "samples=3"], config="plan"), tmp_path, echo=lines.append
    )
    assert "the profiled oracle executes each distinct placement" in lines[0]
    assert "up to 3 measured run(s)" in lines[0] and res["oracle_calls"] <= 3
