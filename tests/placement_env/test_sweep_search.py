"""Sweep-v0's local-search options: ``accept="improve"`` and ``restart="best"``, by hand."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env

import placement_env  # noqa: F401  (registers the env ids)
from placement_env.generators import fixed
from tests.placement_env.test_envs import ToyOracle, chain3, make_cluster

SWEEP = "placement_env/Sweep-v0"


def _sweep(memory: float | list[float] = 1e12, **kw):
    cl = make_cluster(2, memory=memory)
    return gym.make(SWEEP, generator=fixed(chain3(), cl), oracle_factory=ToyOracle, **kw).unwrapped


def test_accept_improve_reverts_worse_moves_by_hand() -> None:
    env = _sweep(init="zeros", accept="improve")
    _, info = env.reset(seed=0)
    assert info["step_time"] == pytest.approx(4.0) and info["cost"] == pytest.approx(2.0)
    # a -> d1: loads (2, 2) + cut a->b 1 s = 3 s, cost 1.5 < 2: accepted, reward 0.5
    _, r, _, _, info = env.step(1)
    assert r == pytest.approx(0.5) and not info["rejected"]
    assert info["placement"].tolist() == [1, 0, 0] and info["step_time"] == pytest.approx(3.0)
    # b -> d1: loads (1, 3) + cut b->c 1 s = 4 s, cost 2 > 1.5: rejected, reward -0.5, reverted
    _, r, _, _, info = env.step(1)
    assert r == pytest.approx(-0.5) and info["rejected"]
    assert info["placement"].tolist() == [1, 0, 0] and info["step_time"] == pytest.approx(3.0)
    assert env.state.cost == pytest.approx(1.5)
    # c stays on d0: no change, reward 0, not a rejection
    _, r, term, _, info = env.step(0)
    assert r == 0.0 and term and not info["rejected"]
    assert info["placement"].tolist() == [1, 0, 0]
    # 3 distinct placements were evaluated; the revert was a cache hit
    assert info["oracle_calls"] == 3 and env.oracle.calls == 3


def test_accept_improve_rejects_out_of_memory_moves() -> None:
    # d1 holds 5 bytes; a has 10: a -> d1 is 3 s but OOM, cost 1.5 + 1 * (1 + 1) = 3.5 > 2
    env = _sweep(memory=[1e12, 5.0], init="zeros", accept="improve")
    env.reset(seed=0)
    _, r, _, _, info = env.step(1)
    assert r == pytest.approx(-1.5) and info["rejected"] and not info["oom"]
    assert info["placement"].tolist() == [0, 0, 0]


def test_accept_all_is_the_default_and_keeps_worse_moves() -> None:
    env = _sweep(init="zeros")
    env.reset(seed=0)
    env.step(1)
    _, r, _, _, info = env.step(1)  # the same worse move as above is kept
    assert r == pytest.approx(-0.5) and not info["rejected"]
    assert info["placement"].tolist() == [1, 1, 0]


def test_restart_best_starts_from_the_best_feasible_plan() -> None:
    env = _sweep(init="zeros", restart="best")
    env.reset(seed=0)
    for d in (1, 1, 1):  # [1,0,0] 3 s, then [1,1,0] 4 s, then [1,1,1] 4 s
        env.step(d)
    _, info = env.reset(seed=1)
    assert info["placement"].tolist() == [1, 0, 0] and info["step_time"] == pytest.approx(3.0)
    # restart="init" (the default) goes back to init
    env = _sweep(init="zeros")
    env.reset(seed=0)
    for d in (1, 1, 1):
        env.step(d)
    _, info = env.reset(seed=1)
    assert info["placement"].tolist() == [0, 0, 0]


def test_restart_best_never_restarts_from_an_oom_plan() -> None:
    # with no OOM penalty, a -> d1 is cheaper (3 s) but out of memory: not a restart point
    env = _sweep(memory=[1e12, 5.0], init="zeros", restart="best", oom_penalty=0.0)
    env.reset(seed=0)
    _, _, _, _, info = env.step(1)
    assert info["oom"] and info["step_time"] == pytest.approx(3.0)
    env.step(0)
    env.step(0)
    _, info = env.reset(seed=1)
    assert info["placement"].tolist() == [0, 0, 0] and not info["oom"]


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"accept": "greedy"}, "accept 'greedy' is unknown"),
        ({"accept": "improve", "reward_mode": "final"}, 'needs reward_mode="dense"'),
        ({"restart": "last"}, "restart 'last' is unknown"),
    ],
)
def test_bad_options_are_rejected(kw, match) -> None:
    with pytest.raises(ValueError, match=match):
        _sweep(**kw)


def test_env_checker_passes_with_the_search_options() -> None:
    env = _sweep(init="zeros", accept="improve", restart="best")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym_check_env(env, skip_render_check=True)
