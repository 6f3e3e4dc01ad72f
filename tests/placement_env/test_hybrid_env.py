"""Hybrid-v0: moves, masks, rewards by hand, checkers."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import placement_env  # noqa: F401  (registers the ids)
from placement_env.envs.hybrid import KEYS


@pytest.fixture(scope="module")
def env():
    e = gym.make("placement_env/Hybrid-v0").unwrapped
    e.reset(seed=0)
    return e


def test_registered_and_checkers_pass():
    assert gym.spec("placement_env/Hybrid-v0").max_episode_steps == 64
    e = gym.make("placement_env/Hybrid-v0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(e.unwrapped)


def test_megatron_start_and_field_moves(env):
    obs, info = env.reset(seed=0)
    lay = env.layout
    # largest TP in a node, fewest stages, microbatch 1, full recomputation, ZeRO-0
    assert (lay.tp, lay.pp, lay.microbatch_size, lay.recompute, lay.zero) == (8, 1, 1, "full", 0)
    masks = env.action_masks()
    up_tp = 2 * KEYS.index("tp") + 1
    assert not masks[up_tp]  # tp = 8 fills a node
    down_tp = 2 * KEYS.index("tp")
    assert masks[down_tp]
    before = env._cost
    obs, r, term, trunc, info = env.step(down_tp)
    assert env.layout.tp == 4 and env.layout.dp == 4 and env.layout.pp == 1
    assert r == pytest.approx(before - env._cost)
    assert not info["invalid_action"] and not term and not trunc
    # a masked move is a flagged no-op with reward 0
    bad = int(np.flatnonzero(~env.action_masks())[0])
    lay = env.layout
    obs, r, *_, info = env.step(bad)
    assert info["invalid_action"] and r == 0.0 and env.layout == lay


def test_boundary_moves_and_reward_sign(env):
    env.reset(seed=0)
    env.step(2 * KEYS.index("pp") + 1)  # one more pipeline stage
    lay = env.layout
    assert lay.pp == 2 and lay.stage_layers == ((0, 4), (4, 8))
    nk = 2 * len(KEYS)
    before = env._cost
    obs, r, *_, info = env.step(nk + 0)  # end of chunk 0 one layer left
    assert env.layout.stage_layers == ((0, 3), (3, 8))
    # the last stage already carries the head: a heavier last stage is slower
    assert info["step_time"] > 0 and r == pytest.approx(before - env._cost) and r < 0
    assert obs["chunk_mask"].sum() == 2
    assert obs["chunks"][0] == pytest.approx(3 / 8)
    # boundaries of chunks the layout does not have are masked
    assert not env.action_masks()[nk + 2 * 5]


def test_stage_submesh_moves(env):
    """The last block of actions changes one stage's tp on its own submesh (GPU count kept,
    dp following): the layout gets stage_meshes, the observation shows them per chunk, the
    move back restores the uniform layout, and a field move lands on the grid again."""
    env.reset(seed=0)
    env.step(2 * KEYS.index("pp") + 1)  # two stages of 8 GPUs, tp 8, dp 1
    lay = env.layout
    assert (lay.pp, lay.tp, lay.dp, lay.microbatch_size) == (2, 8, 1, 1)
    ns = 2 * len(KEYS) + 2 * (env.max_chunks - 1)
    m = env.action_masks()
    # stage 1: tp 8 -> 4 needs dp 2, which does not divide the 1-sample microbatch
    assert not m[ns + 2 * 1] and not m[ns + 2 * 1 + 1]  # and tp 8 is a full node
    env.step(2 * KEYS.index("microbatch_size") + 1)  # microbatch of 2 samples
    assert env.layout.microbatch_size == 2 and env.layout.dp == 1
    m = env.action_masks()
    assert m[ns + 2 * 1] and not m[ns + 2 * 1 + 1] and not m[ns + 2 * 2]
    obs, r, *_, info = env.step(ns + 2 * 1)  # stage 1 down to tp 4 (dp 2)
    het = env.layout
    assert het.stage_meshes == ((1, 8), (2, 4)) and het.microbatch_size == 2
    assert info["layout"]["stage_meshes"] == [[1, 8], [2, 4]] and not info["invalid_action"]
    assert info["step_time"] == pytest.approx(env._prep["oracle"].evaluate_layout(het).step_time)
    chunks = obs["chunks"].reshape(env.max_chunks, -1)
    assert chunks[0, 3] == pytest.approx(1.0) and chunks[1, 3] == pytest.approx(2 / 3)
    assert chunks[0, 4] == 0.0 and chunks[1, 4] == pytest.approx(1 / 4)
    env.step(ns + 2 * 1 + 1)  # back to tp 8: the same shape everywhere again
    assert env.layout == lay.__class__.from_dict({**lay.to_dict(), "microbatch_size": 2})
    assert not env.layout.heterogeneous
    env.step(ns + 2 * 1)
    env.step(2 * KEYS.index("recompute"))  # a field move: a grid layout
    assert not env.layout.heterogeneous


def test_masks_match_the_moves(env):
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(20):
        m = env.action_masks()
        assert m.tolist() == [env._target(a) is not None for a in range(env.action_space.n)]
        env.step(int(rng.choice(np.flatnonzero(m))))


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"global_batch": 0}, "global_batch 0: expected an integer >= 1"),  # was the default
        ({"global_batch": "8"}, "global_batch '8'"),
        ({"max_chunks": 0}, "max_chunks 0: expected an integer >= 1"),  # was "no valid layout"
        ({"oom_penalty": -1.0}, "oom_penalty -1.0: expected a finite number >= 0"),  # rewarded OOM
        ({"oom_penalty": float("nan")}, "oom_penalty nan"),
    ],
)
def test_bad_options_are_refused_by_name(kw, says):
    with pytest.raises(ValueError, match=f"HybridEnv: {says}"):
        gym.make("placement_env/Hybrid-v0", **kw)


def test_stage_recompute_moves(env):
    """The last block of actions changes one stage's recomputation (less: even, more: odd):
    the layout gets stage_recompute, the observation shows it per chunk, the step is the
    simulator's, the move back restores the uniform layout, and the ends are masked."""
    env.reset(seed=0)
    env.step(2 * KEYS.index("pp") + 1)  # two stages, full recomputation (the start)
    lay = env.layout
    assert lay.pp == 2 and lay.recompute == "full" and not lay.stage_recompute
    nr = 2 * len(KEYS) + 2 * (env.max_chunks - 1) + 2 * env.max_chunks
    assert env.action_space.n == nr + 2 * env.max_chunks
    m = env.action_masks()
    assert m[nr + 2 * 1] and not m[nr + 2 * 1 + 1]  # full: only less recomputation
    assert not m[nr + 2 * 2] and not m[nr + 2 * 2 + 1]  # no third stage
    obs, r, *_, info = env.step(nr + 2 * 1)  # stage 1: full -> selective
    het = env.layout
    assert het.stage_recompute == ("full", "selective") and het.recompute == "full"
    assert info["layout"]["stage_recompute"] == ["full", "selective"]
    assert info["step_time"] == pytest.approx(env._prep["oracle"].evaluate_layout(het).step_time)
    chunks = obs["chunks"].reshape(env.max_chunks, -1)
    assert chunks[0, 5] == pytest.approx(1.0) and chunks[1, 5] == pytest.approx(0.5)
    env.step(nr + 2 * 1 + 1)  # back to full
    assert env.layout == lay and not env.layout.heterogeneous
    env.step(nr + 2 * 0)  # stage 0 (and so `recompute`) to selective
    assert env.layout.recompute == "selective"
    assert env.layout.stage_recompute == ("selective", "full")


def test_stage_zero_moves_are_opt_in():
    """With ``stage_zero=True`` a last block of actions changes one stage's ZeRO stage (down:
    even, up: odd; up only where the stage has data parallelism): the layout gets
    stage_zero, the chunks show it in a 7th column, the step is the simulator's, and moving
    every stage to one ZeRO stage gives the uniform layout back. Without the option the
    spaces are the env's earlier ones."""
    plain = gym.make("placement_env/Hybrid-v0").unwrapped
    K = plain.max_chunks
    nz = 2 * len(KEYS) + 2 * (K - 1) + 4 * K
    assert plain.action_space.n == nz
    assert plain.observation_space["chunks"].shape == (K * 6,)
    env = gym.make("placement_env/Hybrid-v0", stage_zero=True).unwrapped
    assert env.action_space.n == nz + 2 * K
    assert env.observation_space["chunks"].shape == (K * 7,)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env)
    env.reset(seed=0)
    env.step(2 * KEYS.index("pp") + 1)  # two stages of tp 8: dp 1, so no ZeRO to choose
    assert (env.layout.pp, env.layout.dp) == (2, 1)
    m = env.action_masks()
    assert not m[nz : nz + 2 * K].any()
    env.step(2 * KEYS.index("tp"))  # tp 4: dp 2 on each stage
    lay = env.layout
    assert (lay.dp, lay.tp, lay.pp, lay.zero) == (2, 4, 2, 0)
    m = env.action_masks()
    assert m[nz + 2 * 1 + 1] and not m[nz + 2 * 1]  # stage 1: up only
    assert not m[nz + 2 * 2] and not m[nz + 2 * 2 + 1]  # no third stage
    obs, r, *_, info = env.step(nz + 2 * 1 + 1)  # stage 1: ZeRO-0 -> ZeRO-1
    het = env.layout
    assert het.stage_zero == (0, 1) and het.zero == 0 and info["layout"]["stage_zero"] == [0, 1]
    assert info["step_time"] == pytest.approx(env._prep["oracle"].evaluate_layout(het).step_time)
    chunks = obs["chunks"].reshape(K, 7)
    assert chunks[0, 6] == 0.0 and chunks[1, 6] == pytest.approx(1 / 3)
    assert chunks[:2, :6].tolist() == obs_without_zero(env, het)[:2].tolist()
    env.step(nz + 2 * 0 + 1)  # stage 0 to ZeRO-1 as well: one ZeRO stage again
    assert env.layout.zero == 1 and not env.layout.stage_zero
    for _ in range(2):
        env.step(nz + 2 * 1 + 1)  # stage 1 up to ZeRO-3
    assert env.layout.stage_zero == (1, 3)
    assert not env.action_masks()[nz + 2 * 1 + 1]  # ZeRO-3 is the top
    rng = np.random.default_rng(1)
    for _ in range(20):
        m = env.action_masks()
        assert m.tolist() == [env._target(a) is not None for a in range(env.action_space.n)]
        env.step(int(rng.choice(np.flatnonzero(m))))
    with pytest.raises(ValueError, match="HybridEnv: stage_zero 'false': expected true or false"):
        gym.make("placement_env/Hybrid-v0", stage_zero="false")


def obs_without_zero(env, lay):
    """The 6-column chunk table of ``lay`` as the env without ``stage_zero`` shows it."""
    plain = gym.make("placement_env/Hybrid-v0").unwrapped
    plain.reset(seed=0)
    plain.layout, plain._res = lay, env._res
    return plain._get_obs()["chunks"].reshape(plain.max_chunks, 6)
