"""Stage-v0: pipeline plans with contiguous stages; move a boundary or re-seat a stage."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from graphs.plan import Plan
from graphs.schema import is_whole, show
from placement_env.envs.base import (
    OracleFactory,
    PlacementEnv,
    as_int_action,
    balanced_boundaries,
    check_horizon,
    stages_to_placement,
)
from placement_env.generators import Generator

STAGE_INITS = ("random", "balanced")


class StageEnv(PlacementEnv):
    """Pipeline-parallel planning: ``S`` stages, contiguous in the topological unit order.

    Stage ``s`` holds units ``starts[s] .. starts[s+1]-1`` (``starts[0] = 0``)
    and runs on device ``stage_device[s]``; stages sit on distinct devices. The
    oracle scores the plan with its pipeline schedule (default: 8 microbatches,
    1F1B); the env passes a ``graphs.Plan`` carrying ``stage`` and ``stage_device``.

    ## Action Space

    ``Discrete(2 * (max_devices - 1) + max_devices * max_devices)``, with
    ``B = max_devices - 1`` possible boundaries:

    - ``a < 2B``: move boundary ``k = a // 2`` (the start of stage ``k + 1``) one
      unit left (``a`` even) or right (``a`` odd).
    - ``a >= 2B``: with ``a' = a - 2B``, put stage ``s = a' // max_devices`` on device
      ``d = a' % max_devices``; the stage that held ``d`` (if any) takes ``s``'s old
      device (a swap, so stages stay on distinct devices).

    A move that would empty a stage, a boundary or stage beyond ``S``, or a
    padding device is a no-op flagged ``info["invalid_action"]``; ``action_masks()``
    masks exactly these plus moves that overflow a device's persistent memory
    (re-seating a stage on its own device is always allowed, so the mask is never
    empty). A non-integer or out-of-range action raises ``ValueError``.

    ## Observation Space

    The shared padded ``Dict`` of ``docs/environments.md``; see ``SweepEnv`` for
    the table. The ``boundary`` node feature marks the first unit of each stage
    (when adjacent stages sit on different devices); ``visited`` marks units that
    changed device this episode; ``progress`` is ``steps / horizon``.

    ## Rewards

    ``r_t = cost(p_{t-1}) - cost(p_t)`` (positive when the pipelined step time
    improves), ``cost = step_time / lower_bound`` (clipped at 1e3) plus, on OOM,
    ``oom_penalty * (1 + overflow)``, ``overflow = max_d(peak_d / capacity_d - 1)``
    clipped at 10. No-op steps give 0.

    ## Episode End

    - Termination: never.
    - Truncation: the step budget, ``max_episode_steps`` of the registration (default 128).

    ## Arguments

    - ``generator``, ``oracle_factory``, ``oom_penalty``, ``max_nodes``, ``max_edges``,
      ``max_devices``, ``render_mode``: as ``SweepEnv``.
    - ``stages``: number of stages ``S`` (default: ``min(D, U)`` of each instance; capped there).
    - ``init``: ``"random"`` (default: random distinct boundaries and device permutation)
      or ``"balanced"`` (equal-compute stages on devices ``0..S-1``).
    - ``horizon``: step budget for the ``progress`` feature (default 128; ``None`` = none).

    ## Info

    As ``SweepEnv``, plus ``stage_starts`` (int64 ``(S,)``) and ``stage_device`` (int64 ``(S,)``).

    ## Version History

    - v0: initial version.
    """

    def __init__(
        self,
        generator: Generator | None = None,
        oracle_factory: OracleFactory | None = None,
        *,
        stages: int | None = None,
        init: str = "random",
        horizon: int | None = 128,
        oom_penalty: float = 1.0,
        max_nodes: int | None = None,
        max_edges: int | None = None,
        max_devices: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        # a placement array (what Sweep and Reassign take) was numpy's "truth value is
        # ambiguous"; stages=2.5 / "2" numpy or comparison TypeErrors, True one stage (fuzzing)
        if not isinstance(init, str) or init not in STAGE_INITS:
            raise ValueError(
                f"init must be one of {STAGE_INITS} (Stage-v0 builds its stages; it takes no "
                f"placement), got {show(init)}"
            )
        if stages is not None and not is_whole(stages, 1):
            raise ValueError(f"stages must be an integer >= 1 or None, got {stages!r}")
        stages = None if stages is None else int(stages)
        check_horizon(horizon)
        super().__init__(
            generator,
            oracle_factory,
            max_nodes=max_nodes,
            max_edges=max_edges,
            max_devices=max_devices,
            oom_penalty=oom_penalty,
            render_mode=render_mode,
        )
        self.stages, self.init, self.horizon = stages, init, horizon
        Dm = self.bounds.max_devices
        self.n_moves = 2 * (Dm - 1)
        self.action_space = spaces.Discrete(self.n_moves + Dm * Dm)
        self.starts = np.zeros(1, dtype=np.int64)
        self.stage_device = np.zeros(1, dtype=np.int64)

    # ---------------------------------------------------------------- state
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        self._prep = self._load_instance()
        U, D = self.enc.num_units, self.enc.num_devices
        S = min(self.stages or D, D, U)
        if self.init == "balanced":
            w = np.where(np.isfinite(self.enc.unit_time), self.enc.unit_time, 0.0).min(axis=1)
            self.starts = balanced_boundaries(w, S)
            self.stage_device = np.arange(S, dtype=np.int64)
        else:
            inner = np.sort(self.np_random.choice(np.arange(1, U), size=S - 1, replace=False))
            self.starts = np.concatenate([[0], inner]).astype(np.int64)
            self.stage_device = self.np_random.permutation(D)[:S].astype(np.int64)
        st = self._begin_episode(self._placement())
        self._evaluate(st.placement)
        return self._get_obs(), self._get_info()

    def _placement(self) -> np.ndarray:
        return stages_to_placement(self.starts, self.stage_device, self.enc.num_units)

    def _to_plan(self, unit_placement: np.ndarray) -> Plan:
        enc = self.enc
        stage_of_unit = np.zeros(enc.num_units, dtype=np.int64)
        stage_of_unit[self.starts[1:]] = 1
        stage_of_unit = np.cumsum(stage_of_unit)
        oracle = self.oracle
        return Plan(
            enc.units.node_placement(unit_placement),
            enc.instance.graph.content_hash(),
            enc.instance.cluster.content_hash(),
            stage=stage_of_unit[enc.units.node_unit],
            stage_device=tuple(int(x) for x in self.stage_device),
            microbatches=int(getattr(oracle, "microbatches", 1)),
            schedule=str(getattr(oracle, "schedule", "1f1b")),
        )

    # ---------------------------------------------------------------- actions
    def _apply(self, a: int) -> bool:
        """Apply action ``a`` to ``starts`` / ``stage_device``; False if it is invalid (no-op)."""
        S, U, D, Dm = (
            len(self.starts),
            self.enc.num_units,
            self.enc.num_devices,
            self.bounds.max_devices,
        )
        if a < self.n_moves:
            k, right = divmod(a, 2)
            if k >= S - 1:
                return False
            b = self.starts[k + 1] + (1 if right else -1)
            lo = self.starts[k] + 1
            hi = (self.starts[k + 2] if k + 2 < S else U) - 1
            if not lo <= b <= hi:
                return False
            self.starts[k + 1] = b
            return True
        s, d = divmod(a - self.n_moves, Dm)
        if s >= S or d >= D:
            return False
        other = np.flatnonzero(self.stage_device == d)
        if other.size:
            self.stage_device[other[0]] = self.stage_device[s]
        self.stage_device[s] = d
        return True

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        st = self.state
        if st is None:
            raise RuntimeError("StageEnv: call reset() before step()")
        a = as_int_action(action, int(self.action_space.n), "StageEnv action")
        st.steps += 1
        before = st.cost
        self._invalid = not self._apply(a)
        if not self._invalid:
            new = self._placement()
            moved = new != st.placement
            st.visited |= moved
            st.placement = new
            st.current = int(np.flatnonzero(moved)[0]) if moved.any() else -1
            self._evaluate(st.placement)
        return self._get_obs(), float(before - st.cost), False, False, self._get_info()

    def _progress(self) -> float:
        st = self.state
        if st is None or self.horizon is None:
            return 0.0
        return st.steps / self.horizon

    def action_masks(self) -> np.ndarray:
        """``(2 * (max_devices - 1) + max_devices**2,)`` bool: valid actions that put no unit on a
        device without a kernel for it and push no device's persistent bytes over capacity
        (re-seating a stage on its own device is always allowed)."""
        mask = np.zeros(int(self.action_space.n), dtype=bool)
        if self.state is None:
            mask[self.n_moves] = True
            return mask
        enc = self.enc
        saved = (self.starts.copy(), self.stage_device.copy())
        cap = enc.capacity
        used0 = enc.device_used(self.state.placement)
        for a in range(mask.size):
            ok = self._apply(a)
            if ok:
                pl = self._placement()
                used = enc.device_used(pl)
                runs = bool(enc.runnable[np.arange(len(pl)), pl].all())
                # a device may end above capacity only if the move does not add to it
                fits = bool(((used <= cap) | (used <= used0)).all())
                ok = (runs and fits) or (a >= self.n_moves and self._is_noop(a, saved))
            mask[a] = ok
            self.starts[:], self.stage_device[:] = saved
        return mask

    def _is_noop(self, a: int, saved: tuple[np.ndarray, np.ndarray]) -> bool:
        s, d = divmod(a - self.n_moves, self.bounds.max_devices)
        return int(saved[1][s]) == d

    def _get_info(self) -> dict[str, Any]:
        info = super()._get_info()
        info["stage_starts"] = self.starts.copy()
        info["stage_device"] = self.stage_device.copy()
        return info
