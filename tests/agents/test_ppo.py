"""Smoke tests of the PPO glue and the BestPlanTracker callback on tiny placement problems."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from sb3_contrib import MaskablePPO
from stable_baselines3 import PPO
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.vec_env import DummyVecEnv

import placement_env  # noqa: F401  (registers the env ids)
from agents.callbacks import BestPlanTracker
from agents.ppo import make_hybrid_ppo, make_ppo, make_vec_env
from graphs.clusters import load
from graphs.compgraph import CompGraph
from placement_env.generators import fixed
from placement_env.oracles.simulator import Simulator


def _chain(n: int = 4) -> CompGraph:
    return CompGraph.build(
        n,
        [(i, i + 1) for i in range(n - 1)],
        flops=1e9,
        out_bytes=1e6,
        param_bytes=1e6,
        meta={"name": f"chain{n}"},
    )


def _kwargs(n_devices: int = 2) -> dict[str, Any]:
    return {"generator": fixed(_chain(), load(f"cpu_{n_devices}"))}


class _NoMasks(gym.Wrapper):
    """Hides ``action_masks`` so the env looks unmasked to SB3."""

    def get_wrapper_attr(self, name: str) -> Any:
        if name == "action_masks":
            raise AttributeError(name)
        return super().get_wrapper_attr(name)


@pytest.mark.parametrize(
    "env_id,policy",
    [
        ("placement_env/Sweep-v0", "placeto"),
        ("placement_env/OneShot-v0", "gdp"),
        ("placement_env/Reassign-v0", "placeto"),
    ],
)
def test_make_ppo_learns_and_tracks_the_best_plan(env_id, policy):
    improvements: list[float] = []
    model = make_ppo(
        env_id, policy, env_kwargs=_kwargs(), n_steps=16, net_kwargs={"hidden": 16}, seed=1
    )
    assert isinstance(model, MaskablePPO) and model.n_envs == 2
    tracker = BestPlanTracker(on_improve=lambda t: improvements.append(t.best_step_time))
    model.learn(32, callback=tracker)
    assert model.num_timesteps >= 32
    assert np.isfinite(tracker.best_step_time) and tracker.best_placement is not None
    # the tracked plan really has the tracked step time, and improvements only go down
    sim = Simulator(_chain(), load("cpu_2"), microbatches=8, schedule="1f1b")
    res = sim.evaluate(tracker.best_placement)
    assert not res.oom and res.step_time == pytest.approx(tracker.best_step_time)
    assert improvements and improvements == sorted(improvements, reverse=True)
    assert improvements[-1] == tracker.best_step_time
    envs_calls = sum(model.get_env().get_attr("total_oracle_calls"))
    assert tracker.oracle_calls == envs_calls > 0
    assert [h["event"] for h in tracker.history].count("improve") == len(improvements)
    assert all(h["oracle_calls"] <= envs_calls for h in tracker.history)


def test_make_ppo_uses_plain_ppo_without_masks_and_caps_the_batch():
    def factory() -> gym.Env:
        return _NoMasks(gym.make("placement_env/OneShot-v0", **_kwargs()))

    model = make_ppo(factory, "placeto", n_envs=1, n_steps=8, net_kwargs={"hidden": 8})
    assert type(model) is PPO
    assert model.batch_size == 8
    model.learn(16)
    assert model.num_timesteps >= 16


def test_learning_leaves_no_sb3_folder_in_the_temp_dir(tmp_path, monkeypatch, capsys):
    """SB3 without a logger of its own makes an empty $TMPDIR/SB3-<date> folder per learn()."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("SB3_LOGDIR", raising=False)
    quiet = make_ppo("placement_env/OneShot-v0", "placeto", env_kwargs=_kwargs(), n_steps=8,
                     net_kwargs={"hidden": 8})  # fmt: skip
    quiet.learn(16)
    assert not capsys.readouterr().out
    loud = make_ppo("placement_env/OneShot-v0", "placeto", env_kwargs=_kwargs(), n_steps=8,
                    net_kwargs={"hidden": 8}, verbose=1)  # fmt: skip
    loud.learn(16)
    assert "total_timesteps" in capsys.readouterr().out  # verbose=1 still prints SB3's table
    assert list(tmp_path.iterdir()) == []
    hybrid = make_hybrid_ppo("placement_env/Hybrid-v0", n_steps=8)  # its own small default
    hybrid.learn(8)
    assert list(tmp_path.iterdir()) == []


def test_make_ppo_errors_name_the_bad_input():
    with pytest.raises(ValueError, match="available: \\['gdp', 'placeto'\\]"):
        make_ppo("placement_env/Sweep-v0", "transformer", env_kwargs=_kwargs())
    with pytest.raises(ValueError, match="vec_env 'threads' is unknown"):
        make_vec_env("placement_env/Sweep-v0", vec_env="threads")
    for bad in (0, "2", 1.5):  # "2" was a TypeError (fuzzing, 2 Dec 2026)
        with pytest.raises(ValueError, match="n_envs must be an integer >= 1, got"):
            make_vec_env("placement_env/Sweep-v0", n_envs=bad)
    with pytest.raises(ValueError, match="env_kwargs apply to an env id only"):
        make_vec_env(lambda: gym.make("placement_env/Sweep-v0"), env_kwargs={"init": "zeros"})
    # with an env instance or a VecEnv they were ignored without a word (fuzzing)
    env = gym.make("placement_env/Sweep-v0", **_kwargs())
    for given in (env, DummyVecEnv([lambda: env])):
        with pytest.raises(ValueError, match="not to an env instance or VecEnv"):
            make_ppo(given, "placeto", env_kwargs={"init": "zeros"})


def test_tracker_keeps_the_fastest_feasible_complete_placement():
    model = make_ppo(
        "placement_env/OneShot-v0", "placeto", env_kwargs=_kwargs(), n_steps=8, n_envs=1
    )
    model.set_logger(Logger(None, []))
    tracker = BestPlanTracker()
    tracker.init_callback(model)
    full, partial = np.array([0, 1, 1, 0]), np.array([0, -1, 1, 0])
    tracker.locals = {
        "infos": [
            {"step_time": 0.01, "oom": True, "placement": full},  # fastest but OOM
            {"step_time": 0.05, "oom": False, "placement": full},
            {"step_time": 0.02, "oom": False, "placement": partial},  # incomplete
            {"step_time": float("nan"), "oom": False, "placement": full},  # not evaluated
            {"step_time": 0.03, "oom": False, "placement": full[::-1]},
        ],
        "dones": np.array([False, False, False, False, True]),
    }
    assert tracker.on_step()
    assert tracker.best_step_time == 0.03
    assert tracker.best_placement.tolist() == [0, 1, 1, 0][::-1]
    assert [h["event"] for h in tracker.history] == ["episode", "improve"]
    stale = {"step_time": 0.001, "oom": False, "placement": full[::-1], "scored": False}
    tracker.locals = {"infos": [stale], "dones": np.array([False])}
    assert tracker.on_step()
    assert tracker.best_step_time == 0.03  # a step time not of this placement is not kept
    assert model.logger.name_to_value["placement/best_step_time"] == 0.03
    with pytest.raises(TypeError, match="on_improve must be callable or None, got 5"):
        BestPlanTracker(on_improve=5)  # failed inside model.learn (fuzzing, 2 Dec 2026)
    only_other = BestPlanTracker(instance="other")
    only_other.init_callback(model)
    only_other.locals = tracker.locals
    only_other.on_step()
    assert only_other.best_placement is None and only_other.best_step_time == float("inf")
    model.set_logger(Logger(None, []))  # a generator run's best is of its training graphs
    sampled = BestPlanTracker(log_key="placement/best_step_time_training_graphs")
    sampled.init_callback(model)
    sampled.locals = {"infos": [{"step_time": 0.04, "oom": False, "placement": full}]}
    sampled.on_step()
    logged = dict(model.logger.name_to_value)
    assert logged.pop("placement/best_step_time_training_graphs") == 0.04
    assert set(logged) == {"placement/oracle_calls"}  # no placement/best_step_time


def test_tracker_on_final_reward_sweep_keeps_a_true_pair():
    """Sweep-v0 reward_mode="final" infos: the kept step time is the kept placement's."""
    from tests.placement_env.test_envs import ToyOracle, _toy, chain3, make_cluster

    env = _toy(
        "placement_env/Sweep-v0",
        init=np.array([0, 1, 1]),  # 3 s
        order="reverse",
        oom_penalty=0.0,
        reward_mode="final",
    )
    tracker = BestPlanTracker()
    tracker.model = SimpleNamespace(logger=Logger(None, []), num_timesteps=0)
    env.reset(seed=0)  # SB3 callbacks never see reset infos
    for d in (0, 1, 0):  # c -> d0 (5 s, not scored), b stays, a stays: scored at the end
        tracker.locals = {"infos": [env.step(d)[4]], "dones": None}
        tracker._on_step()
    assert tracker.best_placement.tolist() == [0, 1, 0]
    truth = ToyOracle(chain3(), make_cluster(2)).evaluate(tracker.best_placement).step_time
    assert tracker.best_step_time == pytest.approx(truth) == pytest.approx(5.0)


def test_ppo_search_curve_has_calls_and_seconds():
    from agents.search import ppo_search
    from placement_env.envs.base import SimulatorFactory

    g, c = _chain(), load("cpu_2")
    factory = SimulatorFactory(microbatches=8, schedule="1f1b")
    t0 = __import__("time").perf_counter()
    found = ppo_search(
        "placement_env/Sweep-v0",
        graph=g,
        cluster=c,
        oracle_factory=factory,
        timesteps=32,
        policy="placeto",
        seed=1,
        ppo_kwargs={"env_kwargs": {"generator": fixed(g, c)}, "n_steps": 16,
                    "net_kwargs": {"hidden": 8}},
    )  # fmt: skip
    wall = __import__("time").perf_counter() - t0
    assert len(found.curve) == len(found.history) > 0
    for (t, n, s, b), (t2, n2, b2) in zip(found.curve, found.history):
        assert (t, n, b) == (t2, n2, b2) and 0 <= s <= wall
    secs = [s for _, _, s, _ in found.curve]
    calls = [n for _, n, _, _ in found.curve]
    assert secs == sorted(secs) and calls == sorted(calls) and calls[-1] <= found.oracle_calls
    assert min(b for *_, b in found.curve) == pytest.approx(found.step_time)
