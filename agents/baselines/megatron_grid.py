"""megatron_grid: exhaustive search over Megatron-LM style hybrid layouts (t, p, d, microbatch, v, recompute, SP, ZeRO)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from agents.baselines.common import InfeasiblePlanError, check_budget, fmt_bytes
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.layout import (
    GRID_MICROBATCH_SIZES,
    GRID_VIRTUAL_STAGES,
    RECOMPUTE,
    ZERO_STAGES,
    HybridLayout,
    check_grid_axes,
    layout_grid,
    model_dims,
)
from graphs.plan import Plan
from graphs.schema import is_whole
from placement_env.oracles.base import Oracle


def hybrid_oracle(oracle: Oracle) -> Any:
    """The ``evaluate_layout`` of an oracle (the :class:`Simulator`); ``ValueError`` otherwise."""
    f = getattr(oracle, "evaluate_layout", None)
    if f is None:
        raise ValueError(
            f"hybrid planners need an oracle that scores layouts (Simulator.evaluate_layout); "
            f"got {type(oracle).__name__}"
        )
    return f


class LayoutScorer:
    """Scores layouts with an oracle's ``evaluate_layout`` (:func:`hybrid_oracle`) and skips
    those it cannot score for want of calibration: on a calibrated ``cpu_N`` cluster,
    :class:`placement_env.oracles.hybrid_cpu.CpuHybridModel` has figures only for the
    ``(tp, microbatch size, recompute)`` that were measured, while the planners' default
    grids hold others (e.g. selective recomputation). A skipped layout returns ``None``,
    costs no oracle call and is counted (``skipped``, ``meta()``); the planners used to stop
    with the model's ``ValueError`` at the first one."""

    def __init__(self, oracle: Oracle) -> None:
        from placement_env.oracles.hybrid_cpu import UncalibratedLayoutError

        self._score = hybrid_oracle(oracle)
        self._uncalibrated = UncalibratedLayoutError
        self.skipped = 0
        self.scored = 0
        self.first_reason = ""

    def __call__(self, layout: HybridLayout) -> Any | None:
        try:
            res = self._score(layout)
        except self._uncalibrated as e:
            self.skipped += 1
            if not self.first_reason:
                self.first_reason = str(e)
            return None
        self.scored += 1
        return res

    def meta(self) -> dict[str, Any]:
        """``{"uncalibrated_skipped": n}`` when layouts were skipped, else empty."""
        return {"uncalibrated_skipped": self.skipped} if self.skipped else {}

    def check_any_scored(self, who: str, graph: CompGraph, cluster: Cluster) -> None:
        """Raise :class:`InfeasiblePlanError` when layouts were skipped and none was scored."""
        if self.scored == 0 and self.skipped:
            raise InfeasiblePlanError(
                f"{who}: none of the {self.skipped} layout(s) of "
                f"{graph.meta.get('name', '?')!r} tried on {cluster.name!r} could be scored: "
                f"the oracle has no calibrated figures for them, the first: {self.first_reason}"
            )

    def why(self) -> str:
        """A sentence for a planner's error when layouts were skipped ('' otherwise)."""
        if not self.skipped:
            return ""
        return (
            f"; {self.skipped} layout(s) skipped because the oracle has no calibrated figures "
            f"for them, the first: {self.first_reason}"
        )


def default_global_batch(graph: CompGraph) -> int:
    return int(model_dims(graph).batch)


def hybrid_arguments(
    who: str, graph: CompGraph, global_batch: Any, budget: Any
) -> tuple[int, int | None]:
    """``(global batch, budget)`` of a hybrid planner's call, checked: the batch an integer
    >= 1 (``None``: the model's, :func:`default_global_batch`), the budget an integer >= 1
    oracle call or ``None``. (A batch of 0 used to mean the default, ``"8"`` was read as 8,
    and a budget of 0 or -1 scored nothing and then reported that no layout fits.)"""

    if global_batch is not None and not is_whole(global_batch, 1):
        raise ValueError(
            f"{who}: global_batch must be an integer >= 1 (None: the model's batch), "
            f"got {global_batch!r}"
        )
    gb = default_global_batch(graph) if global_batch is None else int(global_batch)
    return gb, check_budget(who, budget, None)


def megatron_grid(
    graph: CompGraph,
    cluster: Cluster,
    oracle: Oracle,
    budget: int | None = None,
    /,
    *,
    global_batch: int | None = None,
    microbatch_sizes: Sequence[int] = GRID_MICROBATCH_SIZES,
    virtual_stages: Sequence[int] = GRID_VIRTUAL_STAGES,
    recompute: Sequence[str] = RECOMPUTE,
    zero: Sequence[int] = ZERO_STAGES,
    sequence_parallel: Sequence[bool] = (False, True),
    max_tp: int | None = None,
) -> Plan:
    """The fastest memory-feasible layout of :func:`graphs.layout.layout_grid`, scored by ``oracle``.

    ``budget`` caps the layouts scored (``None``: the whole grid); ``global_batch``
    defaults to the graph's batch; the other keywords are the grid's axes. Ties keep the first layout in grid order.
    Raises :class:`InfeasiblePlanError` when no layout fits in memory.
    """
    t0 = time.perf_counter()
    score = LayoutScorer(oracle)
    gb, budget = hybrid_arguments("megatron_grid", graph, global_batch, budget)
    microbatch_sizes, virtual_stages, recompute, zero, sequence_parallel, max_tp = check_grid_axes(
        "megatron_grid", microbatch_sizes=microbatch_sizes, virtual_stages=virtual_stages,
        recompute=recompute, zero=zero, sequence_parallel=sequence_parallel, max_tp=max_tp,
    ).values()  # fmt: skip
    best, best_res, calls, least_mem = None, None, 0, float("inf")
    space = layout_grid(
        graph,
        cluster,
        global_batch=gb,
        microbatch_sizes=microbatch_sizes,
        virtual_stages=virtual_stages,
        recompute=recompute,
        zero=zero,
        sequence_parallel=sequence_parallel,
        max_tp=max_tp,
    )
    for lay in space:
        if budget is not None and calls >= budget:
            break
        r = score(lay)
        if r is None:  # not calibrated: skipped, no call
            continue
        calls += 1
        if r.oom:
            least_mem = min(least_mem, float(r.peak_memory.max()))
            continue
        if best_res is None or r.step_time < best_res.step_time:
            best, best_res = lay, r
    if best is None:
        score.check_any_scored("megatron_grid", graph, cluster)
        if calls == 0:
            raise empty_grid_error(
                "megatron_grid", graph, cluster, gb, microbatch_sizes=microbatch_sizes,
                virtual_stages=virtual_stages, max_tp=max_tp,
            )  # fmt: skip
        raise InfeasiblePlanError(
            f"megatron_grid: none of {calls} layouts of {graph.meta.get('name', '?')!r} fits "
            f"on {cluster.name!r} (least peak memory {fmt_bytes(least_mem)}){score.why()}"
        )
    return finish_hybrid(graph, cluster, best, best_res, "megatron_grid", calls, t0, **score.meta())


def empty_grid_error(
    who: str, graph: CompGraph, cluster: Cluster, global_batch: int, **axes: Any
) -> InfeasiblePlanError:
    """The error of a planner whose layout space is empty: no ``dp x tp x pp`` layout of
    ``axes`` satisfies the divisibility rules (not a memory failure; found by fuzzing:
    it read "least peak memory inf")."""
    d = model_dims(graph)
    shown = ", ".join(
        f"{k}={list(v) if isinstance(v, (list, tuple)) else v}" for k, v in axes.items()
    )
    return InfeasiblePlanError(
        f"{who}: no layout of {graph.meta.get('name', '?')!r} on {cluster.num_devices} GPUs of "
        f"{cluster.name!r} satisfies the layout rules with global_batch={global_batch}, {shown} "
        f"(dp x microbatch_size must divide the global batch; tp the {d.heads} heads and "
        f"{d.kv_heads} kv heads, at most the GPUs per node; pp x virtual_stages at most the "
        f"{d.layers} layers, virtual_stages > 1 needs pp > 1 dividing the microbatches): "
        "change global_batch or the grid's axes",
        oom=False,
    )


def finish_hybrid(
    graph: CompGraph,
    cluster: Cluster,
    layout: HybridLayout,
    res: Any,
    algorithm: str,
    calls: int,
    t0: float,
    **extra: Any,
) -> Plan:
    """The :class:`Plan` of a hybrid planner's answer, with the usual ``meta``."""
    meta = {
        "algorithm": algorithm,
        "step_time": float(res.step_time),
        "oracle_calls": int(calls),
        "search_seconds": time.perf_counter() - t0,
        "tflops_per_gpu": float(res.model_flops_per_device) / 1e12,
        "mfu": float(res.mfu),
        "memory_per_gpu": float(res.peak_memory.max()),
        **extra,
    }
    return Plan.from_layout(graph, cluster, layout, meta=meta)


#: The grid of layouts (:func:`graphs.layout.layout_grid`), under its planner's name.
grid = layout_grid

__all__ = ["LayoutScorer", "finish_hybrid", "grid", "hybrid_oracle", "megatron_grid"]
