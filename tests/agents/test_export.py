"""Tests of policy export/import and zero-shot planning on other cluster sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sb3_contrib.common.maskable.utils import get_action_masks

import placement_env  # noqa: F401  (registers the env ids)
from agents import ExportedPolicy, export_policy, load_policy
from agents.baselines import InfeasiblePlanError
from agents.ppo import make_ppo
from graphs.clusters import load
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from placement_env.generators import fixed
from placement_env.oracles.simulator import Simulator


def _chain(n: int = 6, param_bytes: float = 1e6) -> CompGraph:
    return CompGraph.build(
        n,
        [(i, i + 1) for i in range(n - 1)],
        flops=1e9,
        out_bytes=1e6,
        param_bytes=param_bytes,
        meta={"name": f"chain{n}"},
    )


_MODELS: dict[tuple[str, str], object] = {}


def _trained(env_id: str, policy: str):
    """A policy trained (tiny budget) on 8 devices."""
    key = (env_id, policy)
    if key not in _MODELS:
        model = make_ppo(
            env_id,
            policy,
            env_kwargs={"generator": fixed(_chain(), load("cpu_8"))},
            n_steps=16,
            net_kwargs={"hidden": 16},
            seed=3,
        )
        model.learn(32)
        _MODELS[key] = model
    return _MODELS[key]


CASES = [("placement_env/Sweep-v0", "placeto"), ("placement_env/OneShot-v0", "gdp")]


@pytest.mark.parametrize("env_id,policy", CASES)
def test_export_load_gives_identical_logits_and_actions(tmp_path: Path, env_id, policy):
    model = _trained(env_id, policy)
    path = export_policy(model, tmp_path / "p.pt", meta={"trained_on": "chain6/cpu_8"})
    loaded = load_policy(path)
    assert isinstance(loaded, ExportedPolicy)
    assert loaded.network == policy and loaded.env_id == env_id
    assert loaded.meta == {"trained_on": "chain6/cpu_8"}
    venv = model.get_env()
    obs = venv.reset()
    masks = get_action_masks(venv)
    with torch.no_grad():
        obs_t, _ = model.policy.obs_to_tensor(obs)
        sb3_logits, _ = model.policy.logits_and_value(obs_t)
    torch.testing.assert_close(loaded.logits(obs), sb3_logits)
    for m in (None, masks):
        expected, _ = model.predict(obs, action_masks=m, deterministic=True)
        np.testing.assert_array_equal(loaded.predict(obs, m), expected)


def test_export_file_is_plain_data(tmp_path: Path):
    path = export_policy(_trained(*CASES[0]), tmp_path / "p.pt")
    d = torch.load(path, weights_only=True)  # refuses pickled code
    assert d["format"] == "devplace.policy" and d["version"] == 1
    assert d["network"] == "placeto" and d["mode"] == "current_row"
    assert d["config"]["hidden"] == 16 and isinstance(d["config"]["node_dim"], int)
    assert d["env_options"]["init"] == "random"
    assert all(isinstance(v, torch.Tensor) for v in d["state_dict"].values())
    assert d["features"]["device"][0] == "speed_rel"


@pytest.mark.parametrize("env_id,policy", CASES)
@pytest.mark.parametrize("n_devices", [4, 16])
def test_policy_trained_on_8_devices_plans_4_and_16(tmp_path: Path, env_id, policy, n_devices):
    loaded = load_policy(export_policy(_trained(env_id, policy), tmp_path / "p.pt"))
    graph, cluster = _chain(), load(f"cpu_{n_devices}")
    plan = loaded.plan(graph, cluster, samples=2)
    assert isinstance(plan, Plan)
    plan.check(graph, cluster)
    assert plan.placement.max() < n_devices
    assert plan.microbatches == 8 and plan.schedule == "1f1b"
    res = Simulator(graph, cluster, microbatches=8, schedule="1f1b").evaluate(plan.placement)
    assert not res.oom and res.step_time == pytest.approx(plan.meta["step_time"])
    assert plan.meta["oracle_calls"] >= 1 and plan.meta["algorithm"] == f"ppo-{policy}"


def test_best_of_k_never_worse_than_greedy(tmp_path: Path):
    loaded = load_policy(export_policy(_trained(*CASES[1]), tmp_path / "p.pt"))
    graph, cluster = _chain(), load("cpu_4")
    greedy = loaded.plan(graph, cluster, samples=1, seed=5)
    best = loaded.plan(graph, cluster, samples=6, seed=5)
    assert best.meta["step_time"] <= greedy.meta["step_time"]
    assert best.meta["oracle_calls"] >= greedy.meta["oracle_calls"]


def test_plan_reports_infeasible_instead_of_returning_an_oom_plan(tmp_path: Path):
    loaded = load_policy(export_policy(_trained(*CASES[1]), tmp_path / "p.pt"))
    huge = _chain(param_bytes=64 * 2**30)  # 64 GiB per node; cpu devices hold 4 GiB
    with pytest.raises(InfeasiblePlanError, match="no memory-feasible placement"):
        loaded.plan(huge, load("cpu_4"))
    with pytest.raises(ValueError, match="samples must be an integer >= 1"):
        loaded.plan(_chain(), load("cpu_4"), samples=0)


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"samples": 2.5}, "samples must be an integer >= 1, got 2.5"),  # was a TypeError
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),  # was gymnasium's Error
        ({"greedy": "yes"}, "greedy must be True or False"),  # was taken as True
        # found by fuzzing: a bare float() error; "2" was taken as 2.0
        ({"penalty": "abc"}, "penalty must be a number >= 0 or a list of them, got 'abc'"),
        ({"penalty": "2"}, "penalty must be a number >= 0"),
        ({"penalty": [1, -2]}, "penalty must be a number >= 0"),
        ({"link_exponent": "x"}, "link_exponent must be a number >= 0, got 'x'"),
    ],
)
def test_plan_names_a_bad_argument(kw: dict, says: str) -> None:
    pol = load_policy("generalist")
    with pytest.raises(ValueError, match=says):
        pol.plan(_chain(), load("cpu_4"), samples=kw.pop("samples", 2), **kw)


def test_plan_refuses_an_oracle_of_another_problem() -> None:
    """An oracle built for another cluster or graph is named as such (it failed on an array
    shape, "node_times has shape (50, 2), expected (50, 4)"); one of an equal problem is fine."""
    from placement_env.oracles.simulator import Simulator

    pol, g, c = load_policy("generalist"), _chain(), load("cpu_4")
    with pytest.raises(ValueError, match=r"oracle is for cluster 'cpu_2' \(2 devices\)"):
        pol.plan(g, c, samples=2, oracle=Simulator(g, load("cpu_2")))
    other = _chain(param_bytes=2**20)
    with pytest.raises(ValueError, match="oracle is for graph"):
        pol.plan(g, c, samples=2, oracle=Simulator(other, c))
    same = pol.plan(g, c, samples=2, oracle=Simulator(_chain(), load("cpu_4")))
    assert same.meta["oracle_calls"] >= 1


def test_load_policy_rejects_foreign_or_stale_files(tmp_path: Path):
    bad = tmp_path / "bad.pt"
    torch.save({"format": "something-else"}, bad)
    with pytest.raises(ValueError, match="not a devplace policy"):
        load_policy(bad)
    path = export_policy(_trained(*CASES[0]), tmp_path / "p.pt")
    d = torch.load(path, weights_only=True)
    d["features"]["node"] = d["features"]["node"][:-1]
    torch.save(d, bad)
    with pytest.raises(ValueError, match="trained on node features"):
        load_policy(bad)
    # widths that the features do not give: it loaded, then planning raised torch's "mat1
    # and mat2 shapes cannot be multiplied" (found by fuzzing, 29 Nov 2026)
    from agents.policies import network_class

    d = torch.load(path, weights_only=True)
    want = d["config"]["node_dim"]
    d["config"] = dict(d["config"], node_dim=want + 1)
    d["state_dict"] = network_class(d["network"])(**d["config"]).state_dict()
    torch.save(d, bad)
    with pytest.raises(ValueError, match=rf"config.node_dim' is {want + 1}; the features it was "
                       rf"trained on give {want} inputs"):  # fmt: skip
        load_policy(bad)
    d["version"] = 99
    torch.save(d, bad)
    with pytest.raises(ValueError, match="version 99"):
        load_policy(bad)
    (tmp_path / "junk.pt").write_text("not torch")
    with pytest.raises(ValueError, match="not a loadable policy file"):
        load_policy(tmp_path / "junk.pt")
    with pytest.raises(TypeError, match="GraphActorCriticPolicy"):
        export_policy(object(), tmp_path / "x.pt")
    # a run folder and an empty policy= said "(no such file)", the latter of "." (fuzzing)
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ValueError, match=r"run is a folder; .*\(it holds no .pt file\)"):
        load_policy(run)
    (run / "policy.pt").write_bytes(b"")
    with pytest.raises(
        ValueError, match=r"run is a folder; policy= takes a policy file: .*policy.pt\?"
    ):
        load_policy(run)
    with pytest.raises(ValueError, match="policy is empty; expected a shipped policy name"):
        load_policy("")


@pytest.mark.parametrize("value", [None, 0, 1.5, b"generalist"])
def test_load_policy_refuses_a_value_that_is_no_name_or_path(value):
    """``load_policy(None)`` said only "expected str, bytes or os.PathLike object"; the
    refusal now names the argument, the value and what it should be."""
    with pytest.raises(TypeError, match=r"policy is .*a shipped policy name or a file path"):
        load_policy(value)


@pytest.mark.parametrize("env_id,policy", CASES)
def test_plans_keep_colocation_groups_together(tmp_path: Path, env_id, policy):
    # forward ops 0-2 with their backward ops 3-5: node i and i + 3 share a group
    g = CompGraph.build(
        6,
        [(0, 1), (1, 2), (2, 5), (5, 4), (4, 3)],
        flops=1e9,
        out_bytes=1e6,
        param_bytes=[1e6, 1e6, 1e6, 0, 0, 0],
        kind=["fwd"] * 3 + ["bwd"] * 3,
        group=[0, 1, 2, 0, 1, 2],
        meta={"name": "fwd_bwd3"},
    )
    loaded = load_policy(export_policy(_trained(env_id, policy), tmp_path / "p.pt"))
    plan = loaded.plan(g, load("cpu_4"), samples=3)
    assert plan.colocation_violations(g) == []
    assert (plan.placement[:3] == plan.placement[3:]).all()


def test_warm_started_policy_exports_no_instance_state_and_plans_other_graphs(tmp_path: Path):
    """A policy trained from a per-node warm start plans graphs of other sizes and clusters."""
    graph, cluster = _chain(6), load("cpu_4")
    start = np.array([0, 0, 1, 1, 2, 3], dtype=np.int64)
    model = make_ppo(
        "placement_env/Sweep-v0",
        "placeto",
        env_kwargs={
            "generator": fixed(graph, cluster),
            "init": start,
            "accept": "improve",
            "restart": "best",
        },
        n_steps=8,
        net_kwargs={"hidden": 16},
        seed=1,
    )
    model.learn(16)
    path = export_policy(model, tmp_path / "warm.pt")
    d = torch.load(path, weights_only=True)
    assert d["env_options"]["init"] == "balanced"  # the name, never the training placement
    assert d["env_options"]["accept"] == "improve" and d["env_options"]["restart"] == "best"
    policy = load_policy(path)
    assert policy.proposes_moves
    # the greedy episode proposes a move for every unit (not "keep" everywhere): each
    # proposal is scored, and the plan is never worse than the balanced start
    g, cl = _chain(9), load("cpu_2")
    sim = Simulator(g, cl, microbatches=2)
    greedy = policy.plan(g, cl, microbatches=2, samples=1, oracle=sim)
    assert greedy.meta["oracle_calls"] >= g.num_nodes
    start = policy.make_env(g, cl, Simulator(g, cl, microbatches=2)).reset(seed=0)[1]
    assert greedy.meta["step_time"] <= start["step_time"]
    for n, cl in ((9, "cpu_2"), (4, "cpu_8"), (13, "cpu_3")):
        g = _chain(n)
        plan = policy.plan(g, load(cl), microbatches=2, samples=2, seed=0)
        plan.check(g, load(cl))
        assert plan.placement.shape == (n,)
        assert plan.meta["samples"] == 2 and plan.meta["oracle_calls"] >= 1


def test_files_from_before_the_fix_lose_their_instance_placement(tmp_path: Path):
    path = export_policy(_trained(*CASES[0]), tmp_path / "old.pt")
    d = torch.load(path, weights_only=True)
    d["env_options"]["init"] = [0, 1, 0, 1, 0, 1]  # what older exports stored
    torch.save(d, path)
    policy = load_policy(path)
    assert policy.env_options["init"] == "balanced"
    plan = policy.plan(_chain(9), load("cpu_2"), microbatches=2)
    assert plan.placement.shape == (9,)


def test_overflowing_scores_are_a_clear_error(tmp_path: Path):
    """Finite weights scaled by 1e30 load, but their scores overflow: planning said torch's
    "probability tensor contains either inf, nan or element < 0"; now a ValueError saying so."""
    path = export_policy(_trained(*CASES[0]), tmp_path / "p.pt")
    d = torch.load(path, weights_only=True)
    d["state_dict"] = {
        k: v * 1e30 if v.is_floating_point() else v for k, v in d["state_dict"].items()
    }
    torch.save(d, tmp_path / "big.pt")
    policy = load_policy(tmp_path / "big.pt")
    with pytest.raises(ValueError, match="scores on this instance are not finite"):
        policy.plan(_chain(), load("cpu_4"), greedy=False, samples=2, oracle=None, seed=0)
    # greedy with one sample (the default) took the argmax of the overflowed scores and
    # returned a plan (fuzzing, 2 Dec 2026)
    with pytest.raises(ValueError, match="scores on this instance are not finite"):
        policy.plan(_chain(), load("cpu_4"), oracle=None, seed=0)
