"""runners.train's warm start: the reported best includes the start plan, and a resume keeps it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agents.search import best_with_start
from runners import common
from runners.tracking import NullTracker
from runners.train import (
    Candidates,
    WarmStart,
    _warm_start,
    env_factory,
    search_ppo,
    train,
    warm_search_options,
)
from tests.runners.conftest import compose, small_env

START = np.array([0, 0, 1, 1], dtype=np.int64)
FOUND = np.array([0, 1, 1, 1], dtype=np.int64)


@pytest.mark.parametrize(
    "found_t,start_t,expected_t,source",
    [
        (0.30, 0.25, 0.25, "warm_start"),  # PPO only sampled slower plans: the start is reported
        (0.20, 0.25, 0.20, "search"),  # PPO beat its start
        (0.25, 0.25, 0.25, "warm_start"),  # a tie goes to the start (PPO sampled it anyway)
        (None, 0.25, 0.25, "warm_start"),  # PPO found nothing feasible
        (0.30, None, 0.30, "search"),  # the start itself runs out of memory
    ],
)
def test_best_with_start(found_t, start_t, expected_t, source) -> None:
    found = None if found_t is None else FOUND
    placement, t, src = best_with_start(found, found_t, START, start_t)
    assert t == expected_t and src == source
    assert placement is not None
    np.testing.assert_array_equal(placement, START if source == "warm_start" else FOUND)


def test_best_with_start_nothing_feasible() -> None:
    assert best_with_start(None, None, START, None) == (None, None, "search")


def test_warm_start_file_keeps_the_placement_for_a_resume(tmp_path: Path) -> None:
    plan = common.BaselineOutcome("expert", step_time=0.5, oracle_calls=1, seconds=0.0, oom=False)
    plan.plan = type("P", (), {"placement": START})()
    ws = _warm_start(tmp_path, {"expert": plan}, resuming=False)
    assert ws is not None and ws[0] == "expert"
    saved = json.loads((tmp_path / "warm_start.json").read_text())
    assert saved == {"name": "expert", "placement": START.tolist()}
    again = _warm_start(tmp_path, {}, resuming=True)
    assert again is not None and again[0] == "expert"
    np.testing.assert_array_equal(again[1], START)


def test_search_ppo_never_reports_worse_than_its_warm_start(graph_file: Path, tmp_path: Path):
    cfg = compose([*small_env(graph_file), "agent.ppo.n_steps=16", "train.timesteps=32"])
    plain = common.to_plain(cfg)
    problem = common.build_problem(common.env_spec(cfg.env))
    base = common.run_baselines(problem, ["expert"], None, seed=0, echo=lambda s: None)
    start = np.asarray(base["expert"].plan.placement, dtype=np.int64)
    start_t = float(problem.oracle().evaluate(start).step_time)
    out = search_ppo(
        problem,
        plain["agent"],
        plain["train"],
        seed=0,
        run_dir=tmp_path,
        tracker=NullTracker(),
        references={},
        log_every=1000,
        resume_state=None,
        warm_start=WarmStart("expert", start),
    )
    assert out.meta["warm_start"] == "expert"
    assert out.meta["warm_start_step_time"] == pytest.approx(start_t)
    assert out.step_time is not None and out.step_time <= start_t
    assert out.placement is not None
    assert out.meta["best_from"] in ("warm_start", "search")
    if out.meta["best_from"] == "warm_start":
        np.testing.assert_array_equal(out.placement, start)
        assert out.step_time == start_t
    else:
        assert out.step_time < start_t
    assert float(problem.oracle().evaluate(out.placement).step_time) == pytest.approx(out.step_time)


def test_warm_search_options(graph_file: Path) -> None:
    cfg = compose(small_env(graph_file))
    plain = common.to_plain(cfg)
    problem = common.build_problem(common.env_spec(cfg.env))
    assert problem.spec.env_id.endswith("Sweep-v0")
    env, kw = warm_search_options(problem, plain["agent"], warm=True)
    assert env == {"accept": "improve", "restart": "best"}
    assert kw["net_kwargs"]["keep_prob"] == 0.5
    # cold runs, agent.warm_search=false and explicit values are left alone
    assert warm_search_options(problem, plain["agent"], warm=False)[0] == {}
    off = compose([*small_env(graph_file), "agent.warm_search=false"])
    assert warm_search_options(problem, common.to_plain(off)["agent"], warm=True)[0] == {}
    mine = compose([*small_env(graph_file), "+agent.ppo.extra.net_kwargs.keep_prob=0.8"])
    _, kw = warm_search_options(problem, common.to_plain(mine)["agent"], warm=True)
    assert kw["net_kwargs"]["keep_prob"] == 0.8
    # the env keywords reach the env, and the spec's own env_kwargs win over the defaults
    env_fn = env_factory(problem, init_placement=None, env_defaults={"accept": "improve"})
    e = env_fn()
    assert e.unwrapped.accept == "improve"
    e.close()


def test_warm_start_takes_a_faster_extra_candidate_and_calls_it_once(tmp_path: Path) -> None:
    plan = common.BaselineOutcome("expert", step_time=0.5, oracle_calls=1, seconds=0.0, oom=False)
    plan.plan = type("P", (), {"placement": START})()
    calls = []

    def extra() -> Candidates:
        calls.append(1)
        return Candidates({"zero_shot:generalist": (0.4, FOUND)})

    ws = _warm_start(tmp_path, {"expert": plan}, resuming=False, extra=extra)
    assert ws is not None and ws[0] == "zero_shot:generalist"
    np.testing.assert_array_equal(ws[1], FOUND)
    # a resume reads the recorded start and does not plan again
    again = _warm_start(tmp_path, {"expert": plan}, resuming=True, extra=extra)
    assert again is not None and again[0] == "zero_shot:generalist" and calls == [1]
    # slower or infeasible: the baseline stays the start
    slower = _warm_start(
        tmp_path / "b", {"expert": plan}, False, lambda: Candidates({"z": (0.6, FOUND)})
    )
    none = _warm_start(
        tmp_path / "c", {"expert": plan}, False, lambda: Candidates({"z": (None, None)})
    )
    assert slower is not None and slower[0] == "expert" and none is not None and none[0] == "expert"


def test_init_policy_plan_is_the_policys_own_zero_shot_plan(graph_file: Path) -> None:
    from agents import load_policy
    from runners.train import init_policy_plan

    cfg = compose([*small_env(graph_file), "agent.init_policy=generalist"])
    plain = common.to_plain(cfg)
    problem = common.build_problem(common.env_spec(cfg.env))
    assert init_policy_plan(problem, {**plain["agent"], "init_policy": None}, seed=0) == ({}, None)
    got = init_policy_plan(problem, plain["agent"], seed=3)
    calls = got.zero_shot_calls  # the calls the plan took
    ((name, (t, placement)),) = got.plans.items()
    assert name == "zero_shot:generalist"
    oracle = problem.oracle()
    policy = load_policy("generalist")
    # what runners.plan plans: the policy's default samples (1024), not plan()'s default 1
    # (the start used to be that one sample, slower than runners.plan's plan)
    assert policy.default_samples() == 1024
    want = policy.plan(
        problem.graph, problem.cluster, microbatches=problem.spec.microbatches,
        schedule=problem.spec.schedule, samples=1024, oracle=oracle, seed=3,
    )  # fmt: skip
    np.testing.assert_array_equal(placement, want.placement)
    assert t == pytest.approx(float(oracle.evaluate(want.placement).step_time))
    assert calls == want.meta["oracle_calls"] + 1 > 1  # its samples, then the check
    one = policy.plan(
        problem.graph, problem.cluster, microbatches=problem.spec.microbatches,
        schedule=problem.spec.schedule, samples=1, oracle=oracle, seed=3,
    )  # fmt: skip
    assert t <= float(oracle.evaluate(one.placement).step_time) + 1e-12


def test_an_init_policy_of_another_network_than_agent_policy_is_refused(
    graph_file: Path, tmp_path: Path, monkeypatch
) -> None:
    """`agent=placeto agent.init_policy=generalist` (a GDP file) trained GDP under the name
    placeto (found by fuzzing, the other way round); `agent.policy=auto` takes the file's."""
    from runners import common

    monkeypatch.setattr(common, "run_baselines", lambda *a, **k: pytest.fail("a baseline ran"))
    cfg = compose([*small_env(graph_file), "agent=placeto", "agent.init_policy=generalist"])
    with pytest.raises(ValueError, match="agent.policy is 'placeto', but agent.init_policy="
                       "'generalist' is a 'gdp' network"):  # fmt: skip
        train(cfg, tmp_path / "run", echo=lambda s: None)
