"""megatron_grid: exhaustive search over Megatron-LM style hybrid layouts (t, p, d, microbatch, v, recompute, SP, ZeRO)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from typing import Any

from agents.baselines.common import InfeasiblePlanError, fmt_bytes
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.layout import HybridLayout, balanced_stage_layers, model_dims
from graphs.plan import Plan
from placement_env.oracles.base import Oracle

#: Default axes of the grid.
MICROBATCH_SIZES = (1, 2, 4, 8)
VIRTUAL_STAGES = (1, 2, 3, 4, 6, 8)
RECOMPUTE = ("none", "selective", "full")
ZERO = (0, 1, 2, 3)


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def hybrid_oracle(oracle: Oracle) -> Any:
    """The ``evaluate_layout`` of an oracle (the :class:`Simulator`); ``ValueError`` otherwise."""
    f = getattr(oracle, "evaluate_layout", None)
    if f is None:
        raise ValueError(
            f"hybrid planners need an oracle that scores layouts (Simulator.evaluate_layout); "
            f"got {type(oracle).__name__}"
        )
    return f


def default_global_batch(graph: CompGraph) -> int:
    return int(model_dims(graph).batch)


def grid(
    graph: CompGraph,
    cluster: Cluster,
    *,
    global_batch: int,
    microbatch_sizes: Sequence[int] = MICROBATCH_SIZES,
    virtual_stages: Sequence[int] = VIRTUAL_STAGES,
    recompute: Sequence[str] = RECOMPUTE,
    zero: Sequence[int] = ZERO,
    sequence_parallel: Sequence[bool] = (False, True),
    max_tp: int | None = None,
) -> Iterator[HybridLayout]:
    """Every valid layout of the grid (balanced stages): ``t`` divides the heads (and
    the kv heads, or they divide it) and at most ``max_tp`` (default: GPUs per node),
    ``p`` at most the layers, ``d = D / (t p)``, microbatch sizes that split the
    batch, ``v`` with ``p v <= layers`` (interleaved when ``v > 1``), every
    recomputation, SP (when ``t > 1``) and ZeRO stage."""
    d = model_dims(graph)
    D = cluster.num_devices
    if max_tp is None:
        max_tp = int(cluster.meta.get("gpus_per_node", min(D, 8)))
    for t in divisors(D):
        if t > max_tp or d.heads % t or (d.kv_heads % t and t % d.kv_heads):
            continue
        for p in divisors(D // t):
            if p > d.layers:
                continue
            dp = D // (t * p)
            for mbs in microbatch_sizes:
                if global_batch % (dp * mbs):
                    continue
                m = global_batch // (dp * mbs)
                for v in virtual_stages:
                    if v > 1 and (p == 1 or m % p or p * v > d.layers):
                        continue
                    stages = balanced_stage_layers(d.layers, p * v)
                    sched = "interleaved" if v > 1 else "1f1b"
                    for rc, sp, z in itertools.product(recompute, sequence_parallel, zero):
                        if sp and t == 1:
                            continue
                        if z and dp == 1:
                            continue
                        yield HybridLayout(
                            dp=dp, tp=t, pp=p, microbatch_size=mbs, global_batch=global_batch,
                            virtual_stages=v, recompute=rc, sequence_parallel=sp, zero=z,
                            schedule=sched, stage_layers=stages,
                        )  # fmt: skip


def megatron_grid(
    graph: CompGraph,
    cluster: Cluster,
    oracle: Oracle,
    budget: int | None = None,
    /,
    *,
    global_batch: int | None = None,
    **grid_options: Any,
) -> Plan:
    """The fastest memory-feasible layout of :func:`grid`, scored by ``oracle``.

    ``budget`` caps the layouts scored (``None``: the whole grid); ``global_batch``
    defaults to the graph's batch. Ties keep the first layout in grid order.
    Raises :class:`InfeasiblePlanError` when no layout fits in memory.
    """
    t0 = time.perf_counter()
    score = hybrid_oracle(oracle)
    gb = int(global_batch or default_global_batch(graph))
    best, best_res, calls, least_mem = None, None, 0, float("inf")
    for lay in grid(graph, cluster, global_batch=gb, **grid_options):
        if budget is not None and calls >= budget:
            break
        r = score(lay)
        calls += 1
        if r.oom:
            least_mem = min(least_mem, float(r.peak_memory.max()))
            continue
        if best_res is None or r.step_time < best_res.step_time:
            best, best_res = lay, r
    if best is None:
        raise InfeasiblePlanError(
            f"megatron_grid: none of {calls} layouts of {graph.meta.get('name', '?')!r} fits "
            f"on {cluster.name!r} (least peak memory {fmt_bytes(least_mem)})"
        )
    return finish_hybrid(graph, cluster, best, best_res, "megatron_grid", calls, t0)


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


__all__ = ["finish_hybrid", "grid", "hybrid_oracle", "megatron_grid"]
