"""alpa: Alpa-style hybrid planner -- an inter-op split of the layers into pipeline stages for each intra-op choice."""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence

import numpy as np

from agents.baselines.common import InfeasiblePlanError, fmt_bytes
from agents.baselines.megatron_grid import finish_hybrid, hybrid_arguments, hybrid_oracle
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.layout import (
    GRID_MICROBATCH_SIZES,
    RECOMPUTE,
    ZERO_STAGES,
    HybridLayout,
    layout_grid,
)
from graphs.plan import Plan
from placement_env.oracles.base import Oracle
from placement_env.oracles.hybrid import HybridModel


def split_layers(
    layers: int, stages: int, layer: float, first: float, last: float
) -> tuple[tuple[int, int], ...]:
    """Contiguous ranges of ``layers`` layers in ``stages`` non-empty stages minimising the
    largest stage time, a stage of ``k`` layers costing ``k * layer`` plus ``first`` (the
    first stage) and ``last`` (the last stage).

    This is Alpa's inter-op objective (Zheng et al. OSDI'22, eq. 2: ``sum_i t_i + (m - 1)
    max_i t_i``) for one submesh shape: the sum is the same for every split, so the
    optimum minimises the maximum. Exact: binary search over the candidate maxima
    ``k * layer + {0, first, last, first + last}`` with a greedy feasibility check.
    """
    if not 1 <= stages <= layers:
        raise ValueError(f"split_layers: cannot split {layers} layers into {stages} stages")

    def fits(tmax: float) -> tuple[tuple[int, int], ...] | None:
        # fill stages greedily from the last one backwards, leaving >= 1 layer per stage
        out = []
        stop = layers
        for s in range(stages - 1, -1, -1):
            extra = (first if s == 0 else 0.0) + (last if s == stages - 1 else 0.0)
            if s == 0:
                k = stop
            else:
                k = int(np.floor((tmax - extra) / layer + 1e-9)) if layer > 0 else stop - s
                k = min(k, stop - s)
            if k < 1 or k * layer + extra > tmax * (1 + 1e-12):
                return None
            out.append((stop - k, stop))
            stop -= k
        return tuple(reversed(out))

    cands = sorted(
        {k * layer + e for k in range(1, layers + 1) for e in (0.0, first, last, first + last)}
    )
    lo = bisect.bisect_left(cands, max(first, last))
    hi = len(cands) - 1
    best = fits(cands[hi]) or fits(layers * layer + first + last)
    while lo <= hi:
        mid = (lo + hi) // 2
        r = fits(cands[mid])
        if r is None:
            lo = mid + 1
        else:
            best, hi = r, mid - 1
    assert best is not None
    return best


def alpa(
    graph: CompGraph,
    cluster: Cluster,
    oracle: Oracle,
    budget: int | None = None,
    /,
    *,
    global_batch: int | None = None,
    microbatch_sizes: Sequence[int] = GRID_MICROBATCH_SIZES,
    recompute: Sequence[str] = RECOMPUTE,
    zero: Sequence[int] = ZERO_STAGES,
    sequence_parallel: Sequence[bool] = (False, True),
    max_tp: int | None = None,
) -> Plan:
    """Alpa-style planner over hybrid layouts.

    For every intra-op choice (``tp`` and ``dp`` of the stage submesh, microbatch size,
    recomputation, SP, ZeRO) and pipeline depth ``pp`` of :func:`graphs.layout.layout_grid`
    (``v = 1``), the per-layer and end-stage costs of that choice
    (:meth:`HybridModel.stage_costs`) feed the inter-op split :func:`split_layers`; the
    resulting layout (and the balanced one, if the split one does not fit) is scored by
    the oracle. Differences from Alpa: every stage uses the same submesh shape (a
    :class:`HybridLayout` has one ``dp x tp``), and the intra-op space is Megatron's
    (column/row TP, SP, ZeRO) rather than an ILP over every operator's sharding.
    ``budget`` caps oracle calls.
    """
    t0 = time.perf_counter()
    score = hybrid_oracle(oracle)
    model = HybridModel(graph, cluster)
    gb, budget = hybrid_arguments("alpa", graph, global_batch, budget)
    best: HybridLayout | None = None
    best_res, calls, least = None, 0, float("inf")
    space = layout_grid(
        graph,
        cluster,
        global_batch=gb,
        microbatch_sizes=microbatch_sizes,
        virtual_stages=(1,),
        recompute=recompute,
        zero=zero,
        sequence_parallel=sequence_parallel,
        max_tp=max_tp,
    )
    for lay in space:
        if budget is not None and calls >= budget:
            break
        tries = [lay]
        if lay.pp > 1:
            c = model.stage_costs(lay)
            calls += 1
            split = split_layers(lay.num_layers, lay.pp, c["layer"], c["first"], c["last"])
            if split != lay.stage_layers:
                tries.insert(0, _with_stages(lay, split))
        for cand in tries:
            r = score(cand)
            calls += 1
            if r.oom:
                least = min(least, float(r.peak_memory.max()))
                continue
            if best_res is None or r.step_time < best_res.step_time:
                best, best_res = cand, r
            break
    if best is None:
        raise InfeasiblePlanError(
            f"alpa: no layout of {graph.meta.get('name', '?')!r} fits on {cluster.name!r} "
            f"(least peak memory {fmt_bytes(least)})"
        )
    return finish_hybrid(graph, cluster, best, best_res, "alpa", calls, t0)


def _with_stages(lay: HybridLayout, stages: tuple[tuple[int, int], ...]) -> HybridLayout:
    d = lay.to_dict()
    d["stage_layers"] = [list(r) for r in stages]
    return HybridLayout.from_dict(d)


__all__ = ["alpa", "split_layers"]
