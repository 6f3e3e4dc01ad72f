"""ProfiledOracle: the Oracle protocol answered by executing plans on this machine (cached by plan hash)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from placement_env.oracles.base import SimResult
from runtime.execute import ExecResult, execute
from runtime.spec import plan_hash


class ProfiledOracle:
    """Scores a placement by running it with ``runtime.execute`` (small models only).

    Args:
        graph, cluster: what placements are for (``cluster`` is usually ``cpu_N``).
        model: the model spec (``{"name": zoo_name, "config": {...}}`` or
            ``{"factory": "pkg.mod:fn", "config": {...}}``) whose exported program
            has ``graph``'s forward node names.
        microbatches, schedule: used for plain placement arrays (a ``Plan`` keeps its own).
        steps, warmup: timed and warm-up steps per evaluation.
        cache_dir: optional folder; results are also kept there as JSON by plan hash.
        execute_options: passed on to :func:`runtime.execute.execute` (threads, backend, ...).

    ``evaluate`` returns a :class:`SimResult` whose ``step_time`` is the measured
    median step time (seconds), ``device_busy`` the measured compute seconds per
    cluster device, ``extra`` the full :class:`ExecResult`. Memory is not measured:
    ``peak_memory`` is zeros and ``oom`` is False unless the run failed with an
    out-of-memory error. ``lower_bound`` is 0. Identical plans (same hash) are run
    once; ``calls`` counts evaluations including cache hits, ``runs`` actual runs.

    A plan the runtime cannot run is refused with a ``ValueError`` naming the field
    before anything is launched: ``schedule="interleaved"`` without pipeline stages
    here, the rest by :func:`runtime.spec.make_run_spec` (e.g. unequal ``tp_degree``
    values, several stages on one device without ``interleaved``).
    """

    def __init__(
        self,
        graph: CompGraph,
        cluster: Cluster,
        *,
        model: Mapping[str, Any],
        microbatches: int = 1,
        schedule: str = "1f1b",
        steps: int = 5,
        warmup: int = 2,
        cache_dir: str | Path | None = None,
        **execute_options: Any,
    ) -> None:
        self.graph = graph
        self.cluster = cluster
        self.model = dict(model)
        self.microbatches = int(microbatches)
        self.schedule = schedule
        self.steps, self.warmup = int(steps), int(warmup)
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.execute_options = execute_options
        self.calls = 0
        self.runs = 0
        self._cache: dict[str, SimResult] = {}

    def _plan(self, placement_or_plan: np.ndarray | Plan) -> Plan:
        if isinstance(placement_or_plan, Plan):
            plan = placement_or_plan
            staged = plan.stage is not None and plan.stage_device is not None
            if plan.schedule == "interleaved" and not staged and plan.layout is None:
                raise ValueError(
                    "ProfiledOracle: Plan.schedule='interleaved' needs pipeline stages "
                    "(Plan.stage and Plan.stage_device) or a hybrid layout; an op placement runs in the op-level "
                    "runtime's own order, which has no interleaved schedule"
                )
            plan.check(self.graph, self.cluster)
            return plan
        return Plan.for_graph(
            np.asarray(placement_or_plan),
            self.graph,
            self.cluster,
            microbatches=self.microbatches,
            schedule=self.schedule,
        )

    def evaluate(self, placement_or_plan: np.ndarray | Plan, *, record: bool = False) -> SimResult:
        """Measured step time of the plan (``record`` is accepted; no schedule is recorded)."""
        plan = self._plan(placement_or_plan)
        self.calls += 1
        key = plan_hash(plan)
        if key in self._cache:
            return self._cache[key]
        path = self.cache_dir / f"{key}.json" if self.cache_dir else None
        if path is not None and path.exists():
            res = self._to_sim(ExecResult(**json.loads(path.read_text())))
        else:
            ex = execute(
                plan,
                self.graph,
                self.cluster,
                model=self.model,
                steps=self.steps,
                warmup=self.warmup,
                **self.execute_options,
            )
            self.runs += 1
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                ex.save(path)
            res = self._to_sim(ex)
        self._cache[key] = res
        return res

    def _to_sim(self, ex: ExecResult) -> SimResult:
        D = self.cluster.num_devices
        busy = np.zeros(D)
        for dev, c in zip(ex.devices, ex.compute):
            busy[dev] = c
        return SimResult(
            step_time=ex.step_time,
            lower_bound=0.0,
            oom=False,
            device_busy=busy,
            peak_memory=np.zeros(D),
            link_bytes=np.zeros(len(self.cluster.links)),
            objective="makespan",
            events=None,
            extra={"measured": ex.to_dict()},
        )
