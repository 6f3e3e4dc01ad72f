"""Reassign-v0 (GiPH / HDP style): each step moves one colocation unit to a device."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from placement_env.envs.base import (
    OracleFactory,
    PlacementEnv,
    as_int_action,
    check_horizon,
    check_init,
)
from placement_env.generators import Generator


class ReassignEnv(PlacementEnv):
    """Local search as an MDP: pick a (unit, device) pair, move the unit there.

    ## Action Space

    ``Discrete(max_nodes * max_devices)``: action ``a`` moves unit
    ``a // max_devices`` to device ``a % max_devices``. A padding unit
    (``>= U``) makes the step a no-op; a padding device (``>= D``) is taken
    modulo ``D``; both are masked by ``action_masks()`` and flagged
    ``info["invalid_action"]``. Moving a unit to its own device is a valid no-op
    (never masked, so the mask is never empty). A non-integer or out-of-range
    action raises ``ValueError``.

    ## Observation Space

    The shared padded ``Dict`` of ``docs/environments.md``; see ``SweepEnv`` for
    the table. ``current`` is the unit moved by the last step (-1 at reset);
    ``visited`` marks units moved this episode; ``progress`` is
    ``steps / horizon`` (0 without a horizon).

    ## Rewards

    ``r_t = cost(p_{t-1}) - cost(p_t)`` (positive when the step time improves),
    with ``cost = step_time / lower_bound`` (clipped at 1e3) plus, on OOM,
    ``oom_penalty * (1 + overflow)``, ``overflow = max_d(peak_d / capacity_d -
    1)`` clipped at 10. No-op steps give 0.

    ## Episode End

    - Termination: never.
    - Truncation: the step budget, ``max_episode_steps`` of the registration
      (default 256) through ``TimeLimit``.

    ## Arguments

    - ``generator``, ``oracle_factory``, ``oom_penalty``, ``max_nodes``, ``max_edges``,
      ``max_devices``, ``render_mode``: as ``SweepEnv``.
    - ``init``: initial placement, ``"random"`` (default), ``"balanced"`` or ``"zeros"``, or a per-node placement array
      (device index per node, e.g. a baseline's plan) to warm-start every episode from it.
    - ``horizon``: the step budget, used only for the ``progress`` feature (default 256,
      matching the registration's ``max_episode_steps``; ``None`` = no progress feature).

    ## Info

    As ``SweepEnv``.

    ## Version History

    - v0: initial version.
    """

    def __init__(
        self,
        generator: Generator | None = None,
        oracle_factory: OracleFactory | None = None,
        *,
        init: str | np.ndarray = "random",
        horizon: int | None = 256,
        oom_penalty: float = 1.0,
        max_nodes: int | None = None,
        max_edges: int | None = None,
        max_devices: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        init = check_init(init)
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
        self.init, self.horizon = init, horizon
        self.action_space = spaces.Discrete(self.bounds.max_nodes * self.bounds.max_devices)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        self._prep = self._load_instance()
        st = self._begin_episode(self._initial_placement(self.init))
        self._evaluate(st.placement)
        return self._get_obs(), self._get_info()

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        st = self.state
        if st is None:
            raise RuntimeError("ReassignEnv: call reset() before step()")
        b = self.bounds
        a = as_int_action(action, b.max_nodes * b.max_devices, "ReassignEnv action")
        u, d = divmod(a, b.max_devices)
        U, D = self.enc.num_units, self.enc.num_devices
        self._invalid = u >= U or d >= D
        st.steps += 1
        before = st.cost
        if u < U:
            st.placement[u] = d % D
            st.visited[u] = True
            st.current = u
            self._evaluate(st.placement)
        return self._get_obs(), float(before - st.cost), False, False, self._get_info()

    def _progress(self) -> float:
        st = self.state
        if st is None or self.horizon is None:
            return 0.0
        return st.steps / self.horizon

    def action_masks(self) -> np.ndarray:
        """``(max_nodes * max_devices,)`` bool, unit-major: real (unit, device) pairs whose
        move keeps the device's persistent bytes within capacity (own device always allowed)."""
        b = self.bounds
        mask = np.zeros((b.max_nodes, b.max_devices), dtype=bool)
        st = self.state
        if st is None:
            mask[0, 0] = True
            return mask.reshape(-1)
        enc = self.enc
        U, D = enc.num_units, enc.num_devices
        used = enc.device_used(st.placement)
        pl = st.placement
        # bytes on d if unit u moved there: used[d] + mem[u] (minus mem[u] when d is its device)
        ok = (used[None, :] + enc.unit_mem[:, None] <= enc.capacity[None, :]) & enc.runnable
        ok[np.arange(U), pl] = True
        mask[:U, :D] = ok
        return mask.reshape(-1)
