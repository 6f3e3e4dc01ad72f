"""Tests of the pair head's learnable keep-the-current-device logit (``keep_prob``)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3.common.utils import ConstantSchedule

import placement_env  # noqa: F401  (registers the env ids)
from agents import export_policy, load_policy, policies
from agents.policies import MASK_LOGIT, DenseGraph, PairScorer, PlacetoNet, dense_from_obs
from agents.ppo import make_ppo
from graphs.clusters import load
from graphs.compgraph import CompGraph
from placement_env.encoding import observation_space
from placement_env.generators import fixed
from tests.agents.test_policies import BOUNDS
from tests.agents.test_policies import _net as policy_net
from tests.agents.test_policies import _obs as policy_obs


def _flat_scorer(keep_prob: float | None) -> PairScorer:
    """A scorer whose attention part scores every pair 0 (``v = 0``)."""
    sc = PairScorer(3, 3, hidden=4, keep_prob=keep_prob)
    with torch.no_grad():
        sc.v.weight.zero_()
    return sc


@pytest.mark.parametrize("real", [2, 3, 4, 8])
@pytest.mark.parametrize("p", [0.5, 0.9, 0.95])
def test_keep_probability_is_keep_prob_for_any_device_count(real, p):
    """Equal attention scores: softmax keeps the current device with probability p exactly."""
    D, N = 8, 2
    sc = _flat_scorer(p)
    dev_mask = torch.zeros(1, D, dtype=torch.bool)
    dev_mask[0, :real] = True
    assign = torch.zeros(1, N, D)
    assign[0, 0, 1] = 1.0  # node 0 sits on device 1; node 1 is unplaced
    s = sc(torch.randn(1, N, 3), torch.randn(1, D, 3), assign, torch.ones(1, N), dev_mask)
    probs = torch.softmax(s, -1)[0]
    assert probs[0, 1].item() == pytest.approx(p, abs=1e-6)
    # the other real devices share the rest equally; padded devices get nothing
    others = [d for d in range(real) if d != 1]
    torch.testing.assert_close(probs[0, others], torch.full((real - 1,), (1 - p) / (real - 1)))
    assert (s[0, :, real:] == MASK_LOGIT).all()
    # an unplaced node gets no keep bonus: uniform over the real devices
    torch.testing.assert_close(probs[1, :real], torch.full((real,), 1.0 / real))
    assert sc.keep_logit is not None
    assert sc.keep_logit.item() == pytest.approx(math.log(p / (1 - p)), rel=1e-6)


def test_no_keep_prob_means_no_keep_parameter():
    sc = _flat_scorer(None)
    assert sc.keep_logit is None and "keep_logit" not in dict(sc.named_parameters())
    assign = torch.zeros(1, 1, 4)
    assign[0, 0, 2] = 1.0
    s = sc(torch.randn(1, 1, 3), torch.randn(1, 4, 3), assign, torch.ones(1, 1), torch.ones(1, 4))
    torch.testing.assert_close(torch.softmax(s, -1), torch.full((1, 1, 4), 0.25))
    assert "keep_prob" in repr(_flat_scorer(0.9)) and "keep_prob" not in repr(sc)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5])
def test_keep_prob_out_of_range_is_rejected(bad):
    with pytest.raises(ValueError, match="keep_prob must be in"):
        PairScorer(3, 3, keep_prob=bad)


# --------------------------------------------------------------------------- networks
def _obs(placement=(0, 1, 1, 0), current: int = 1, batch: int = 1) -> dict[str, torch.Tensor]:
    """Observation of the 4-node graph of test_policies on cpu_4 (4 real devices)."""
    return policy_obs(placement, current, batch, cluster="cpu_4")


def _net(g: DenseGraph, keep_prob: float | None) -> PlacetoNet:
    return policy_net("placeto", g, keep_prob=keep_prob)


def test_untrained_network_keeps_devices_with_about_keep_prob():
    """At initialisation the attention scores are small, so keep ~ keep_prob on real inputs."""
    g = dense_from_obs(_obs())
    with torch.no_grad():
        plain = torch.softmax(_net(g, None)(g)[0][0, :4], -1)
        kept = torch.softmax(_net(g, 0.9)(g)[0][0, :4], -1)
    cur = torch.tensor([0, 1, 1, 0])
    p_plain = plain[torch.arange(4), cur]
    p_keep = kept[torch.arange(4), cur]
    assert (p_plain < 0.45).all()  # about 1/4 without the keep logit
    assert ((p_keep > 0.8) & (p_keep < 0.97)).all()


def test_keep_logit_is_learned_and_in_the_config():
    g = dense_from_obs(_obs(batch=2))
    net = _net(g, 0.9).train()
    s, v = net(g)
    (s[:, :4, :4].logsumexp(-1).sum() + v.sum()).backward()
    assert net.scorer.keep_logit is not None and net.scorer.keep_logit.grad is not None
    assert net.scorer.keep_logit.grad.abs().item() > 0
    assert net.config()["keep_prob"] == 0.9
    clone = PlacetoNet(**net.config())
    clone.load_state_dict(net.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(clone.eval()(g)[0], net.eval()(g)[0])


def test_sb3_policy_with_keep_still_respects_masks():
    """A mask forbidding the current device wins over the keep logit."""
    pol = policies.get("placeto")(
        observation_space(BOUNDS),
        spaces.Discrete(BOUNDS.max_devices),
        ConstantSchedule(3e-4),
        net_kwargs={"hidden": 16, "keep_prob": 0.95},
    )
    obs = _obs(current=1, batch=64)  # unit 1 sits on device 1
    with torch.no_grad():
        free, _, _ = pol(obs)
        mask = np.tile(np.array([[True, False, True, False]]), (64, 1))
        masked, _, log_prob = pol(obs, action_masks=mask)
    assert (free.numpy() == 1).mean() > 0.8  # keeps device 1 mostly when allowed
    assert set(masked.numpy().tolist()) <= {0, 2}
    assert torch.isfinite(log_prob).all()


# --------------------------------------------------------------------------- export
def _chain(n: int = 6) -> CompGraph:
    return CompGraph.build(
        n, [(i, i + 1) for i in range(n - 1)], flops=1e9, out_bytes=1e6, meta={"name": "c6"}
    )


def test_export_load_round_trip_keeps_the_keep_logit(tmp_path: Path):
    init = np.array([0, 0, 1, 1, 2, 3], dtype=np.int64)
    model = make_ppo(
        "placement_env/Sweep-v0",
        "placeto",
        env_kwargs={"generator": fixed(_chain(), load("cpu_4")), "init": init},
        n_steps=12,
        net_kwargs={"hidden": 16, "keep_prob": 0.9},
        seed=1,
    )
    model.learn(24)
    path = export_policy(model, tmp_path / "keep.pt")
    loaded = load_policy(path)
    assert loaded.net.keep_prob == 0.9
    k_trained = model.policy.net.scorer.keep_logit
    assert loaded.net.scorer.keep_logit is not None and k_trained is not None
    assert loaded.net.scorer.keep_logit.item() == k_trained.item()
    obs = model.get_env().reset()
    with torch.no_grad():
        obs_t, _ = model.policy.obs_to_tensor(obs)
        sb3_logits, _ = model.policy.logits_and_value(obs_t)
    torch.testing.assert_close(loaded.logits(obs), sb3_logits)
    # planning from the warm start with the exported policy stays valid
    plan = loaded.plan(_chain(), load("cpu_4"), samples=2)
    assert plan.placement.shape == (6,) and plan.meta["step_time"] > 0


def test_files_without_keep_prob_still_load(tmp_path: Path):
    """Policies exported before the keep logit existed (no ``keep_prob`` in config) load."""
    model = make_ppo(
        "placement_env/Sweep-v0",
        "placeto",
        env_kwargs={"generator": fixed(_chain(), load("cpu_4"))},
        n_steps=8,
        net_kwargs={"hidden": 16},
        seed=0,
    )
    path = export_policy(model, tmp_path / "old.pt")
    d = torch.load(path, weights_only=True)
    del d["config"]["keep_prob"]
    torch.save(d, path)
    loaded = load_policy(path)
    assert loaded.net.keep_prob is None and loaded.net.scorer.keep_logit is None
