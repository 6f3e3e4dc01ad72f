"""`expert`: the hand rule of GPipe (Huang et al., NeurIPS 2019) and Megatron-LM (Shoeybi et al., 2019).

Cut a topological order of the colocation units into one contiguous stage per
device, at layer boundaries, so that each stage's compute cost is proportional
to its device's speed (equal cost on identical devices), and give consecutive
stages to devices joined by the fastest links (:func:`device_chain`). It
optimises nothing beyond that balance. If a stage then overflows its device's
memory, the rule falls back to the contiguous split with the smallest
bottleneck compute that fits (binary search over the bottleneck with greedy
filling), as a practitioner would shift layers between stages.
"""

from __future__ import annotations

import numpy as np

from agents.baselines.common import (
    InfeasiblePlanError,
    Problem,
    device_chain,
    finish,
    make_problem,
    mean_finite,
    oracle_calls_start,
    usable_chain,
)
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from placement_env.oracles.base import Oracle


def unit_weights(prob: Problem) -> np.ndarray:
    """Reference compute cost of each unit: its mean finite time over the devices."""
    return mean_finite(prob.time)


def layer_cuts(prob: Problem) -> np.ndarray:
    """Positions ``i`` in ``prob.order`` where a stage may start: where the layer index changes.

    A unit's layer is the largest layer of its nodes; units without a layer (-1)
    never start a stage. If the graph has no layers, every position is allowed.
    """
    layer = np.full(prob.num_units, -1, dtype=np.int64)
    np.maximum.at(layer, prob.unit_of, prob.graph.layer)
    lo = layer[prob.order]
    if (lo < 0).all():
        return np.arange(1, prob.num_units)
    filled = np.maximum.accumulate(np.where(lo >= 0, lo, -1))
    return np.flatnonzero((lo[1:] >= 0) & (lo[1:] != filled[:-1])) + 1


def split_contiguous(
    prob: Problem, chain: list[int], bottleneck: float, w: np.ndarray
) -> np.ndarray | None:
    """Greedy contiguous fill along ``chain``: each stage takes units while its time stays within
    ``bottleneck`` and its memory fits; returns the stage index of each position, or None."""
    stage = np.zeros(prob.num_units, dtype=np.int64)
    cm = prob.chain_memory(chain)
    k, t, m = 0, 0.0, 0.0
    for i, u in enumerate(prob.order):
        while True:
            if k >= len(chain):
                return None
            d = chain[k]
            tu = prob.time[u, d]
            if np.isfinite(tu) and t + tu <= bottleneck and m + cm[u, d] <= prob.capacity[d]:
                break
            if t == 0.0 and m == 0.0 and np.isfinite(tu) and cm[u, d] <= prob.capacity[d]:
                return None  # this unit alone takes longer than the bottleneck here
            # the stage is full, or the unit can never be on d (it cannot run there or its
            # state alone exceeds the memory): the next device; an empty stage is left out,
            # and holds no activations, so the fractions charged stay an upper bound (found by
            # fuzzing, 30 Nov 2026: an accelerator smaller than the first unit's output at
            # the head of the chain gave no plan where the host could hold everything)
            k, t, m = k + 1, 0.0, 0.0
        stage[i] = k
        t += tu
        m += cm[u, chain[k]]
    return stage


def expert(graph: CompGraph, cluster: Cluster, oracle: Oracle, budget: int | None = None) -> Plan:
    """Equal-cost contiguous layer split over a topology-aware device chain (one evaluation)."""
    start = oracle_calls_start(oracle)
    prob = make_problem(graph, cluster, oracle)
    chain = usable_chain(prob, device_chain(cluster))
    D, U = len(chain), prob.num_units
    w = unit_weights(prob)
    speed = np.array([1.0 / max(prob.time[:, d].sum(), 1e-30) for d in chain])
    if not speed.sum() > 0:  # every device has a unit it cannot run (inf): 0 / 0 targets
        speed = np.ones(len(chain))  # equal shares (found by fuzzing; it warned and cut at NaN)
    targets = np.cumsum(speed)[:-1] / speed.sum() * w.sum()
    cuts = layer_cuts(prob)
    prefix = np.concatenate([[0.0], np.cumsum(w[prob.order])])
    chosen = []
    for tgt in targets:
        if not len(cuts):
            break
        i = int(cuts[np.argmin(np.abs(prefix[cuts] - tgt))])
        chosen.append(max(i, chosen[-1] if chosen else 0))
    stage_pos = np.searchsorted(np.asarray(chosen, dtype=np.int64), np.arange(U), side="right")
    rule = "equal_cost_layers"
    up = np.empty(U, dtype=np.int64)
    up[prob.order] = np.asarray(chain)[stage_pos]
    if not prob.fits_pipeline(stage_pos, chain):
        rule = "memory_balanced"
        lo, hi = float(w.sum()) / D, float(np.where(np.isfinite(prob.time), prob.time, 0).sum())
        best = split_contiguous(prob, chain, hi * 1.0000001 + 1e-12, w)
        if best is None:
            raise InfeasiblePlanError(
                f"expert: no contiguous split of {graph.meta.get('name', '?')!r} over "
                f"{cluster.name!r} fits in memory"
            )
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            s = split_contiguous(prob, chain, mid, w)
            if s is None:
                lo = mid
            else:
                best, hi = s, mid
        stage_pos = best
        up[prob.order] = np.asarray(chain)[stage_pos]
    used = sorted(set(stage_pos.tolist()))
    remap = {k: j for j, k in enumerate(used)}
    unit_stage = np.empty(U, dtype=np.int64)
    unit_stage[prob.order] = [remap[int(k)] for k in stage_pos]
    return finish(
        prob,
        up,
        "expert",
        start,
        stage_device=[chain[k] for k in used],
        unit_stage=unit_stage,
        rule=rule,
        device_chain=chain,
    )
