"""SB3 callbacks for placement training: follow env infos and keep the best feasible plan."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback


class BestPlanTracker(BaseCallback):
    """Keeps the best feasible placement seen in the envs' ``info`` dicts during training.

    Every step, each env's info is read: an info whose ``step_time`` is of its own
    ``placement`` (``scored`` not false), finite, with ``oom`` false and a complete
    ``placement`` (no ``-1``) is a feasible plan; the fastest one is kept. The
    number of oracle calls is the sum of the envs' ``total_oracle_calls`` (cached
    re-evaluations are free), else the count of evaluated infos.

    Attributes:
        best_step_time: seconds (``inf`` until a feasible plan is seen).
        best_placement: ``int64[n]`` per-node placement of the best plan, or ``None``.
        best_info: the info dict of the best plan (``instance``, ``lower_bound``, ...).
        oracle_calls: oracle evaluations so far.
        history: learning-curve points, one per finished episode and per
            improvement: ``timesteps``, ``oracle_calls``, ``wall_s``, ``step_time``
            (that episode's last), ``best_step_time``, ``oom``, ``event``
            (``"episode"`` or ``"improve"``).

    Args:
        on_improve: called with the tracker after each improvement (progress bars, logging).
        instance: keep only infos whose ``instance`` equals this name (``None`` = all).
        log_key: the SB3 logger key of the best step time (``runners.train`` passes
            ``placement/best_step_time_training_graphs`` on generator runs, whose best is of
            sampled training graphs, not of the reported problem).
        verbose: SB3 verbosity.
    """

    def __init__(
        self,
        on_improve: Callable[[BestPlanTracker], None] | None = None,
        *,
        instance: str | None = None,
        log_key: str = "placement/best_step_time",
        verbose: int = 0,
    ) -> None:
        super().__init__(verbose)
        if on_improve is not None and not callable(on_improve):
            # on_improve=5 failed inside model.learn, "'int' object is not callable" (fuzzing)
            raise TypeError(
                f"BestPlanTracker: on_improve must be callable or None, got {on_improve!r}"
            )
        self.on_improve = on_improve
        self.instance = instance
        self.log_key = log_key
        self.best_step_time = float("inf")
        self.best_placement: np.ndarray | None = None
        self.best_info: dict[str, Any] = {}
        self.oracle_calls = 0
        self.history: list[dict[str, Any]] = []
        self._evaluated = 0
        self._t0 = time.perf_counter()

    def _on_training_start(self) -> None:
        self._t0 = time.perf_counter()

    @property
    def started_at(self) -> float:
        """``time.perf_counter()`` when this session's training started (``wall_s`` counts from it)."""
        return self._t0

    def _count_calls(self) -> int:
        try:
            return int(sum(self.training_env.get_attr("total_oracle_calls")))
        except AttributeError:
            return self._evaluated

    def _point(self, event: str, info: dict[str, Any]) -> dict[str, Any]:
        return {
            "event": event,
            "timesteps": int(self.num_timesteps),
            "oracle_calls": int(self.oracle_calls),
            "wall_s": time.perf_counter() - self._t0,
            "step_time": float(info.get("step_time", float("nan"))),
            "best_step_time": self.best_step_time,
            "oom": bool(info.get("oom", False)),
        }

    def _on_step(self) -> bool:
        infos = self.locals.get("infos") or []
        dones = self.locals.get("dones")
        improved: dict[str, Any] | None = None
        for i, info in enumerate(infos):
            if self.instance is not None and info.get("instance") != self.instance:
                continue
            t = float(info.get("step_time", float("nan")))
            if np.isfinite(t):
                self._evaluated += 1
            placement = info.get("placement")
            feasible = (
                np.isfinite(t)
                and info.get("scored", True)
                and not info.get("oom", True)
                and placement is not None
                and bool((np.asarray(placement) >= 0).all())
            )
            if feasible and t < self.best_step_time:
                self.best_step_time = t
                self.best_placement = np.asarray(placement, dtype=np.int64).copy()
                self.best_info = dict(info)
                improved = info
            if dones is not None and bool(dones[i]):
                self.oracle_calls = self._count_calls()
                self.history.append(self._point("episode", info))
        self.oracle_calls = self._count_calls()
        if improved is not None:
            self.history.append(self._point("improve", improved))
            self.logger.record(self.log_key, self.best_step_time)
            self.logger.record("placement/oracle_calls", self.oracle_calls)
            if self.verbose:
                print(
                    f"[BestPlanTracker] step {self.num_timesteps}: best step time "
                    f"{self.best_step_time:.6g}s after {self.oracle_calls} oracle calls"
                )
            if self.on_improve is not None:
                self.on_improve(self)
        return True
