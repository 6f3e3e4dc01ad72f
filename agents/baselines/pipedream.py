"""`pipedream_dp`: optimal contiguous pipeline stages by dynamic programming.

After PipeDream (Narayanan et al., SOSP 2019) and DAPPLE (Fan et al., PPoPP
2021). The colocation units are taken in a topological order and cut into
``S <= D`` contiguous stages; stage ``k`` runs on device ``chain[k]`` of the
topology-aware device chain (:func:`device_chain`). The objective minimised is
the **bottleneck stage time** (the steady-state time per microbatch of the
pipeline)::

    stage_time(k, j..i) = sum_{p=j..i} time[unit_p, chain[k]]
                        + [in  > 0] * (lat(chain[k-1], chain[k]) + in  / bw(chain[k-1], chain[k]))
                        + [out > 0] * (lat(chain[k], chain[k+1]) + out / bw(chain[k], chain[k+1]))

where ``in`` (``out``) is the per-microbatch bytes on unit edges, in either
direction (activations forward, gradients backward), joining the stage to units
before (after) it. Edges that skip stages are charged at the neighbouring
stage's link, as PipeDream's chain model does. A stage whose static memory
exceeds its device's capacity costs ``inf``. The recurrence
``F[k][i] = min_j max(F[k-1][j-1], stage_time(k, j..i))`` is exact for this
objective in ``O(D U^2)``.
"""

from __future__ import annotations

import numpy as np

from agents.baselines.common import (
    InfeasiblePlanError,
    Problem,
    device_chain,
    finish,
    make_problem,
    oracle_calls_start,
)
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from placement_env.oracles.base import Oracle


def boundary_bytes(prob: Problem) -> tuple[np.ndarray, np.ndarray]:
    """``(IN, OUT)``, each ``(U+1, U+1)``: bytes joining positions ``j..i`` to earlier / later ones.

    ``IN[j, i]`` / ``OUT[j, i]`` for the stage holding order positions ``j..i`` (``i >= j``).
    """
    U = prob.num_units
    pos = np.empty(U, dtype=np.int64)
    pos[prob.order] = np.arange(U)
    a, b = pos[prob.usrc], pos[prob.udst]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    A = np.zeros((U, U))
    np.add.at(A, (lo, hi), prob.ubytes)
    # P[x, y] = sum of A[lo, hi] over lo < x, hi < y
    P = np.zeros((U + 1, U + 1))
    P[1:, 1:] = A.cumsum(0).cumsum(1)
    j = np.arange(U + 1)[:, None]
    i1 = np.arange(U + 1)[None, :]  # i + 1
    i1c = np.maximum(i1, j)
    IN = P[j, i1c] - P[j, j]
    OUT = (P[i1c, U] - P[j, U]) - (P[i1c, i1c] - P[j, i1c])
    return IN[:, 1:], OUT[:, 1:]


def dp_stages(
    prob: Problem, chain: list[int], max_stages: int | None = None
) -> tuple[float, np.ndarray]:
    """Solve the DP: ``(bottleneck seconds, stage index of each order position)``."""
    U, D = prob.num_units, len(chain)
    S = D if max_stages is None else min(int(max_stages), D)
    IN, OUT = boundary_bytes(prob)
    order = prob.order
    INF = np.inf
    F = np.full((S, U), INF)
    arg = np.zeros((S, U), dtype=np.int64)
    for k in range(S):
        d = chain[k]
        tc = np.concatenate([[0.0], np.cumsum(prob.time[order, d])])
        mc = np.concatenate([[0.0], np.cumsum(prob.mem[order])])
        prv, nxt = chain[max(k - 1, 0)], chain[min(k + 1, D - 1)]
        for i in range(U):
            js = np.arange(0, i + 1) if k > 0 else np.array([0])
            if k > 0:
                js = js[js >= 1]
                if not len(js):
                    continue
            comp = tc[i + 1] - tc[js]
            inb, outb = IN[js, i], OUT[js, i]
            cost = comp.copy()
            if k > 0:
                cost += np.where(inb > 0, prob.lat[prv, d] + inb / prob.bw[prv, d], 0.0)
            if nxt != d:
                cost += np.where(outb > 0, prob.lat[d, nxt] + outb / prob.bw[d, nxt], 0.0)
            elif i < U - 1:
                cost[:] = INF  # a stage with later units needs a next device
            cost[mc[i + 1] - mc[js] > prob.capacity[d]] = INF
            val = np.maximum(F[k - 1, js - 1], cost) if k > 0 else cost
            b = int(np.argmin(val))
            F[k, i], arg[k, i] = val[b], js[b]
    k = int(np.argmin(F[:, U - 1]))
    best = float(F[k, U - 1])
    if not np.isfinite(best):
        raise InfeasiblePlanError(
            f"pipedream_dp: no contiguous split of {prob.graph.meta.get('name', '?')!r} into at most "
            f"{S} stages fits in memory (or every split puts a node where it cannot run)"
        )
    stage = np.zeros(U, dtype=np.int64)
    i = U - 1
    while k >= 0:
        j = int(arg[k, i])
        stage[j : i + 1] = k
        i, k = j - 1, k - 1
    return best, stage


def dp_placement(prob: Problem) -> np.ndarray:
    """The DP's per-unit placement on the device chain (raises :class:`InfeasiblePlanError`)."""
    chain = device_chain(prob.cluster)
    _, stage_pos = dp_stages(prob, chain)
    up = np.empty(prob.num_units, dtype=np.int64)
    up[prob.order] = np.asarray(chain)[stage_pos]
    return up


def pipedream_dp(
    graph: CompGraph,
    cluster: Cluster,
    oracle: Oracle,
    budget: int | None = None,
    *,
    max_stages: int | None = None,
) -> Plan:
    """Bottleneck-optimal contiguous stages on the device chain (one oracle evaluation)."""
    start = oracle_calls_start(oracle)
    prob = make_problem(graph, cluster, oracle)
    chain = device_chain(cluster)
    best, stage_pos = dp_stages(prob, chain, max_stages)
    up = np.empty(prob.num_units, dtype=np.int64)
    up[prob.order] = np.asarray(chain)[stage_pos]
    unit_stage = np.empty(prob.num_units, dtype=np.int64)
    unit_stage[prob.order] = stage_pos
    S = int(stage_pos.max()) + 1
    return finish(
        prob,
        up,
        "pipedream_dp",
        start,
        stage_device=chain[:S],
        unit_stage=unit_stage,
        dp_objective=best,
        stages=S,
        device_chain=chain,
    )
