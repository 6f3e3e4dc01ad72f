"""ProfiledOracle: the Oracle protocol answered by executing plans on this machine (cached by plan hash)."""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np

from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from placement_env.oracles.base import SimResult
from placement_env.oracles.simulator import SCHEDULES, Simulator
from runtime.execute import ExecResult, execute
from runtime.launch import RankFailure
from runtime.spec import plan_hash

#: Substrings of a rank's error that mean it ran out of memory.
OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_oom_failure(exc: RankFailure) -> bool:
    """True when a rank failed because an allocation failed (``MemoryError``, allocator messages)."""
    return exc.error_type == "MemoryError" or any(m in exc.message.lower() for m in OOM_MESSAGES)


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
        predict_oom: refuse, without running it, a plan that the simulator on the same
            cluster predicts over a device's ``memory`` (reported ``oom``).
        cache: an optional mapping shared with other oracles of the same model and
            options (e.g. every oracle a ``runners.common.ProfiledFactory`` makes), so a
            plan is measured once per run; by default each oracle has its own.
        execute_options: passed on to :func:`runtime.execute.execute` (threads, backend, ...).

    ``evaluate`` returns a :class:`SimResult` whose ``step_time`` is the measured
    median step time (seconds), ``device_busy`` the measured compute seconds per
    cluster device, ``peak_memory`` each device's measured process peak
    (:attr:`runtime.execute.ExecResult.peak_memory`: the whole process, Python and torch
    included), ``extra["measured"]`` the full :class:`ExecResult`, ``events`` ``None``
    (the runtime measures per-rank totals, not a timeline).

    Hybrid plans (``Plan.hybrid``) run in the runtime's hybrid mode; their OOM pre-check is
    the simulator's hybrid model on this cluster, which on a ``cpu_N`` calibrated with a
    ``hybrid`` section is the measured :class:`~placement_env.oracles.hybrid_cpu.CpuHybridModel`
    (process baseline + build + weights, gradients, optimizer state per ZeRO stage and
    activations); ``extra["step_memory"]`` holds each rank's measured step memory
    (:attr:`runtime.execute.ExecResult.step_memory`).

    Memory: each device's ``memory`` is the per-process cap. A plan is ``oom`` when
    its measured peak exceeds the cap of its device, when a rank failed allocating
    (``MemoryError``, "out of memory"), or, with ``predict_oom``, when the simulator
    predicts it over the cap (then nothing runs; ``extra["oom"]`` says which).
    A plan whose run fails in any other way (a :class:`runtime.launch.RankFailure`)
    is infeasible: ``step_time`` inf and ``infeasible_reason`` the rank's error; it is
    not retried within this oracle's cache nor written to ``cache_dir``.

    ``lower_bound`` is that of a :class:`Simulator` on the same graph and cluster (the
    calibrated simulator when the cluster is calibrated, see ``graphs.cpu_cluster``).
    Identical plans (same hash) are run once; ``calls`` counts evaluations including
    cache hits, ``runs`` actual runs.

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
        predict_oom: bool = True,
        cache: MutableMapping[str, SimResult] | None = None,
        **execute_options: Any,
    ) -> None:
        self.graph = graph
        self.cluster = cluster
        self.model = dict(model)
        self.microbatches = int(microbatches)
        self.schedule = schedule
        self.steps, self.warmup = int(steps), int(warmup)
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.predict_oom = bool(predict_oom)
        self.execute_options = execute_options
        self.calls = 0
        self.runs = 0
        self._cache: MutableMapping[str, SimResult] = {} if cache is None else cache
        self._sims: dict[tuple[int, str], Simulator] = {}

    # ------------------------------------------------------------------ API
    def lower_bound(self) -> float:
        """The simulator's lower bound on this graph and cluster (seconds)."""
        return self._simulator(self.microbatches, self.schedule).lower_bound()

    def evaluate(self, placement_or_plan: np.ndarray | Plan, *, record: bool = False) -> SimResult:
        """Measured step time of the plan (``record`` is accepted; no schedule is recorded)."""
        plan = self._plan(placement_or_plan)
        self.calls += 1
        key = plan_hash(plan)
        if key in self._cache:
            return self._cache[key]
        path = self.cache_dir / f"{key}.json" if self.cache_dir else None
        predicted = self._predicted_oom(plan)
        if predicted is not None:
            res = predicted
        elif path is not None and path.exists():
            res = self._to_sim(plan, ExecResult(**json.loads(path.read_text())))
        else:
            try:
                ex = execute(
                    plan,
                    self.graph,
                    self.cluster,
                    model=self.model,
                    steps=self.steps,
                    warmup=self.warmup,
                    **self.execute_options,
                )
            except RankFailure as exc:
                self.runs += 1
                res = self._failed(plan, exc)
            else:
                self.runs += 1
                if path is not None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    ex.save(path)
                res = self._to_sim(plan, ex)
        self._cache[key] = res
        return res

    # ------------------------------------------------------------ internals
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

    def _simulator(self, microbatches: int, schedule: str) -> Simulator:
        # the simulator has no interleaved schedule; 1F1B's memory and bound stand in for it
        key = (int(microbatches), schedule if schedule in SCHEDULES else "1f1b")
        if key not in self._sims:
            self._sims[key] = Simulator(
                self.graph, self.cluster, microbatches=key[0], schedule=key[1]
            )
        return self._sims[key]

    def _caps(self) -> np.ndarray:
        return np.array([d.memory for d in self.cluster.devices], dtype=np.float64)

    def _predicted_oom(self, plan: Plan) -> SimResult | None:
        """The simulator's OOM verdict when it predicts the plan over a device's cap, else None."""
        if not self.predict_oom:
            return None
        sim = self._simulator(plan.microbatches, plan.schedule)
        if plan.layout is not None:  # the hybrid step model (calibrated on a calibrated cpu_N)
            pred = sim.evaluate(plan)
            what = f"the hybrid model ({type(sim._hybrid).__name__})"
        else:
            pred = sim.evaluate(np.asarray(plan.placement, dtype=np.int64))
            what = "the simulator"
        if not pred.oom:
            return None
        caps = self._caps()
        d = int(np.argmax(pred.peak_memory - caps))
        return self._result(
            step_time=float("inf"),
            oom=True,
            peak=np.asarray(pred.peak_memory, dtype=np.float64),
            extra={
                "oom": f"predicted: {what} puts {self.cluster.devices[d].name} at "
                f"{pred.peak_memory[d] / 2**20:.1f} MiB, over its {caps[d] / 2**20:.1f} MiB cap; "
                "not run"
            },
        )

    def _failed(self, plan: Plan, exc: RankFailure) -> SimResult:
        oom = is_oom_failure(exc)
        return self._result(
            step_time=float("inf"),
            oom=oom,
            peak=np.zeros(self.cluster.num_devices),
            extra={"oom": f"rank {exc.rank} failed allocating: {exc.message}"} if oom else {},
            infeasible_reason=None if oom else f"the run failed: {exc}",
        )

    def _to_sim(self, plan: Plan, ex: ExecResult) -> SimResult:
        D = self.cluster.num_devices
        busy, peak = np.zeros(D), np.zeros(D)
        for i, dev in enumerate(ex.devices):
            busy[dev] = ex.compute[i]
            if i < len(ex.peak_memory):
                peak[dev] = max(peak[dev], ex.peak_memory[i])
        caps = self._caps()
        over = np.flatnonzero(peak > caps)
        extra: dict[str, Any] = {"measured": ex.to_dict()}
        if ex.step_memory:
            extra["step_memory"] = list(ex.step_memory)  # per rank: what the steps add
        if len(over):
            d = int(over[0])
            extra["oom"] = (
                f"measured: {self.cluster.devices[d].name}'s process peaked at "
                f"{peak[d] / 2**20:.1f} MiB, over its {caps[d] / 2**20:.1f} MiB cap"
            )
        return self._result(
            step_time=ex.step_time, oom=bool(len(over)), peak=peak, busy=busy, extra=extra
        )

    def _result(
        self,
        *,
        step_time: float,
        oom: bool,
        peak: np.ndarray,
        busy: np.ndarray | None = None,
        extra: dict[str, Any],
        infeasible_reason: str | None = None,
    ) -> SimResult:
        D = self.cluster.num_devices
        return SimResult(
            step_time=float(step_time),
            lower_bound=self.lower_bound(),
            oom=bool(oom),
            device_busy=np.zeros(D) if busy is None else busy,
            peak_memory=peak,
            link_bytes=np.zeros(len(self.cluster.links)),
            objective="makespan",
            events=None,
            extra=extra,
            infeasible_reason=infeasible_reason,
        )
