"""Shared machinery of the placement environments: instances, oracle calls, cost, obs and info."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from graphs.cluster import Cluster
from graphs.compgraph import OPT, CompGraph
from graphs.plan import Plan
from graphs.schema import is_whole
from placement_env.encoding import InstanceEncoding, observation_space, prepare, unit_graph
from placement_env.generators import Generator, default_generator
from placement_env.oracles.base import Oracle, SimResult
from placement_env.types import Bounds, EpisodeState, Instance

OracleFactory = Callable[[CompGraph, Cluster], Oracle]

#: Normalised step times are clipped here so rewards stay finite (e.g. a node that cannot run).
MAX_TIME_RATIO = 1e3
#: Memory overflow (peak / capacity - 1) counted by the OOM penalty is clipped here.
MAX_OVERFLOW = 10.0
#: Instances whose precomputed data an env keeps (least recently used dropped).
INSTANCE_CACHE = 16
INIT_CHOICES = ("random", "balanced", "zeros")


def check_init(init: str | np.ndarray | list[int]) -> str | np.ndarray:
    """Validate an env's ``init``: a name in ``INIT_CHOICES`` or a per-node placement array.

    A placement (device index per node of the graph, e.g. a baseline's plan) starts
    every episode from that plan: a warm start for Placeto-style refinement.
    """
    if isinstance(init, str):
        if init not in INIT_CHOICES:
            raise ValueError(
                f"init {init!r} is unknown; expected one of {INIT_CHOICES} or a placement array"
            )
        return init
    arr = np.asarray(init)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(
            f"init placement must be a 1-D integer array (device per node), got shape "
            f"{arr.shape} dtype {arr.dtype}"
        )
    lo, hi = (arr.min(), arr.max()) if arr.size else (0, 0)
    if lo < 0 or hi > np.iinfo(np.int64).max:
        # uint64 2**64-1 was cast to -1, and negative indices taken until the first episode
        raise ValueError(
            f"init placement holds device index {int(lo if lo < 0 else hi)}: device indices "
            "are >= 0"
        )
    return arr.astype(np.int64)


@dataclass(frozen=True)
class SimulatorFactory:
    """``(graph, cluster) -> Simulator``: the default oracle (8 microbatches, 1F1B, makespan)."""

    microbatches: int = 8
    schedule: str = "1f1b"
    objective: str = "makespan"

    def __call__(self, graph: CompGraph, cluster: Cluster) -> Oracle:
        from placement_env.oracles.simulator import Simulator

        return Simulator(
            graph,
            cluster,
            microbatches=self.microbatches,
            schedule=self.schedule,
            objective=self.objective,
        )


@dataclass(eq=False)
class _Prepared:
    enc: InstanceEncoding
    oracle: Oracle


def balanced_boundaries(weights: np.ndarray, stages: int) -> np.ndarray:
    """Start unit of each stage ``(stages,)`` splitting ``weights`` (in order) into near-equal
    contiguous parts, every stage non-empty (``stages <= len(weights)``)."""
    U = len(weights)
    if not 1 <= stages <= U:
        raise ValueError(f"cannot split {U} units into {stages} non-empty stages")
    w = np.maximum(np.asarray(weights, dtype=np.float64), 0.0)
    cum = np.cumsum(w)
    total = cum[-1]
    starts = np.zeros(stages, dtype=np.int64)
    for s in range(1, stages):
        target = total * s / stages
        b = int(np.searchsorted(cum, target, side="left")) + 1 if total > 0 else s * U // stages
        starts[s] = min(max(b, starts[s - 1] + 1), U - (stages - s))
    return starts


def stages_to_placement(starts: np.ndarray, stage_device: np.ndarray, U: int) -> np.ndarray:
    """Unit placement ``(U,)`` from stage starts ``(S,)`` and the device of each stage ``(S,)``."""
    stage = np.zeros(U, dtype=np.int64)
    stage[starts[1:]] = 1
    return np.asarray(stage_device, dtype=np.int64)[np.cumsum(stage)]


def as_int_action(action: Any, n: int, what: str = "action") -> int:
    """Validate a ``Discrete(n)`` action (int, numpy integer, or size-1 integer array)."""
    a = np.asarray(action)
    if a.size != 1 or not (np.issubdtype(a.dtype, np.integer) or _integral(a)):
        raise ValueError(f"{what} must be one integer in [0, {n}), got {action!r}")
    v = int(a.reshape(-1)[0])
    if not 0 <= v < n:
        raise ValueError(f"{what} {v} is out of range: expected an integer in [0, {n})")
    return v


def _integral(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.floating) and bool(np.all(np.mod(a, 1) == 0))


def check_horizon(horizon: Any) -> None:
    """The ``horizon`` of the stepwise envs (the ``progress`` feature's step budget): an
    integer >= 1 or None (``1.5`` was taken: found by fuzzing)."""
    from graphs.schema import is_whole

    if horizon is not None and not (is_whole(horizon, floats=False) and horizon >= 1):
        raise ValueError(f"horizon must be an integer >= 1 or None, got {horizon!r}")


class PlacementEnv(gym.Env[dict, Any]):
    """Base of the placement environments; see the subclasses for their spec.

    Holds the generator, the oracle factory, per-instance precomputation, the
    reward's cost function and the shared ``_get_obs`` / ``_get_info``.

    Cost of a placement (lower is better)::

        cost = min(step_time / lower_bound, 1e3)
               + oom * oom_penalty * (1 + min(max_d(peak_d / capacity_d - 1), 10))
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        generator: Generator | None = None,
        oracle_factory: OracleFactory | None = None,
        *,
        max_nodes: int | None = None,
        max_edges: int | None = None,
        max_devices: int | None = None,
        oom_penalty: float = 1.0,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode {render_mode!r} is not supported; expected one of "
                f"{self.metadata['render_modes']} or None"
            )
        from graphs.schema import is_number
        from placement_env.generators import check_generator_object

        check_generator_object(generator, oracle_factory, type(self).__name__)
        if not (is_number(oom_penalty) and oom_penalty >= 0):  # "abc": a numpy TypeError
            raise ValueError(f"oom_penalty must be finite and >= 0, got {oom_penalty!r}")
        self.generator: Generator = generator if generator is not None else default_generator()
        self.oracle_factory: OracleFactory = (
            oracle_factory if oracle_factory is not None else SimulatorFactory()
        )
        self.oom_penalty = float(oom_penalty)
        self.render_mode = render_mode
        given = (max_nodes, max_edges, max_devices)
        for key, v in zip(("max_nodes", "max_edges", "max_devices"), given):
            # 300.7 was cut to 300 and "300" taken (fuzzing, 2 Dec 2026)
            if v is not None and not is_whole(v, 1):
                raise ValueError(
                    f"{key} must be an integer >= 1 (or None: from the generator), got {v!r}"
                )
        gb = self.generator.bounds() if None in given else None
        self.bounds = Bounds(
            *(int(v) if v is not None else int(gb[i]) for i, v in enumerate(given))  # type: ignore[index]
        )
        self.observation_space = observation_space(self.bounds)
        self._cache: OrderedDict[tuple[str, str], _Prepared] = OrderedDict()
        self._eval_cache: dict[bytes, tuple[SimResult, float]] = {}
        self.total_oracle_calls = 0
        self._prep: _Prepared | None = None
        self.state: EpisodeState | None = None
        self._last: SimResult | None = None
        self._scored = b""  # the unit placement (bytes) that state's step_time / oom / cost are of
        self._episode_calls = 0
        self._invalid = False

    # ------------------------------------------------------------- instances
    def _load_instance(self) -> _Prepared:
        inst = self.generator.sample(self.np_random)
        p = self._cache.get(inst.key)
        if p is None:
            p = self._prepare(inst)
            self._cache[inst.key] = p
            if len(self._cache) > INSTANCE_CACHE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(inst.key)
        return p

    def _prepare(self, inst: Instance) -> _Prepared:
        oracle = self.oracle_factory(inst.graph, inst.cluster)
        units = unit_graph(inst.graph)
        node_times = None
        if hasattr(oracle, "node_times"):
            # the simulator gives seconds per run: fwd/bwd run once per microbatch
            node_times = np.asarray(oracle.node_times(), dtype=np.float64)
            if getattr(oracle, "objective", "makespan") == "makespan":
                runs = np.where(inst.graph.kind == OPT, 1, int(getattr(oracle, "microbatches", 1)))
                node_times = node_times * runs[:, None]
        if hasattr(oracle, "lower_bound") and callable(oracle.lower_bound):
            lb = float(oracle.lower_bound())
        else:  # the protocol guarantees only SimResult.lower_bound
            lb = float(oracle.evaluate(np.zeros(inst.graph.num_nodes, dtype=np.int64)).lower_bound)
        enc = prepare(inst, self.bounds, lower_bound=lb, node_times=node_times, units=units)
        return _Prepared(enc, oracle)

    @property
    def enc(self) -> InstanceEncoding:
        if self._prep is None:
            raise RuntimeError(f"{type(self).__name__}: call reset() before step()")
        return self._prep.enc

    @property
    def oracle(self) -> Oracle:
        if self._prep is None:
            raise RuntimeError(f"{type(self).__name__}: call reset() first")
        return self._prep.oracle

    @property
    def instance(self) -> Instance:
        return self.enc.instance

    # ------------------------------------------------------------ evaluation
    def cost(self, res: SimResult) -> float:
        """Normalised cost of an evaluated placement (see the class docstring)."""
        lb = self.enc.lower_bound
        t = float(res.step_time)
        ratio = min(t / lb, MAX_TIME_RATIO) if np.isfinite(t) else MAX_TIME_RATIO
        if not res.oom:  # a placement that cannot run at all has step_time inf: ratio 1e3
            return ratio
        cap = self.enc.capacity
        peak = np.asarray(res.peak_memory, dtype=np.float64)
        finite = np.isfinite(cap) & (cap > 0)
        over = float(np.max(peak[finite] / cap[finite] - 1.0, initial=0.0)) if finite.any() else 0.0
        return ratio + self.oom_penalty * (1.0 + min(max(over, 0.0), MAX_OVERFLOW))

    def _to_plan(self, unit_placement: np.ndarray) -> np.ndarray | Plan:
        """What the oracle evaluates for a unit placement (Stage overrides to pass a Plan)."""
        return self.enc.units.node_placement(unit_placement)

    def _evaluate(self, unit_placement: np.ndarray) -> tuple[SimResult, float]:
        """Score a complete unit placement; updates the episode's state, best and counters."""
        st = self.state
        assert st is not None
        key = unit_placement.tobytes()
        hit = self._eval_cache.get(key)
        if hit is None:
            res = self.oracle.evaluate(self._to_plan(unit_placement))
            hit = (res, self.cost(res))
            self._eval_cache[key] = hit
            self._episode_calls += 1
            self.total_oracle_calls += 1
        res, c = hit
        self._last = res
        self._scored = key
        st.step_time, st.oom, st.cost = float(res.step_time), bool(res.oom), c
        if not res.oom and np.isfinite(res.step_time):
            st.best_step_time = min(st.best_step_time, float(res.step_time))
        return res, c

    def _begin_episode(self, placement: np.ndarray) -> EpisodeState:
        self._eval_cache = {}
        self._episode_calls = 0
        self._last = None
        self._scored = b""
        self._invalid = False
        U = self.enc.num_units
        self.state = EpisodeState(
            placement=np.asarray(placement, dtype=np.int64).copy(),
            visited=np.zeros(U, dtype=bool),
        )
        return self.state

    def _initial_placement(self, init: str | np.ndarray) -> np.ndarray:
        U, D = self.enc.num_units, self.enc.num_devices
        if isinstance(init, np.ndarray):
            node_unit = self.enc.units.node_unit
            if init.shape != node_unit.shape:
                raise ValueError(
                    f"init placement has {init.shape[0]} entries, but this instance has "
                    f"{node_unit.shape[0]} nodes (one device index per node, graph order)"
                )
            if init.min(initial=0) < 0 or init.max(initial=0) >= D:
                raise ValueError(f"init placement uses devices outside 0..{D - 1}")
            unit = np.zeros(U, dtype=np.int64)
            unit[node_unit] = init
            if np.any(unit[node_unit] != init):
                bad = int(node_unit[np.flatnonzero(unit[node_unit] != init)[0]])
                raise ValueError(
                    f"init placement splits colocation unit {bad} over several devices"
                )
            return unit
        if init == "random":
            return self.np_random.integers(0, D, size=U).astype(np.int64)
        if init == "zeros":
            return np.zeros(U, dtype=np.int64)
        if init == "balanced":
            S = min(D, U)
            w = np.where(np.isfinite(self.enc.unit_time), self.enc.unit_time, 0.0).min(axis=1)
            return stages_to_placement(balanced_boundaries(w, S), np.arange(S), U)
        raise ValueError(f"init {init!r} is unknown; expected one of {INIT_CHOICES}")

    # ---------------------------------------------------------------- masks
    def _fits(self, unit: int) -> np.ndarray:
        """``(D,)`` bool: devices that can take ``unit`` without their persistent bytes
        exceeding capacity, given everything else stays, and that have a kernel for it
        (its current device is always allowed)."""
        enc, st = self.enc, self.state
        assert st is not None
        used = enc.device_used(st.placement)
        cur = int(st.placement[unit])
        if cur >= 0:
            used[cur] -= enc.unit_mem[unit]
        ok = (used + enc.unit_mem[unit] <= enc.capacity) & enc.runnable[unit]
        if cur >= 0:
            ok[cur] = True
        return ok

    # ------------------------------------------------------------ obs / info
    def _progress(self) -> float:
        return 0.0

    def _get_obs(self) -> dict[str, np.ndarray]:
        assert self.state is not None
        return self.enc.encode(self.state, self._progress())

    def _get_info(self) -> dict[str, Any]:
        st = self.state
        assert st is not None
        pl = st.placement
        node_pl = (
            self.enc.units.node_placement(pl)
            if (pl >= 0).all()
            else np.where(pl >= 0, pl, -1)[self.enc.units.node_unit]
        )
        scored = pl.tobytes() == self._scored
        return {
            "step_time": float(st.step_time) if scored else float("nan"),
            "best_step_time": float(st.best_step_time),
            "lower_bound": float(self.enc.lower_bound),
            "oom": bool(st.oom) and scored,
            "cost": float(st.cost) if scored else float("nan"),
            "placement": node_pl.astype(np.int64),
            "scored": scored,
            "oracle_calls": int(self._episode_calls),
            "invalid_action": bool(self._invalid),
            "instance": self.instance.name,
        }

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.state is None:
            return None
        st = self.state
        counts = np.bincount(st.placement[st.placement >= 0], minlength=self.enc.num_devices)
        return (
            f"{type(self).__name__} {self.instance.name!r} on {self.instance.cluster.name!r}: "
            f"step {st.steps}, step_time={st.step_time:.6g}s best={st.best_step_time:.6g}s "
            f"lb={self.enc.lower_bound:.6g}s oom={st.oom} units/device={counts.tolist()}"
        )
