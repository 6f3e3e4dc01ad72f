"""OneShot-v0 (GDP): a single step places every colocation unit."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from placement_env.envs.base import OracleFactory, PlacementEnv
from placement_env.generators import Generator


class OneShotEnv(PlacementEnv):
    """GDP-style placement: the policy outputs the device of every unit at once.

    ## Action Space

    ``MultiDiscrete([max_devices] * max_nodes)``: entry ``u`` is the device of
    unit ``u``. Entries of padding units (``u >= U``) are ignored; device
    indices of padding devices (``>= D``) are taken modulo ``D`` and flagged
    ``info["invalid_action"]``. An action of another shape, non-integer values
    or values outside ``[0, max_devices)`` raise ``ValueError``.

    ## Observation Space

    The shared padded ``Dict`` of ``docs/environments.md``; see ``SweepEnv``
    for the table. At reset ``placement`` is all ``-1`` (nothing placed),
    ``current`` is ``-1`` and the placement-dependent features are 0; after the
    step they describe the chosen placement.

    ## Rewards

    ``r = -cost(p)`` with ``cost = step_time / lower_bound`` (clipped at 1e3)
    plus, on OOM, ``oom_penalty * (1 + overflow)``, ``overflow = max_d(peak_d /
    capacity_d - 1)`` clipped at 10. So ``r <= -1`` and ``r = -1`` only for a
    placement that reaches the lower bound; higher is better.

    ## Episode End

    - Termination: after the single step.
    - Truncation: none.

    ## Arguments

    - ``generator``: instance generator (default: ``gpt2-xl`` <= 256 groups on ``dgx1_v100_8``).
    - ``oracle_factory``: ``(graph, cluster) -> Oracle`` (default: Simulator, 8 microbatches, 1F1B).
    - ``oom_penalty``: see Rewards (default 1.0).
    - ``max_nodes``, ``max_edges``, ``max_devices``: padding (default: the generator's bounds).
    - ``render_mode``: ``None`` or ``"ansi"``.

    ## Info

    As ``SweepEnv``; at reset ``step_time`` and ``cost`` are NaN and ``placement`` is all -1.

    ## Version History

    - v0: initial version.
    """

    def __init__(
        self,
        generator: Generator | None = None,
        oracle_factory: OracleFactory | None = None,
        *,
        oom_penalty: float = 1.0,
        max_nodes: int | None = None,
        max_edges: int | None = None,
        max_devices: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(
            generator,
            oracle_factory,
            max_nodes=max_nodes,
            max_edges=max_edges,
            max_devices=max_devices,
            oom_penalty=oom_penalty,
            render_mode=render_mode,
        )
        self.action_space = spaces.MultiDiscrete(
            np.full(self.bounds.max_nodes, self.bounds.max_devices, dtype=np.int64)
        )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        self._prep = self._load_instance()
        self._begin_episode(np.full(self.enc.num_units, -1, dtype=np.int64))
        return self._get_obs(), self._get_info()

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        st = self.state
        if st is None or st.steps > 0:
            raise RuntimeError("OneShotEnv: call reset() before step() (one step per episode)")
        b = self.bounds
        a = np.asarray(action)
        if a.shape != (b.max_nodes,):
            raise ValueError(
                f"OneShotEnv action must have shape ({b.max_nodes},): one device per unit, "
                f"got shape {a.shape}"
            )
        # complex actions raised numpy's "ufunc 'remainder' not supported" (fuzzing)
        if a.dtype == bool or not (
            np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)
        ):
            raise ValueError(
                f"OneShotEnv action must hold integer device indices, got dtype {a.dtype}"
            )
        if not (np.issubdtype(a.dtype, np.integer) or np.all(np.mod(a, 1) == 0)):
            raise ValueError("OneShotEnv action must hold integer device indices")
        bad = (a < 0) | (a >= b.max_devices)  # before the cast: uint64 2**64-1 read as -1
        if bad.any():
            u = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"OneShotEnv action puts unit {u} on device {int(a[u])}; expected [0, {b.max_devices})"
            )
        a = a.astype(np.int64)
        U, D = self.enc.num_units, self.enc.num_devices
        p = a[:U]
        self._invalid = bool((p >= D).any())
        st.placement = p % D
        st.visited[:] = True
        st.steps = 1
        _, c = self._evaluate(st.placement)
        return self._get_obs(), float(-c), True, False, self._get_info()

    def _progress(self) -> float:
        st = self.state
        return float(st.steps) if st is not None else 0.0

    def action_masks(self) -> np.ndarray:
        """``(max_nodes * max_devices,)`` bool, unit-major: real devices whose capacity can hold
        the unit's persistent state on its own (all real devices if none can); padding units
        allow device 0 only."""
        b = self.bounds
        mask = np.zeros((b.max_nodes, b.max_devices), dtype=bool)
        mask[:, 0] = True
        if self._prep is not None:
            enc = self.enc
            U, D = enc.num_units, enc.num_devices
            fits = (enc.unit_mem[:, None] <= enc.capacity[None, :]) & enc.runnable
            fits[~fits.any(axis=1)] = True
            mask[:U, :D] = fits
            mask[:U, 0] = fits[:, 0]
        return mask.reshape(-1)
