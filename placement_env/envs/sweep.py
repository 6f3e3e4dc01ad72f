"""Sweep-v0 (Placeto): visit every colocation unit once, choosing its device."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from placement_env.envs.base import OracleFactory, PlacementEnv, as_int_action, check_init
from placement_env.generators import Generator

ORDERS = ("topological", "reverse", "random")
REWARD_MODES = ("dense", "final")
ACCEPT_MODES = ("all", "improve")
RESTART_MODES = ("init", "best")


class SweepEnv(PlacementEnv):
    """Placeto-style placement: one episode sweeps over every colocation unit once.

    The episode starts from a complete placement (``init``) that is scored by the
    oracle. At each step the *current* unit (``obs["current"]``) is put on the
    device the action names; the new placement is scored, and the reward is
    the decrease of its normalised cost. A unit is a colocation group (a forward
    op with its backward and optimizer nodes), so every placement respects
    colocation. Units are visited in ``order``.

    ## Action Space

    ``Discrete(max_devices)``: the device for the current unit. Indices of
    padding devices (``>= D``, masked by ``action_masks()``) are taken modulo
    ``D`` and flagged ``info["invalid_action"]``. Anything else (not one
    integer, out of range) raises ``ValueError``.

    ## Observation Space

    The shared padded ``Dict`` of ``docs/environments.md`` (all 1-D ``Box``):

    | key | dtype | shape | meaning |
    | --- | --- | --- | --- |
    | node_feat | float32 | (max_nodes*18,) | unit features (costs, memory, placement, current flag) |
    | edge_index | int64 | (2*max_edges,) | unit edges, sources then destinations |
    | edge_feat | float32 | (max_edges*5,) | edge bytes, direction, cut, transfer time |
    | device_feat | float32 | (max_devices*10,) | speed, memory, used/free memory, load |
    | link_feat | float32 | (max_devices*max_devices*2,) | route bandwidth and latency |
    | global_feat | float32 | (7,) | progress (units visited / U), efficiency, OOM, sizes |
    | placement | int64 | (max_nodes,) | device of each unit, -1 padding |
    | current | int64 | (1,) | unit to place now (-1 once the sweep is done) |
    | node_mask, edge_mask, device_mask | int8 | (max_nodes,), (max_edges,), (max_devices,) | 1 = real |

    ## Rewards

    ``r_t = cost(p_{t-1}) - cost(p_t)``, positive when the step time improves,
    where ``cost = step_time / lower_bound`` (clipped at 1e3) plus, if the
    placement runs out of memory, ``oom_penalty * (1 + overflow)`` with
    ``overflow = max_d(peak_d / capacity_d - 1)`` clipped at 10. The sum over
    an episode telescopes to ``cost(initial) - cost(final)``. ``lower_bound`` is
    the oracle's bound for the instance, so ``cost >= 1`` for a feasible plan.
    With ``reward_mode="final"`` the oracle is called only at reset and at the
    last step: every reward is 0 except the last, ``cost(initial) - cost(final)``
    (the same return, one oracle call per episode instead of ``U``; the
    observation's step-time and OOM features then stay at the initial placement's
    values until the end, and the info marks the unscored placement: ``scored``
    false, ``step_time`` and ``cost`` NaN).

    With ``accept="improve"`` (local search with the policy as the proposal, as in
    learned local rewriting, Chen & Tian NeurIPS 2019) a step whose new placement
    costs more than the current one is *rejected*: the unit goes back to its device
    (``info["rejected"]`` is true) and the reward is still ``cost(p_{t-1}) -
    cost(proposed)`` (negative), so the policy learns which moves not to propose. The
    placement never gets worse during an episode; returns no longer telescope.

    ## Episode End

    - Termination: every unit has been visited once (``U`` steps).
    - Truncation: none by the env (a ``TimeLimit`` may be added by ``gym.make``).

    ## Arguments

    - ``generator``: instance generator (default: ``gpt2-xl`` <= 256 groups on ``dgx1_v100_8``).
    - ``oracle_factory``: ``(graph, cluster) -> Oracle`` (default: Simulator, 8 microbatches, 1F1B).
    - ``order``: ``"topological"`` (default), ``"reverse"`` or ``"random"`` (drawn per episode).
    - ``init``: initial placement, ``"random"`` (default), ``"balanced"`` (contiguous equal-compute
      stages) or ``"zeros"`` (all on device 0), or a per-node placement array (device index
      per node, e.g. a baseline's plan) to warm-start every episode from it.
    - ``reward_mode``: ``"dense"`` (default, an oracle call per step) or ``"final"``.
    - ``accept``: ``"all"`` (default: every action is applied) or ``"improve"`` (a step that
      makes the cost worse is reverted; needs ``reward_mode="dense"``).
    - ``restart``: ``"init"`` (default: every episode starts from ``init``) or ``"best"``
      (an episode starts from the fastest memory-feasible placement this env has evaluated
      so far on the episode's instance, ``init`` until there is one: Placeto-style search
      that keeps its progress across episodes).
    - ``oom_penalty``: see Rewards (default 1.0).
    - ``max_nodes``, ``max_edges``, ``max_devices``: padding (default: the generator's bounds).
    - ``render_mode``: ``None`` or ``"ansi"``.

    ## Info

    ``step_time`` (s), ``best_step_time`` (best feasible this episode, inf if none),
    ``lower_bound`` (s), ``oom``, ``cost``, ``placement`` (int64 per node, graph order),
    ``scored`` (``step_time``, ``oom`` and ``cost`` are the oracle's answer for this
    ``placement``; when false -- ``reward_mode="final"`` before the last step -- they are
    NaN, false and NaN), ``oracle_calls`` (this episode), ``invalid_action``, ``instance``,
    and after a step ``rejected`` (``accept="improve"`` reverted the move).

    ## Version History

    - v0: initial version; ``accept`` and ``restart`` options added later (defaults unchanged);
      ``info["scored"]`` added, and an unscored placement's ``step_time`` is NaN (it was the
      previous placement's).
    """

    def __init__(
        self,
        generator: Generator | None = None,
        oracle_factory: OracleFactory | None = None,
        *,
        order: str = "topological",
        init: str | np.ndarray = "random",
        reward_mode: str = "dense",
        accept: str = "all",
        restart: str = "init",
        oom_penalty: float = 1.0,
        max_nodes: int | None = None,
        max_edges: int | None = None,
        max_devices: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        if order not in ORDERS:
            raise ValueError(f"order {order!r} is unknown; expected one of {ORDERS}")
        if reward_mode not in REWARD_MODES:
            raise ValueError(
                f"reward_mode {reward_mode!r} is unknown; expected one of {REWARD_MODES}"
            )
        if accept not in ACCEPT_MODES:
            raise ValueError(f"accept {accept!r} is unknown; expected one of {ACCEPT_MODES}")
        if accept == "improve" and reward_mode != "dense":
            raise ValueError(
                'accept="improve" scores every move: it needs reward_mode="dense", '
                f"got {reward_mode!r}"
            )
        if restart not in RESTART_MODES:
            raise ValueError(f"restart {restart!r} is unknown; expected one of {RESTART_MODES}")
        init = check_init(init)
        super().__init__(
            generator,
            oracle_factory,
            max_nodes=max_nodes,
            max_edges=max_edges,
            max_devices=max_devices,
            oom_penalty=oom_penalty,
            render_mode=render_mode,
        )
        self.order, self.init, self.reward_mode = order, init, reward_mode
        self.accept, self.restart = accept, restart
        self.action_space = spaces.Discrete(self.bounds.max_devices)
        self._order = np.zeros(0, dtype=np.int64)
        self._start_cost = 0.0
        # restart="best": instance key -> (step time s, unit placement) of the best feasible plan
        self._best: dict[tuple[str, str], tuple[float, np.ndarray]] = {}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        self._prep = self._load_instance()
        U = self.enc.num_units
        best = self._best.get(self.instance.key) if self.restart == "best" else None
        start = best[1] if best is not None else self._initial_placement(self.init)
        st = self._begin_episode(start)
        if self.order == "topological":
            self._order = np.arange(U, dtype=np.int64)
        elif self.order == "reverse":
            self._order = np.arange(U - 1, -1, -1, dtype=np.int64)
        else:
            self._order = self.np_random.permutation(U).astype(np.int64)
        st.current = int(self._order[0])
        _, self._start_cost = self._evaluate(st.placement)
        self._remember_best()
        return self._get_obs(), self._get_info()

    def _remember_best(self) -> None:
        """Keep the episode's placement if it is the fastest feasible one (``restart="best"``)."""
        st = self.state
        if self.restart != "best" or st is None or st.oom or not np.isfinite(st.step_time):
            return
        key = self.instance.key
        if key not in self._best or st.step_time < self._best[key][0]:
            self._best[key] = (float(st.step_time), st.placement.copy())

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        st = self.state
        if st is None or st.current < 0:
            raise RuntimeError("SweepEnv: call reset() before step() (the sweep is over)")
        d = as_int_action(action, self.bounds.max_devices, "SweepEnv action (device)")
        D = self.enc.num_devices
        self._invalid = d >= D
        d %= D
        before = st.cost
        unit, prev = st.current, int(st.placement[st.current])
        st.placement[unit] = d
        st.visited[unit] = True
        st.steps += 1
        terminated = st.steps >= self.enc.num_units
        after = before
        rejected = False
        if terminated or self.reward_mode == "dense":
            before = self._start_cost if self.reward_mode == "final" else before
            _, after = self._evaluate(st.placement)
            if self.accept == "improve" and after > before:
                st.placement[unit] = prev  # evaluated before this step: a cache hit, no call
                self._evaluate(st.placement)
                rejected = True
            self._remember_best()
        st.current = -1 if terminated else int(self._order[st.steps])
        info = self._get_info()
        info["rejected"] = rejected
        return self._get_obs(), float(before - after), terminated, False, info

    def _progress(self) -> float:
        st = self.state
        return st.steps / self.enc.num_units if st is not None else 0.0

    def action_masks(self) -> np.ndarray:
        """``(max_devices,)`` bool: real devices where the current unit's persistent state fits."""
        mask = np.zeros(self.bounds.max_devices, dtype=bool)
        st = self.state
        if st is None or st.current < 0:
            mask[: self.enc.num_devices if self._prep else 1] = True
            return mask
        mask[: self.enc.num_devices] = self._fits(st.current)
        return mask
