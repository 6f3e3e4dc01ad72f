"""The Oracle protocol and SimResult: what every placement evaluator returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan


@dataclass(frozen=True)
class ScheduleEvent:
    """One interval of the simulated step.

    ``resource`` is ``"device"`` (compute stream ``index``) or ``"link"`` (link ``index``);
    ``node`` is the node whose compute (or whose output tensor's transfer) this is;
    ``microbatch`` is -1 for once-per-step work (optimizer nodes). Times in seconds.
    """

    resource: str
    index: int
    node: int
    microbatch: int
    start: float
    end: float
    label: str = ""


@dataclass(frozen=True, eq=False)
class SimResult:
    """The outcome of evaluating one placement.

    Attributes:
        step_time: seconds per training step (makespan) or per sample (max_load).
        lower_bound: a bound no placement can beat, same unit as ``step_time``.
        oom: True when any device's peak memory exceeds its capacity.
        device_busy: ``float64[D]`` seconds of compute per device.
        peak_memory: ``float64[D]`` bytes.
        link_bytes: ``float64[L]`` bytes moved over each directed link of the cluster.
        objective: ``"makespan"`` or ``"max_load"``.
        events: the full schedule when requested, else ``None``.
        extra: objective-specific details (e.g. per-device load for max_load).
        infeasible_reason: why the placement cannot run at all (e.g. a node put on a
            device kind it has no kernel for), else ``None``; ``step_time`` is then inf.
    """

    step_time: float
    lower_bound: float
    oom: bool
    device_busy: np.ndarray
    peak_memory: np.ndarray
    link_bytes: np.ndarray
    objective: str = "makespan"
    events: tuple[ScheduleEvent, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    infeasible_reason: str | None = None

    @property
    def feasible(self) -> bool:
        return not self.oom and self.infeasible_reason is None

    def to_chrome_trace(self, graph: CompGraph, cluster: Cluster, path: str) -> None:
        """Write the recorded schedule as Chrome-trace / Perfetto JSON (see ``trace.py``)."""
        from placement_env.oracles.trace import write_chrome_trace

        write_chrome_trace(self, graph, cluster, path)

    def gantt(self, graph: CompGraph, cluster: Cluster, path: str) -> None:
        """Draw the recorded schedule as a Gantt chart PNG (see ``trace.py``)."""
        from placement_env.oracles.trace import plot_gantt

        plot_gantt(self, graph, cluster, path)

    def summary(self) -> dict[str, Any]:
        """JSON-friendly scalar summary."""
        return {
            "step_time": float(self.step_time),
            "lower_bound": float(self.lower_bound),
            "oom": bool(self.oom),
            "objective": self.objective,
            "peak_memory_max": float(np.max(self.peak_memory)) if len(self.peak_memory) else 0.0,
            "device_busy": [float(x) for x in self.device_busy],
        }


@runtime_checkable
class Oracle(Protocol):
    """Anything that scores a placement of ``graph`` on ``cluster``.

    ``evaluate`` takes an integer array (device index of each node, graph order)
    or a :class:`graphs.Plan` made for this graph and cluster, and returns a
    :class:`SimResult`. ``calls`` counts evaluations so far. Implementations
    raise ``ValueError`` for a wrong-length placement, an out-of-range device
    or a plan made for another graph/cluster.
    """

    graph: CompGraph
    cluster: Cluster
    calls: int

    def evaluate(self, placement: np.ndarray | Plan, *, record: bool = False) -> SimResult: ...
