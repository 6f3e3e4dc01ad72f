"""hybrid_anneal: simulated annealing over hybrid layouts (degrees, microbatch, schedule, recompute, SP, ZeRO, stage boundaries)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from agents.baselines.common import InfeasiblePlanError, check_flag, check_seed
from agents.baselines.megatron_grid import (
    LayoutScorer,
    empty_grid_error,
    finish_hybrid,
    hybrid_arguments,
)
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
    stage_tp_choices,
    with_stage_recompute,
    with_stage_tp,
    with_stage_zero,
)
from graphs.plan import Plan
from graphs.schema import is_number
from placement_env.oracles.base import Oracle

#: Oracle calls when no budget is given.
DEFAULT_BUDGET = 2000


def _cost(r: Any, capacity: float) -> float:
    """Step time, scaled up by how far a plan overflows memory (so OOM plans still rank)."""
    over = float(r.peak_memory.max()) / capacity
    return float(r.step_time) * (1.0 if not r.oom else 10.0 * over)


def hybrid_anneal(
    graph: CompGraph,
    cluster: Cluster,
    oracle: Oracle,
    budget: int | None = None,
    /,
    *,
    global_batch: int | None = None,
    seed: int = 0,
    t0: float = 0.05,
    t1: float = 1e-4,
    microbatch_sizes: Sequence[int] = GRID_MICROBATCH_SIZES,
    virtual_stages: Sequence[int] = GRID_VIRTUAL_STAGES,
    recompute: Sequence[str] = RECOMPUTE,
    zero: Sequence[int] = ZERO_STAGES,
    sequence_parallel: Sequence[bool] = (False, True),
    max_tp: int | None = None,
    stage_recompute: bool = True,
    stage_zero: bool = False,
) -> Plan:
    """Simulated annealing over layouts, ``budget`` oracle calls (default 2000).

    State: a layout of the :func:`graphs.layout.layout_grid` space, or the same with moved stage
    boundaries or with stages on submeshes of their own shape. A move either replaces the
    intra-op/inter-op choice by a random grid neighbour differing in one field
    (``tp``/``pp``/``dp`` change together so that their product stays the device count),
    moves one stage boundary by one layer, or (``v = 1``, ``pp > 1``) gives one stage
    another ``tp`` on its own GPUs (:func:`graphs.layout.stage_tp_choices`; the layout's
    ``stage_meshes``) or, with ``stage_recompute`` (default), half of those times another
    recomputation mode of ``recompute`` (:func:`graphs.layout.with_stage_recompute`; the
    layout's ``stage_recompute``). With ``stage_zero`` (off by default, so the default search
    is unchanged) a third of the per-stage moves give one stage another ZeRO stage of
    ``zero`` instead (:func:`graphs.layout.with_stage_zero`; the layout's ``stage_zero``).
    Cost: the
    step time (x 10 x memory overflow for OOM layouts); acceptance is Metropolis on the
    log of the cost with a temperature falling geometrically from ``t0`` to ``t1``.
    Starts from the grid layout most like Megatron's defaults (largest ``tp`` within a
    node, fewest stages, microbatch 1, 1F1B, full recomputation, ZeRO-0).
    """
    start = time.perf_counter()
    for name, flag in (("stage_recompute", stage_recompute), ("stage_zero", stage_zero)):
        check_flag("hybrid_anneal", name, flag)
    seed = check_seed("hybrid_anneal", seed)  # None drew an unrepeatable search (fuzzing)
    for name, temp in (("t0", t0), ("t1", t1)):
        if not is_number(temp, 0.0, lo_open=True):
            raise ValueError(f"hybrid_anneal: {name} must be a temperature > 0, got {temp!r}")
    score = LayoutScorer(oracle)
    gb, budget = hybrid_arguments("hybrid_anneal", graph, global_batch, budget)
    microbatch_sizes, virtual_stages, recompute, zero, sequence_parallel, max_tp = check_grid_axes(
        "hybrid_anneal", microbatch_sizes=microbatch_sizes, virtual_stages=virtual_stages,
        recompute=recompute, zero=zero, sequence_parallel=sequence_parallel, max_tp=max_tp,
    ).values()  # fmt: skip
    space = list(
        layout_grid(
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
    )
    if not space:
        raise empty_grid_error(
            "hybrid_anneal", graph, cluster, gb, microbatch_sizes=microbatch_sizes,
            virtual_stages=virtual_stages, max_tp=max_tp,
        )  # fmt: skip
    budget = DEFAULT_BUDGET if budget is None else int(budget)
    rng = np.random.default_rng(seed)
    cap = float(cluster.devices[0].memory)
    keys = (
        "tp",
        "pp",
        "microbatch_size",
        "virtual_stages",
        "recompute",
        "sequence_parallel",
        "zero",
    )
    by_key: dict[tuple, list[int]] = {}
    for i, lay in enumerate(space):
        for k in keys:
            sig = tuple(
                getattr(lay, x)
                for x in keys
                if x != k and not (k in ("tp", "pp") and x in ("tp", "pp"))
            )
            by_key.setdefault((k, sig), []).append(i)

    def start_key(lay: HybridLayout) -> tuple:
        return (-lay.tp, lay.pp, lay.microbatch_size, lay.virtual_stages,
                lay.recompute != "full", lay.sequence_parallel, lay.zero)  # fmt: skip

    dims = model_dims(graph)
    mtp = int(cluster.meta.get("gpus_per_node", min(cluster.num_devices, 8)))
    if max_tp is not None:
        mtp = int(max_tp)

    def stage_move(lay: HybridLayout) -> HybridLayout | None:
        p = int(rng.integers(0, lay.pp))
        if stage_zero and rng.random() < 1 / 3:  # the stage's own ZeRO stage
            zs = [z for z in zero if z != lay.zeros[p]]
            return with_stage_zero(lay, p, int(rng.choice(zs))) if zs else None
        if stage_recompute and rng.random() < 0.5:  # the stage's own recomputation mode
            modes = [rc for rc in recompute if rc != lay.recomputes[p]]
            return with_stage_recompute(lay, p, str(rng.choice(modes))) if modes else None
        tps = stage_tp_choices(lay, p, heads=dims.heads, kv_heads=dims.kv_heads, max_tp=mtp)
        tps = [t for t in tps if t != lay.meshes[p][1]]
        return with_stage_tp(lay, p, int(rng.choice(tps))) if tps else None

    r = None
    for cur in sorted(space, key=start_key):  # the first the oracle can score
        r = score(cur)
        if r is not None:
            break
    if r is None:
        score.check_any_scored("hybrid_anneal", graph, cluster)
    calls = 1
    cur_c = _cost(r, cap)
    best, best_r, best_c = cur, r, cur_c
    # moves that give no layout (none in the grid, a boundary at the end) or one the oracle
    # cannot score cost no call; this many of them in a row end the search (a grid of one
    # layout used to loop forever)
    idle, max_idle = 0, 10_000
    while calls < budget and idle < max_idle:
        frac = calls / max(budget - 1, 1)
        temp = t0 * (t1 / t0) ** frac
        if cur.pp > 1 and cur.virtual_stages == 1 and rng.random() < 0.15:
            cand = stage_move(cur)
        else:
            cand = _neighbour(cur, space, by_key, keys, rng)
        r = None if cand is None else score(cand)
        if r is None:
            idle += 1
            continue
        idle = 0
        calls += 1
        c = _cost(r, cap)
        if c <= cur_c or rng.random() < math.exp(-(math.log(c) - math.log(cur_c)) / temp):
            cur, cur_c = cand, c
            if c < best_c:
                best, best_r, best_c = cand, r, c
    if best_r.oom:
        raise InfeasiblePlanError(
            f"hybrid_anneal: no memory-feasible layout found in {calls} oracle calls"
        )
    return finish_hybrid(
        graph, cluster, best, best_r, "hybrid_anneal", calls, start, seed=seed,
        **score.meta(), **({"stopped_without_moves": True} if idle >= max_idle else {}),
    )  # fmt: skip


def _neighbour(
    lay: HybridLayout,
    space: list[HybridLayout],
    by_key: dict[tuple, list[int]],
    keys: tuple[str, ...],
    rng: np.random.Generator,
) -> HybridLayout | None:
    if lay.num_chunks > 1 and rng.random() < 0.3:
        stages = [list(r) for r in lay.stage_layers]
        c = int(rng.integers(0, len(stages) - 1))  # boundary between chunk c and c + 1
        step = int(rng.choice((-1, 1)))
        b = stages[c][1] + step
        if not (stages[c][0] < b < stages[c + 1][1]):
            return None
        stages[c][1] = stages[c + 1][0] = b
        d = lay.to_dict()
        d["stage_layers"] = stages
        return HybridLayout.from_dict(d)
    k = keys[int(rng.integers(0, len(keys)))]
    sig = tuple(
        getattr(lay, x) for x in keys if x != k and not (k in ("tp", "pp") and x in ("tp", "pp"))
    )
    options = by_key.get((k, sig), [])
    if len(options) <= 1:
        return None
    new = space[int(options[int(rng.integers(0, len(options)))])]
    if new.num_chunks == lay.num_chunks and new.stage_layers != lay.stage_layers:
        return new
    if new.num_chunks != lay.num_chunks:
        return new
    # same chunk count: keep the current (possibly moved) boundaries
    d = new.to_dict()
    d["stage_layers"] = [list(r) for r in lay.stage_layers]
    try:
        return HybridLayout.from_dict(d)
    except ValueError:
        return new


__all__ = ["DEFAULT_BUDGET", "hybrid_anneal"]
