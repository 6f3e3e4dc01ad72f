"""Tests of the learned-policy networks and their SB3 policies on tiny hand-made graphs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3.common.utils import ConstantSchedule

from agents import policies
from agents.policies import (
    MASK_LOGIT,
    BiSAGEConv,
    DenseGraph,
    GDPEnsemble,
    GDPNet,
    PlacetoNet,
    dense_from_obs,
    to_pyg,
)
from agents.policies.sb3 import action_mode, scores_to_logits
from graphs.clusters import load
from graphs.compgraph import CompGraph
from placement_env.encoding import observation_space, prepare
from placement_env.types import Bounds, EpisodeState, Instance

BOUNDS = Bounds(max_nodes=6, max_edges=5, max_devices=4)


def _graph4() -> CompGraph:
    return CompGraph.build(
        4,
        [(0, 1), (1, 2), (1, 3)],
        flops=[1e9, 2e9, 3e9, 1e9],
        out_bytes=1e6,
        param_bytes=[1e6, 0, 2e6, 0],
    )


def _obs(
    placement=(0, -1, 1, -1), current: int = 1, batch: int = 1, cluster: str = "cpu_2"
) -> dict[str, torch.Tensor]:
    """Observation of the 4-node graph on ``cluster``, padded to BOUNDS (6 units, 4 devices)."""
    enc = prepare(Instance(_graph4(), load(cluster)), BOUNDS, lower_bound=1e-3)
    state = EpisodeState(
        placement=np.asarray(placement, dtype=np.int64),
        visited=np.zeros(4, dtype=bool),
        current=current,
    )
    o = enc.encode(state)
    return {k: torch.as_tensor(v).unsqueeze(0).repeat(batch, 1) for k, v in o.items()}


def _set(lin: torch.nn.Linear, w: float, b: float | None = None) -> None:
    with torch.no_grad():
        lin.weight.fill_(w)
        if lin.bias is not None:
            lin.bias.fill_(0.0 if b is None else b)


# --------------------------------------------------------------------------- layers
def test_bisage_aggregates_parents_and_children_separately():
    # 0 -> 2 <- 1 ; x = [1, 2, 4]; W_root = 1, W_fwd = 1, W_bwd = 10
    conv = BiSAGEConv(1, 1)
    _set(conv.lin_root, 1.0)
    _set(conv.lin_fwd, 1.0)
    _set(conv.lin_bwd, 10.0)
    x = torch.tensor([[1.0], [2.0], [4.0]])
    ei = torch.tensor([[0, 1], [2, 2]])
    out = conv(x, ei).squeeze(-1)
    # node 0: 1 + 10 * 4 ; node 1: 2 + 10 * 4 ; node 2: 4 + mean(1, 2)
    assert out.tolist() == pytest.approx([41.0, 42.0, 5.5])


def test_bisage_edge_features_enter_the_messages():
    conv = BiSAGEConv(1, 1, edge_dim=1)
    _set(conv.lin_root, 1.0)
    _set(conv.lin_fwd, 1.0)
    _set(conv.lin_bwd, 0.0)
    _set(conv.lin_edge_fwd, 1.0)
    _set(conv.lin_edge_bwd, 0.0)
    x = torch.tensor([[1.0], [2.0], [4.0]])
    ei = torch.tensor([[0, 1], [2, 2]])
    out = conv(x, ei, torch.tensor([[10.0], [20.0]])).squeeze(-1)
    assert out.tolist() == pytest.approx([1.0, 2.0, 4.0 + (11.0 + 22.0) / 2])
    with pytest.raises(ValueError, match="edge_dim=1"):
        conv(x, ei)
    assert repr(conv) == "BiSAGEConv(1, 1, edge_dim=1, aggr=mean)"


def test_bisage_writes_no_module_into_the_temporary_folder(tmp_path):
    """PyG rendered its TorchScript template of ``propagate`` for the class into a file
    ``agents.policies.sage_BiSAGEConv_propagate_*.py`` in the temporary folder, in every
    process, and never removed it (70 such files in /tmp, 2 Dec 2026)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import torch\n"
        "from agents.policies.sage import BiSAGEConv\n"
        "c = BiSAGEConv(2, 3, edge_dim=1)\n"
        "y = c(torch.ones(3, 2), torch.tensor([[0, 1], [2, 2]]), torch.ones(2, 1))\n"
        "assert y.shape == (3, 3)\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(root)}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert [f.name for f in tmp_path.iterdir() if "BiSAGEConv" in f.name] == []


def test_to_pyg_offsets_samples_and_drops_padded_edges():
    B, N = 2, 3
    g = DenseGraph(
        x=torch.arange(B * N * 1, dtype=torch.float).view(B, N, 1),
        node_mask=torch.ones(B, N, dtype=torch.bool),
        edge_index=torch.tensor([[[0, 1], [1, 2]], [[2, 0], [0, 0]]]),
        edge_attr=torch.tensor([[[1.0], [2.0]], [[3.0], [4.0]]]),
        edge_mask=torch.tensor([[True, True], [True, False]]),
        dev_x=torch.zeros(B, 2, 1),
        dev_mask=torch.ones(B, 2, dtype=torch.bool),
        dev_link=torch.zeros(B, 2, 2, 1),
        assign=torch.zeros(B, N, 2),
        current=torch.zeros(B, N),
    )
    x, ei, ea, batch = to_pyg(g)
    assert x.shape == (6, 1)
    assert ei.tolist() == [[0, 1, 5], [1, 2, 3]]
    assert ea.squeeze(-1).tolist() == [1.0, 2.0, 3.0]
    assert batch.tolist() == [0, 0, 0, 1, 1, 1]


def test_dense_from_obs_one_hot_placement_and_current():
    g = dense_from_obs(_obs(placement=(0, -1, 1, -1), current=2))
    assert g.x.shape[:2] == (1, 6) and g.dev_x.shape[:2] == (1, 4)
    assert g.node_mask[0].tolist() == [True] * 4 + [False] * 2
    assert g.dev_mask[0].tolist() == [True, True, False, False]
    assert g.assign[0, :4].tolist() == [[1, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]]
    assert g.current[0].tolist() == [0, 0, 1, 0, 0, 0]
    assert g.edge_mask[0].tolist() == [True, True, True, False, False]


def test_scores_to_logits_reads_the_current_row_or_everything():
    scores = torch.arange(2 * 3 * 2, dtype=torch.float).view(2, 3, 2)
    cur = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    g = DenseGraph(*([None] * 9), current=cur)  # type: ignore[arg-type]
    assert scores_to_logits(scores, g, "current_row").tolist() == [[4, 5], [8, 9]]
    assert scores_to_logits(scores, g, "flat").shape == (2, 6)
    with pytest.raises(ValueError, match="unknown action mode"):
        scores_to_logits(scores, g, "nope")


def test_action_mode_matches_the_env_action_spaces():
    assert action_mode(spaces.Discrete(4), 6, 4) == "current_row"
    assert action_mode(spaces.Discrete(24), 6, 4) == "flat"
    assert action_mode(spaces.MultiDiscrete([4] * 6), 6, 4) == "per_node"
    with pytest.raises(ValueError, match="Discrete\\(4\\)"):
        action_mode(spaces.Box(0, 1, (3,)), 6, 4)


def test_registry_lists_valid_names():
    assert policies.names() == ["gdp", "placeto"]
    assert policies.get("gdp") is policies.GdpPolicy
    with pytest.raises(ValueError, match=r"available: \['gdp', 'placeto'\]"):
        policies.get("plaecto")
    with pytest.raises(ValueError, match="available"):
        policies.network_class("gnn")


# --------------------------------------------------------------------------- networks
def _pad(g: DenseGraph, extra_n: int, extra_e: int, extra_d: int) -> DenseGraph:
    """The same problems with more padding slots, filled with garbage that must be ignored."""

    def grow(t: torch.Tensor, dim: int, k: int, fill: float) -> torch.Tensor:
        shape = list(t.shape)
        shape[dim] = k
        return torch.cat([t, torch.full(shape, fill, dtype=t.dtype)], dim=dim)

    return DenseGraph(
        x=grow(g.x, 1, extra_n, 7.0),
        node_mask=grow(g.node_mask, 1, extra_n, False),
        edge_index=grow(g.edge_index, 2, extra_e, 1),
        edge_attr=grow(g.edge_attr, 1, extra_e, 3.0),
        edge_mask=grow(g.edge_mask, 1, extra_e, False),
        dev_x=grow(g.dev_x, 1, extra_d, 5.0),
        dev_mask=grow(g.dev_mask, 1, extra_d, False),
        dev_link=grow(grow(g.dev_link, 1, extra_d, 2.0), 2, extra_d, 2.0),
        assign=grow(grow(g.assign, 1, extra_n, 0.0), 2, extra_d, 0.0),
        current=grow(g.current, 1, extra_n, 0.0),
    )


def _net(name: str, g: DenseGraph, **kwargs: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    cls = {"placeto": PlacetoNet, "gdp": GDPNet}[name]
    return cls(
        node_dim=g.x.shape[-1],
        edge_dim=g.edge_attr.shape[-1],
        dev_dim=g.dev_x.shape[-1],
        link_dim=g.dev_link.shape[-1],
        hidden=32,
        **kwargs,
    ).eval()


@pytest.mark.parametrize("name", ["placeto", "gdp"])
def test_network_scores_ignore_padding(name):
    """Padding slots (nodes, edges, devices) change nothing: one net fits any cluster size."""
    g = dense_from_obs(_obs())
    net = _net(name, g)
    with torch.no_grad():
        s, v = net(g)
        s2, v2 = net(_pad(g, 3, 4, 5))
    assert s.shape == (1, 6, 4) and s2.shape == (1, 9, 9)
    torch.testing.assert_close(s2[:, :4, :2], s[:, :4, :2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v2, v, rtol=1e-5, atol=1e-5)
    # padded devices and padded nodes get the mask logit
    assert (s[:, :, 2:] == MASK_LOGIT).all() and (s[:, 4:, :] == MASK_LOGIT).all()
    assert (s[:, :4, :2] > MASK_LOGIT / 2).all()


@pytest.mark.parametrize("name", ["placeto", "gdp"])
def test_network_depends_on_placement_and_structure(name):
    net = _net(name, dense_from_obs(_obs()))
    with torch.no_grad():
        s_a, _ = net(dense_from_obs(_obs(placement=(0, -1, 1, -1))))
        s_b, _ = net(dense_from_obs(_obs(placement=(1, -1, 1, -1))))
    assert not torch.allclose(s_a[:, :4, :2], s_b[:, :4, :2])


@pytest.mark.parametrize("name", ["placeto", "gdp"])
def test_network_gradients_reach_every_parameter(name):
    g = dense_from_obs(_obs(batch=2))
    # 4 real devices with distinct links, so the link weights matter (2 devices: each has
    # one neighbour, whose normalised weight is always 1)
    g.dev_mask = torch.ones_like(g.dev_mask)
    g.dev_link = torch.rand(g.dev_link.shape, generator=torch.Generator().manual_seed(0))
    net = _net(name, g).train()
    s, v = net(g)
    (s[:, :4, :2].logsumexp(-1).sum() + v.sum()).backward()
    missing = [n for n, p in net.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert missing == []


def test_network_repr_and_config_round_trip():
    g = dense_from_obs(_obs())
    net = _net("gdp", g)
    assert repr(net).startswith("GDPNet(node_dim=")
    clone = GDPNet(**net.config())
    clone.load_state_dict(net.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(clone.eval()(g)[0], net(g)[0])
    with pytest.raises(ValueError, match="divisible by heads"):
        GDPNet(1, 1, 1, 1, hidden=30, heads=4)


def test_ensemble_is_the_normalised_geometric_mean_of_its_members():
    """GDPEnsemble's softmax per node = prod_m p_m^(1/M), renormalised; padding stays masked."""
    g = dense_from_obs(_obs())
    nets = [_net("gdp", g) for _ in range(3)]
    for k, n in enumerate(nets):  # three different members
        torch.manual_seed(k + 1)
        n.reset_parameters()
    ens = GDPEnsemble.of(nets).eval()
    assert ens.config()["members"] == 3 and repr(ens).startswith("GDPEnsemble(3 x GDPNet(")
    with torch.no_grad():
        s, v = ens(g)
        outs = [n(g) for n in nets]
    p = torch.stack([o[0][:, :4, :2].softmax(-1) for o in outs])  # 4 real nodes, 2 devices
    geo = p.prod(0) ** (1 / 3)
    torch.testing.assert_close(s[:, :4, :2].softmax(-1), geo / geo.sum(-1, keepdim=True))
    torch.testing.assert_close(v, torch.stack([o[1] for o in outs]).mean(0))
    assert (s[:, :, 2:] == MASK_LOGIT).all() and (s[:, 4:, :] == MASK_LOGIT).all()
    # one member: the same per-node distribution as the member itself
    one = GDPEnsemble.of(nets[:1]).eval()
    with torch.no_grad():
        torch.testing.assert_close(
            one(g)[0][:, :4, :2].softmax(-1), outs[0][0][:, :4, :2].softmax(-1)
        )
    # rebuilt from its config and weights, it computes the same
    clone = GDPEnsemble(**ens.config())
    clone.load_state_dict(ens.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(clone.eval()(g)[0], s)
    with pytest.raises(ValueError, match="members=0"):
        GDPEnsemble(1, 1, 1, 1, members=0)
    with pytest.raises(ValueError, match="network 1 is a PlacetoNet"):
        GDPEnsemble.of([nets[0], _net("placeto", g)])


# --------------------------------------------------------------------------- SB3 policies
ACTION_SPACES = {
    "sweep": spaces.Discrete(BOUNDS.max_devices),
    "reassign": spaces.Discrete(BOUNDS.max_nodes * BOUNDS.max_devices),
    "oneshot": spaces.MultiDiscrete([BOUNDS.max_devices] * BOUNDS.max_nodes),
}
_POLICY_CACHE: dict[tuple[str, str], policies.GraphActorCriticPolicy] = {}


def _policy(name: str, kind: str) -> policies.GraphActorCriticPolicy:
    key = (name, kind)
    if key not in _POLICY_CACHE:
        torch.manual_seed(0)
        _POLICY_CACHE[key] = policies.get(name)(
            observation_space(BOUNDS),
            ACTION_SPACES[kind],
            ConstantSchedule(3e-4),
            net_kwargs={"hidden": 16},
        )
    return _POLICY_CACHE[key]


@pytest.mark.parametrize("kind", list(ACTION_SPACES))
@pytest.mark.parametrize("name", ["placeto", "gdp"])
def test_policy_forward_shapes_and_unmasked_padding(name, kind):
    pol = _policy(name, kind)
    obs = _obs(batch=32)
    with torch.no_grad():
        actions, values, log_prob = pol(obs)
        values2, log_prob2, entropy = pol.evaluate_actions(obs, actions)
    space = ACTION_SPACES[kind]
    assert actions.shape == (32, *space.shape)
    assert values.shape == (32, 1) and log_prob.shape == (32,)
    torch.testing.assert_close(log_prob2, log_prob)
    assert entropy is not None and (entropy >= 0).all()
    a = actions.numpy()
    if kind == "sweep":  # only the 2 real devices
        assert set(a.tolist()) <= {0, 1}
    elif kind == "reassign":  # real units 0..3 and real devices 0..1 only
        assert ((a // 4 < 4) & (a % 4 < 2)).all()
    else:  # real units choose real devices
        assert (a[:, :4] < 2).all()


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_policy_never_chooses_masked_actions(data):
    name = data.draw(st.sampled_from(["placeto", "gdp"]))
    kind = data.draw(st.sampled_from(list(ACTION_SPACES)))
    pol = _policy(name, kind)
    space = ACTION_SPACES[kind]
    if kind == "oneshot":
        rows = [
            data.draw(st.lists(st.booleans(), min_size=4, max_size=4).filter(any))
            for _ in range(BOUNDS.max_nodes)
        ]
        mask = np.array(rows, dtype=bool).reshape(1, -1)
    else:
        mask = np.array(
            [
                data.draw(
                    st.lists(st.booleans(), min_size=int(space.n), max_size=int(space.n)).filter(
                        any
                    )
                )
            ]
        )
    obs = _obs(batch=8)
    masks = np.repeat(mask, 8, axis=0)
    with torch.no_grad():
        actions, _, log_prob = pol(obs, action_masks=masks)
        greedy, _ = pol.predict(
            {k: v.numpy() for k, v in obs.items()}, action_masks=masks, deterministic=True
        )
    assert torch.isfinite(log_prob).all()
    for acts in (actions.numpy(), np.asarray(greedy)):
        if kind == "oneshot":
            rows_ok = mask.reshape(BOUNDS.max_nodes, 4)
            assert all(rows_ok[i, acts[:, i]].all() for i in range(BOUNDS.max_nodes))
        else:
            assert mask[0, acts.reshape(-1)].all()


def test_device_position_spans_the_real_devices():
    from agents.policies.device_head import device_position

    m = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]).bool()
    torch.testing.assert_close(
        device_position(m),
        torch.tensor([[0, 0.5, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0.25, 0.5, 0.75, 1]]),
    )
