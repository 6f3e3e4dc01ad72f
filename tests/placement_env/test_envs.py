"""Tests of the placement environments: API checkers, determinism, hand-computed rewards, masks."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import placement_env
from graphs.cluster import Cluster, Device, Link
from graphs.compgraph import CompGraph
from placement_env.envs.base import SimulatorFactory, balanced_boundaries
from placement_env.generators import InstanceList, Mixture, fixed
from placement_env.oracles.base import SimResult
from placement_env.types import Instance


# ----------------------------------------------------------------------------- fixtures
class ToyOracle:
    """Test-only oracle with hand-computable numbers (seconds):

    step_time = max_d(flops on d) / 1e9 + (bytes of edges whose ends differ) / 1e9;
    lower_bound = total flops / 1e9 / D; peak memory = param bytes per device.
    """

    def __init__(self, graph: CompGraph, cluster: Cluster) -> None:
        self.graph, self.cluster, self.calls = graph, cluster, 0

    def lower_bound(self) -> float:
        return float(self.graph.flops.sum()) / 1e9 / self.cluster.num_devices

    def evaluate(self, placement, *, record: bool = False) -> SimResult:
        p = np.asarray(getattr(placement, "placement", placement), dtype=np.int64)
        self.calls += 1
        g, D = self.graph, self.cluster.num_devices
        load = np.bincount(p, g.flops, D) / 1e9
        cut = p[g.src] != p[g.dst]
        t = float(load.max() + (g.edge_bytes * cut).sum() / 1e9)
        mem = np.bincount(p, g.param_bytes, D)
        oom = bool((mem > self.cluster.memory).any())
        return SimResult(t, self.lower_bound(), oom, load, mem, np.zeros(len(self.cluster.links)))


def make_cluster(D: int, memory: float | list[float] = 1e12, speed: float = 1e12) -> Cluster:
    mem = memory if isinstance(memory, list) else [memory] * D
    devs = tuple(Device(f"d{i}", "gpu", speed, 1e12, mem[i]) for i in range(D))
    links = tuple(Link(a, b, 1e10, 1e-6) for a in range(D) for b in range(D) if a != b)
    return Cluster(f"toy{D}", devs, links)


def chain3() -> CompGraph:
    """a -> b -> c, flops 2e9, 1e9, 1e9; every edge 1e9 bytes; a holds 10 bytes of state."""
    return CompGraph.build(
        3,
        [(0, 1), (1, 2)],
        flops=[2e9, 1e9, 1e9],
        out_bytes=1e9,
        param_bytes=[10.0, 0.0, 0.0],
        name=["a", "b", "c"],
        meta={"name": "chain3"},
    )


def training_graph(layers: int = 3, seed: int = 0) -> CompGraph:
    """A small fwd/bwd/opt chain with colocation groups (fwd i, bwd i, opt i share group i)."""
    rng = np.random.default_rng(seed)
    L = layers
    names = (
        [f"f{i}" for i in range(L)]
        + [f"bwd:f{i}" for i in range(L)]
        + [f"opt:f{i}" for i in range(L)]
    )
    edges = [(i, i + 1) for i in range(L - 1)]  # forward chain
    edges += [(L - 1, L + L - 1)]  # last fwd -> its bwd
    edges += [(L + i + 1, L + i) for i in range(L - 1)]  # backward chain, reversed
    edges += [(i, L + i) for i in range(L - 1)]  # saved activations
    edges += [(L + i, 2 * L + i) for i in range(L)]  # bwd -> opt
    return CompGraph.build(
        3 * L,
        edges,
        flops=np.concatenate([rng.uniform(1e9, 4e9, L), rng.uniform(2e9, 8e9, L), np.full(L, 1e7)]),
        bytes_accessed=1e8,
        out_bytes=np.concatenate([np.full(2 * L, 4e7), np.zeros(L)]),
        param_bytes=np.concatenate([rng.uniform(1e8, 5e8, L), np.zeros(2 * L)]),
        act_bytes=np.concatenate([np.full(L, 2e7), np.zeros(2 * L)]),
        kind=["fwd"] * L + ["bwd"] * L + ["opt"] * L,
        group=list(range(L)) * 3,
        name=names,
        meta={"name": f"train{L}", "batch": 8, "bytes_per_param": 16},
    )


def small_generator() -> Mixture:
    """Two graphs on clusters of 2 and 3 devices: exercises padding of units, edges, devices."""
    return Mixture(
        [
            InstanceList([Instance(training_graph(3, 0), make_cluster(2, 2e9), "t3")]),
            InstanceList([Instance(training_graph(5, 1), make_cluster(3, 1.5e9), "t5")]),
        ]
    )


def make(env_id: str, **kw):
    if env_id == "placement_env/Hybrid-v0":  # layered transformers only: its own small default
        return gym.make(env_id)
    kw.setdefault("generator", small_generator())
    kw.setdefault("oracle_factory", SimulatorFactory(microbatches=2, schedule="1f1b"))
    return gym.make(env_id, **kw)


# ----------------------------------------------------------------------------- checkers
@pytest.mark.parametrize("env_id", placement_env.ENV_IDS)
def test_env_checkers_pass_without_warnings(env_id: str) -> None:
    env = make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym_check_env(env.unwrapped)
        sb3_check_env(env.unwrapped)


def test_all_four_ids_registered() -> None:
    assert set(placement_env.ENV_IDS) <= set(gym.registry)
    assert gym.spec("placement_env/Reassign-v0").max_episode_steps == 256
    assert gym.spec("placement_env/Stage-v0").max_episode_steps == 128


@pytest.mark.parametrize("env_id", placement_env.ENV_IDS)
def test_seeded_rollouts_identical(env_id: str) -> None:
    def rollout(seed: int) -> list:
        env = make(env_id)
        env.action_space.seed(seed + 100)  # the env's own seed would replay its initial draws
        obs, info = env.reset(seed=seed)
        out = [obs, info["placement"]]
        for _ in range(30):
            obs, r, term, trunc, info = env.step(env.action_space.sample())
            out += [obs, r, info["placement"], info["step_time"]]
            if term or trunc:
                obs, info = env.reset()
                out += [obs, info["placement"]]
        return out

    a, b, c = rollout(3), rollout(3), rollout(4)

    def same(x, y) -> bool:
        if isinstance(x, dict):
            return all(np.array_equal(x[k], y[k]) for k in x)
        return bool(np.array_equal(x, y))

    assert all(same(x, y) for x, y in zip(a, b))
    assert not all(same(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("env_id", placement_env.ENV_IDS)
def test_random_run_10000_steps_finite(env_id: str) -> None:
    env = make(env_id, oracle_factory=ToyOracle)
    space = env.observation_space
    env.action_space.seed(1)
    obs, _ = env.reset(seed=0)
    episodes = 0
    for t in range(10_000):
        obs, r, term, trunc, info = env.step(env.action_space.sample())
        assert np.isfinite(r), (t, r)
        if t % 97 == 0:
            assert space.contains(obs)
        for k, v in obs.items():
            assert np.isfinite(v).all(), (t, k)
        if term or trunc:
            episodes += 1
            obs, _ = env.reset()
    assert episodes > 0


# ----------------------------------------------------------------------------- rewards
def _toy(env_id: str, **kw):
    cl = make_cluster(2, memory=[1e12, 5.0])
    return gym.make(env_id, generator=fixed(chain3(), cl), oracle_factory=ToyOracle, **kw).unwrapped


def test_sweep_rewards_by_hand() -> None:
    env = _toy("placement_env/Sweep-v0", init="zeros")
    obs, info = env.reset(seed=0)
    # all on d0: load 4 s, no cut -> 4 s; lower bound 4e9/1e9/2 = 2 s -> cost 2
    assert info["step_time"] == pytest.approx(4.0)
    assert info["lower_bound"] == pytest.approx(2.0)
    assert info["cost"] == pytest.approx(2.0)
    assert obs["current"][0] == 0
    # a (10 bytes of state) cannot go to d1 (5 bytes): masked
    assert env.action_masks().tolist() == [True, False]
    # a -> d1: loads (2, 2) + cut a->b 1 s = 3 s, but OOM: 10 / 5 - 1 = 1 overflow
    # cost = 3/2 + 1 * (1 + 1) = 3.5 -> reward 2 - 3.5 = -1.5
    obs, r, term, _, info = env.step(1)
    assert r == pytest.approx(-1.5) and info["oom"] and not term
    assert info["best_step_time"] == pytest.approx(4.0)  # OOM placements never count as best
    # b -> d1: loads (2, 2)... a on d1 too: d1 = a + b = 3, d0 = c = 1; cuts b->c: 3 + 1 = 4 s
    # cost 2 + 2 (still OOM) = 4 -> reward -0.5
    obs, r, term, _, info = env.step(1)
    assert r == pytest.approx(-0.5) and not term
    # c -> d1: everything on d1: 4 s, OOM: cost 4 -> reward 0; sweep over
    obs, r, term, _, info = env.step(1)
    assert r == pytest.approx(0.0) and term
    assert info["placement"].tolist() == [1, 1, 1]
    assert obs["current"][0] == -1
    with pytest.raises(RuntimeError):
        env.step(0)


def test_sweep_improvement_positive_and_telescopes() -> None:
    env = _toy("placement_env/Sweep-v0", init="zeros", oom_penalty=0.0)
    _, info0 = env.reset(seed=0)
    total = 0.0
    # a stays on d0, b -> d1 (loads 2, 1 ... c -> d1: loads (2, 2), cut a->b: 3 s, cost 1.5)
    for d, expect in ((0, 0.0), (1, 2.0 - 2.5), (1, 2.5 - 1.5)):
        _, r, _, _, info = env.step(d)
        assert r == pytest.approx(expect)
        total += r
    assert total == pytest.approx(info0["cost"] - info["cost"])
    assert info["step_time"] == pytest.approx(3.0) and info["best_step_time"] == pytest.approx(3.0)


def test_sweep_orders() -> None:
    env = _toy("placement_env/Sweep-v0", order="reverse")
    obs, _ = env.reset(seed=0)
    assert obs["current"][0] == 2
    env = _toy("placement_env/Sweep-v0", order="random")
    seen = []
    obs, _ = env.reset(seed=5)
    for _ in range(3):
        seen.append(int(obs["current"][0]))
        obs, *_ = env.step(0)
    assert sorted(seen) == [0, 1, 2]


def test_oneshot_reward_by_hand() -> None:
    env = _toy("placement_env/OneShot-v0")
    obs, info = env.reset(seed=0)
    assert (obs["placement"] == -1).all() and np.isnan(info["step_time"])
    # b, c on d1: loads (2, 2) + cut a->b: 3 s -> cost 1.5 -> reward -1.5
    obs, r, term, trunc, info = env.step(np.array([0, 1, 1]))
    assert r == pytest.approx(-1.5) and term and not trunc
    assert info["placement"].tolist() == [0, 1, 1] and info["oracle_calls"] == 1
    # masks: a's 10 bytes fit only d0
    assert env.action_masks().reshape(3, 2).tolist() == [[True, False], [True, True], [True, True]]
    env.reset()
    # a on d1 -> OOM: 3/2 + (1 + 1) = 3.5
    _, r, *_ = env.step(np.array([1, 0, 0]))
    assert r == pytest.approx(-3.5)


def test_reassign_reward_and_noops() -> None:
    env = _toy("placement_env/Reassign-v0", init="zeros", oom_penalty=0.0)
    env.reset(seed=0)
    Dm = env.bounds.max_devices
    # move c (unit 2) to d1: loads (3, 1) + cut b->c 1 = 4 s: cost 2 -> reward 0
    _, r, term, trunc, info = env.step(2 * Dm + 1)
    assert r == pytest.approx(0.0) and not term and not trunc
    # move b to d1: loads (2, 2) + cut a->b: 3 s -> +0.5
    _, r, *_, info = env.step(1 * Dm + 1)
    assert r == pytest.approx(0.5) and info["placement"].tolist() == [0, 1, 1]
    # moving a to its own device: no change, reward 0, no new oracle call (cached)
    calls = info["oracle_calls"]
    _, r, *_, info = env.step(0 * Dm + 0)
    assert r == 0.0 and info["oracle_calls"] == calls
    mask = env.action_masks().reshape(env.bounds.max_nodes, Dm)
    assert mask.tolist() == [[True, False], [True, True], [True, True]]


def test_reassign_time_limit() -> None:
    env = gym.make(
        "placement_env/Reassign-v0",
        generator=fixed(chain3(), make_cluster(2)),
        oracle_factory=ToyOracle,
        max_episode_steps=3,
    )
    env.reset(seed=0)
    flags = [env.step(0)[3] for _ in range(3)]
    assert flags == [False, False, True]


def test_stage_rewards_by_hand() -> None:
    env = _toy("placement_env/Stage-v0", init="balanced", oom_penalty=0.0)
    _, info = env.reset(seed=0)
    # balanced split of compute (2, 1, 1) into 2 stages: [a] [b c] on d0, d1: 2 + 1 = 3 s
    assert info["stage_starts"].tolist() == [0, 1] and info["stage_device"].tolist() == [0, 1]
    assert info["cost"] == pytest.approx(1.5)
    # move boundary 0 right: [a b] [c]: loads (3, 1) + cut b->c: 4 s -> cost 2, reward -0.5
    _, r, *_, info = env.step(1)
    assert r == pytest.approx(-0.5) and info["stage_starts"].tolist() == [0, 2]
    # moving it right again would empty stage 1: masked, and a no-op if taken
    assert not env.action_masks()[1]
    _, r, *_, info = env.step(1)
    assert r == 0.0 and info["invalid_action"]
    # put stage 0 on d1: swap -> [a b] on d1, [c] on d0: same times, reward 0
    n_moves = 2 * (env.bounds.max_devices - 1)
    _, r, *_, info = env.step(n_moves + 0 * env.bounds.max_devices + 1)
    assert r == pytest.approx(0.0) and info["stage_device"].tolist() == [1, 0]
    assert info["placement"].tolist() == [1, 1, 0]
    # move the boundary back left: [a] on d1, [b c] on d0: 3 s -> +0.5
    _, r, *_, info = env.step(0)
    assert r == pytest.approx(0.5)


def test_stage_memory_mask() -> None:
    env = _toy("placement_env/Stage-v0", init="balanced")
    env.reset(seed=0)
    n_moves = 2 * (env.bounds.max_devices - 1)
    mask = env.action_masks()
    # stage 0 = [a] (10 bytes) may not move onto d1 (5 bytes); re-seating on d0 is allowed
    assert mask[n_moves + 0] and not mask[n_moves + 1]
    # stage 1 = [b c] (0 bytes) may take d0 only by swapping a onto d1: masked too
    assert not mask[n_moves + 2 + 0] and mask[n_moves + 2 + 1]


# ----------------------------------------------------------------------------- bad actions
@pytest.mark.parametrize(
    "env_id,bad",
    [
        ("placement_env/Sweep-v0", 2),
        ("placement_env/Sweep-v0", -1),
        ("placement_env/Sweep-v0", np.array([0, 1])),
        ("placement_env/Sweep-v0", 0.5),
        ("placement_env/Reassign-v0", 6),
        ("placement_env/Stage-v0", 10),
        ("placement_env/OneShot-v0", np.array([0, 1])),
        ("placement_env/OneShot-v0", np.array([0, 1, 2])),
        ("placement_env/OneShot-v0", np.array([0.5, 1, 1])),
        ("placement_env/OneShot-v0", np.array([True, False, True])),  # devices 1, 0, 1 (fuzzing)
        ("placement_env/OneShot-v0", np.zeros(3, complex)),  # numpy's ufunc error (fuzzing)
        ("placement_env/OneShot-v0", np.array([0, 2**64 - 1, 0], np.uint64)),  # read as -1
    ],
)
def test_bad_action_raises_value_error(env_id: str, bad) -> None:
    env = _toy(env_id)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        env.step(bad)


def test_padding_device_wraps_and_is_flagged() -> None:
    env = gym.make(
        "placement_env/Sweep-v0",
        generator=fixed(chain3(), make_cluster(2)),
        oracle_factory=ToyOracle,
        max_devices=4,
        init="zeros",
    ).unwrapped
    obs, _ = env.reset(seed=0)
    assert obs["device_mask"].tolist() == [1, 1, 0, 0]
    assert env.action_masks().tolist() == [True, True, False, False]
    _, _, _, _, info = env.step(3)
    assert info["invalid_action"] and info["placement"][0] == 1


def test_instance_too_large_for_bounds() -> None:
    with pytest.raises(ValueError, match="colocation units"):
        env = gym.make(
            "placement_env/Sweep-v0",
            generator=fixed(chain3(), make_cluster(2)),
            oracle_factory=ToyOracle,
            max_nodes=2,
        )
        env.reset(seed=0)


# ----------------------------------------------------------------------------- vector envs
def test_async_vector_env() -> None:
    # gymnasium stacks info arrays across sub-envs, so their graphs need one node count here
    gen = InstanceList(
        [
            Instance(training_graph(3, 0), make_cluster(2, 2e9), "a"),
            Instance(training_graph(3, 1), make_cluster(3, 2e9), "b"),
        ]
    )
    fns = [
        (lambda: gym.make("placement_env/Sweep-v0", generator=gen, oracle_factory=ToyOracle))
        for _ in range(2)
    ]
    venv = gym.vector.AsyncVectorEnv(fns)
    try:
        obs, _ = venv.reset(seed=[1, 2])
        assert obs["node_feat"].shape[0] == 2
        for _ in range(12):
            obs, r, term, trunc, _ = venv.step(venv.action_space.sample())
            assert np.isfinite(r).all()
    finally:
        venv.close()


def test_sb3_subproc_vec_env() -> None:
    from stable_baselines3.common.vec_env import SubprocVecEnv

    gen = small_generator()
    fns = [
        (lambda: gym.make("placement_env/OneShot-v0", generator=gen, oracle_factory=ToyOracle))
        for _ in range(2)
    ]
    venv = SubprocVecEnv(fns)
    try:
        venv.seed(0)
        obs = venv.reset()
        assert obs["placement"].shape == (2, gen.bounds().max_nodes)
        masks = venv.env_method("action_masks")
        assert len(masks) == 2 and masks[0].dtype == bool
        acts = np.stack([venv.action_space.sample() for _ in range(2)])
        obs, r, done, info = venv.step(acts)
        assert done.all() and (r <= -1.0 + 1e-9).all()
    finally:
        venv.close()


def test_balanced_boundaries() -> None:
    assert balanced_boundaries(np.array([2.0, 1.0, 1.0]), 2).tolist() == [0, 1]
    assert balanced_boundaries(np.ones(8), 4).tolist() == [0, 2, 4, 6]
    assert balanced_boundaries(np.zeros(5), 5).tolist() == [0, 1, 2, 3, 4]
    assert balanced_boundaries(np.array([10.0, 0, 0, 0]), 3).tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        balanced_boundaries(np.ones(2), 3)


def test_sweep_final_reward_mode_same_return_one_call() -> None:
    env = _toy("placement_env/Sweep-v0", init="zeros", oom_penalty=0.0, reward_mode="final")
    env.reset(seed=0)
    rewards = [env.step(d)[1] for d in (0, 1, 1)]
    # same moves as the dense test: cost 2 -> 1.5, all of it paid at the last step
    assert rewards == pytest.approx([0.0, 0.0, 0.5])
    assert env._get_info()["oracle_calls"] == 2  # reset + the final step


def test_sweep_final_info_pairs_placement_with_its_own_step_time() -> None:
    """reward_mode="final" scores only at reset and at the end: in between, info says so."""
    env = _toy("placement_env/Sweep-v0", init="zeros", oom_penalty=0.0, reward_mode="final")
    oracle = ToyOracle(chain3(), make_cluster(2))
    _, info = env.reset(seed=0)
    infos = [info] + [env.step(d)[4] for d in (0, 1, 1)]
    # placements: all d0 (4 s, scored at reset) -> unchanged -> b on d1 (5 s, not scored)
    # -> b, c on d1 (3 s, scored at the end)
    assert [i["scored"] for i in infos] == [True, True, False, True]
    for i in infos:
        if i["scored"]:
            assert i["step_time"] == pytest.approx(oracle.evaluate(i["placement"]).step_time)
        else:
            assert np.isnan(i["step_time"]) and np.isnan(i["cost"]) and not i["oom"]
    assert infos[-1]["step_time"] == pytest.approx(3.0)
    assert infos[-1]["oracle_calls"] == 2  # still one call at reset, one at the end


def test_dense_infos_are_always_scored() -> None:
    env = _toy("placement_env/Sweep-v0", init="zeros", oom_penalty=0.0)
    _, info = env.reset(seed=0)
    assert info["scored"] and all(env.step(d)[4]["scored"] for d in (0, 1, 1))


@pytest.mark.slow
def test_default_experiment_builds() -> None:
    env = gym.make("placement_env/Sweep-v0")
    assert env.unwrapped.bounds.max_devices == 8 and env.unwrapped.bounds.max_nodes <= 256
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert info["instance"] == "gpt2-xl" and info["lower_bound"] > 0
    assert np.isfinite(info["step_time"]) and info["step_time"] >= info["lower_bound"]


def test_warm_start_from_a_node_placement_and_bad_init_refused() -> None:
    from graphs import CompGraph
    from graphs.cluster import Cluster, Device, Link
    from placement_env.envs.reassign import ReassignEnv
    from placement_env.envs.sweep import SweepEnv
    from placement_env.generators import fixed

    # 2 forward nodes + their backward nodes (colocated pairs) on 2 devices
    g = CompGraph.build(
        4,
        [(0, 1), (1, 3), (3, 2), (0, 2)],
        flops=1e9,
        out_bytes=1e6,
        kind=[0, 0, 1, 1],
        group=[0, 1, 0, 1],
        name=["a", "b", "bwd:a", "bwd:b"],
    )
    dev = [Device(f"d{i}", "x", 1e12, 1e12, 1e12) for i in range(2)]
    c = Cluster("two", tuple(dev), (Link(0, 1, 1e9, 0.0), Link(1, 0, 1e9, 0.0)))
    for cls in (SweepEnv, ReassignEnv):
        env = cls(fixed(g, c), init=np.array([1, 0, 1, 0]))
        _, info = env.reset(seed=0)
        assert list(env.unwrapped.state.placement[:2]) == [1, 0]
        with pytest.raises(ValueError, match="splits colocation unit"):
            cls(fixed(g, c), init=np.array([1, 0, 0, 0])).reset(seed=0)
        with pytest.raises(ValueError, match="entries"):
            cls(fixed(g, c), init=np.array([1, 0])).reset(seed=0)
        with pytest.raises(ValueError, match="unknown"):
            cls(fixed(g, c), init="best")
        for bad in (np.array([1, 2**64 - 1, 1, 0], np.uint64), np.array([1, -1, 1, 0])):
            with pytest.raises(ValueError, match="init placement holds device index"):
                cls(fixed(g, c), init=bad)


@pytest.mark.parametrize(
    "spec, says",
    [
        ({"kind": "synthetic", "clusters": ["cpu_2", "nope"]},
         r"generator 'synthetic': clusters\[1\] \('nope'\): unknown cluster 'nope'; available: "),
        ({"kind": "zoo", "models": ["gpt2"], "clusters": ["nope"]},
         r"generator 'zoo': clusters\[0\] \('nope'\): unknown cluster 'nope'"),
        ({"kind": "files", "paths": ["x.json"], "clusters": [3]},
         r"generator 'files': clusters\[0\] \(3\): clusters.load: name is 3 \(int\)"),
        # one name or path where a list belongs was read letter by letter ("unknown model
        # 'g'", "/: cannot read file"), a bad mixture was a KeyError or ignored (fuzzing)
        ({"kind": "zoo", "models": "gpt2", "clusters": ["k40_2"]},
         r"generator 'zoo': models must be a list, got 'gpt2'"),
        ({"kind": "files", "paths": "tests/data/diamond.graph.json", "clusters": ["k40_2"]},
         r"generator 'files': paths must be a list, got 'tests/data/diamond.graph.json'"),
        ({"kind": "mixture"}, r"'mixture' takes 'generators' \(a list of specs\) .*got \[\]"),
        ({"kind": "mixture", "generators": [{"kind": "zoo"}], "weight": [5]},
         r"optionally 'weights'; got \['generators', 'weight'\]"),
        ({"kind": "mixture", "generators": {"kind": "zoo"}}, r"generators must be a list of specs"),
        ("zoo", r"a generator spec must be a mapping with a 'kind'"),
    ],
)  # fmt: skip
def test_a_generator_loads_its_clusters_when_built(spec, says) -> None:
    """An unknown cluster name used to pass the constructor and fail at the first episode
    (after minutes of baselines in runners.train), named nowhere in the config."""
    from placement_env.generators import make_generator

    with pytest.raises(ValueError, match=says):
        make_generator(spec)
    ok = make_generator({"kind": "zoo", "models": ["gpt2"], "clusters": ["cpu_2", "k40_2"]})
    assert [c.num_devices for c in (ok.instance(0, 0).cluster, ok.instance(0, 1).cluster)] == [2, 2]


@pytest.mark.parametrize("bad", ["abc", True, float("nan"), -1.0])
def test_a_bad_oom_penalty_is_a_value_error_naming_it(bad) -> None:
    """Found by fuzzing: ``oom_penalty="abc"`` was numpy's ``isfinite`` TypeError."""
    with pytest.raises(ValueError, match=r"oom_penalty must be finite and >= 0, got"):
        _toy("placement_env/Sweep-v0", oom_penalty=bad)


@pytest.mark.parametrize("key", ["max_nodes", "max_edges", "max_devices"])
@pytest.mark.parametrize("bad", [300.7, "300", True, 0, -2])
def test_padding_bounds_must_be_whole_numbers(key: str, bad) -> None:
    """Found by fuzzing (2 Dec 2026): ``max_nodes=300.7`` was cut to 300 and ``"300"`` taken."""
    with pytest.raises(
        ValueError, match=rf"{key} must be an integer >= 1 \(or None: from the generator\), got"
    ):
        _toy("placement_env/Sweep-v0", **{key: bad})
    assert _toy("placement_env/Sweep-v0", **{key: np.int64(64)}).bounds[0] >= 1


@pytest.mark.parametrize("bad", [2.5, 2.0, "2", True, 0])
def test_stage_counts_and_inits_are_checked(bad) -> None:
    """Found by fuzzing (2 Dec 2026): ``stages=2.5`` / ``2.0`` failed in numpy at reset,
    ``"2"`` in a comparison, ``True`` was one stage; a placement as ``init`` (what Sweep
    and Reassign take) was numpy's "truth value is ambiguous"."""
    with pytest.raises(ValueError, match=r"stages must be an integer >= 1 or None, got"):
        _toy("placement_env/Stage-v0", stages=bad)
    with pytest.raises(
        ValueError, match=r"init must be one of \('random', 'balanced'\) .*got array"
    ):
        _toy("placement_env/Stage-v0", init=np.zeros(4, np.int64))
    env = _toy("placement_env/Stage-v0", stages=np.int64(2))
    env.reset(seed=0)
    assert len(env.unwrapped.stage_device) == 2


@pytest.mark.parametrize("env_id", ["placement_env/Reassign-v0", "placement_env/Stage-v0"])
@pytest.mark.parametrize("bad", [1.5, "8", True, 0])
def test_a_horizon_must_be_a_whole_number(env_id: str, bad) -> None:
    """Found by fuzzing: ``horizon=1.5`` was taken (a fractional progress feature)."""
    with pytest.raises(ValueError, match=r"horizon must be an integer >= 1 or None, got"):
        _toy(env_id, horizon=bad)
    assert _toy(env_id, horizon=None).horizon is None


@pytest.mark.parametrize(
    "env_id", ["placement_env/Sweep-v0", "placement_env/OneShot-v0", "placement_env/Hybrid-v0"]
)
def test_an_env_refuses_a_generator_or_oracle_factory_of_the_wrong_kind(env_id: str) -> None:
    """Found by fuzzing: ``generator=42`` built an env whose reset() raised AttributeError;
    ``oracle_factory="sim"`` failed at reset with an unnamed TypeError."""
    with pytest.raises(TypeError, match=r"generator must be an instance generator .* got 42"):
        gym.make(env_id, generator=42)
    with pytest.raises(TypeError, match=r"oracle_factory must be a callable .* got 'sim'"):
        gym.make(env_id, generator=fixed(chain3(), make_cluster(2)), oracle_factory="sim")


def test_the_synthetic_generator_refuses_its_samplers_names_of_its_own_options():
    """Found by fuzzing: kind= and min_nodes= (graphs.synthetic.sample's names) overrode
    graph_kind and min_ops without a word, skipping their checks."""
    from placement_env.generators import SyntheticGenerator

    for kw in ({"kind": "nasnet"}, {"min_nodes": 25}):
        with pytest.raises(ValueError, match=rf"takes no option\(s\) \['{next(iter(kw))}'\]"):
            SyntheticGenerator(("k40_2",), graph_kind="layered", min_ops=20, max_ops=30, **kw)
