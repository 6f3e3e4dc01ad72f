"""`chain_dp` (alias `pipedream_dp`): optimal contiguous pipeline stages on a device chain, by DP.

After the partitioning DP of PipeDream (Narayanan et al., SOSP 2019) and DAPPLE
(Fan et al., PPoPP 2021), **without stage replication**: PipeDream's DP may give a
stage ``r`` data-parallel replicas (its time divided by ``r`` plus an all-reduce of
its weights), but a :class:`graphs.plan.Plan` of this kind puts each node on one
device and the simulator has no weight all-reduce for an op placement, so a
replicated stage could be neither expressed nor scored. The DP here is the
replication-free special case, exact for its chain model; `pipedream_dp` keeps
its historical name as an alias (``meta["algorithm"]`` is the name called).

The colocation units are taken in a topological order and cut into ``S <= D``
contiguous stages; stage ``k`` runs on device ``chain[k]`` of the
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
(persistent state + its share of activations in flight) exceeds its device's
capacity costs ``inf``. The recurrence
``F[k][i] = min_j max(F[k-1][j-1], stage_time(k, j..i))`` is exact for this
objective; it is solved for every stage count ``S`` (``O(D^2 U^2)``) because
under 1F1B stage ``k`` of ``S`` keeps ``min(M, S - k)`` microbatches of
activations (PipeDream-flush), so its memory limit depends on ``S``.
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
    usable_chain,
)
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from graphs.schema import is_whole
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
    """Solve the DP: ``(bottleneck seconds, stage index of each order position)``.

    Runs once per stage count ``S`` because a stage's activation memory depends
    on its distance to the end of the pipeline (:meth:`Problem.stage_act_fraction`);
    the best ``S`` wins (ties: fewer stages).
    """
    D = len(chain)
    if max_stages is not None and not is_whole(max_stages, 1):
        # 0, -1, True were one stage, 2.5 and "2" two, NaN a bare int() error (2 Dec 2026)
        raise ValueError(f"max_stages must be an integer >= 1 or None, got {max_stages!r}")
    top = D if max_stages is None else min(int(max_stages), D)
    IN, OUT = boundary_bytes(prob)
    best: tuple[float, np.ndarray] | None = None
    for S in range(1, top + 1):
        val, stage = _dp_fixed(prob, chain, S, IN, OUT)
        if stage is not None and (best is None or val < best[0] - 1e-15 * max(val, 1.0)):
            best = (val, stage)
    if best is None:
        raise InfeasiblePlanError(
            f"pipedream_dp: no contiguous split of {prob.graph.meta.get('name', '?')!r} into at most "
            f"{top} stages fits in memory (or every split puts a node where it cannot run)"
        )
    return best


def _dp_fixed(
    prob: Problem, chain: list[int], S: int, IN: np.ndarray, OUT: np.ndarray
) -> tuple[float, np.ndarray | None]:
    """Exactly ``S`` non-empty stages on ``chain[:S]``: ``(bottleneck, stage per position)``."""
    U = prob.num_units
    order = prob.order
    param = prob.param if prob.param is not None else prob.mem
    act = prob.act if prob.act is not None else np.zeros(U)
    pc = np.concatenate([[0.0], np.cumsum(param[order])])
    ac = np.concatenate([[0.0], np.cumsum(act[order])])
    F = np.full((S, U), np.inf)
    arg = np.zeros((S, U), dtype=np.int64)
    for k in range(S):
        d = chain[k]
        # prefix sums of the finite times and of the units that cannot run on d (time inf):
        # a plain cumsum is inf after the first such unit, so a stage of runnable units after
        # it cost inf - inf = nan (found by fuzzing: a RuntimeWarning on hetero clusters)
        t_d = prob.time[order, d]
        runnable = np.isfinite(t_d)
        tc = np.concatenate([[0.0], np.cumsum(np.where(runnable, t_d, 0.0))])
        nc = np.concatenate([[0], np.cumsum(~runnable)])
        frac = prob.stage_act_fraction(k, S)
        prv, nxt = chain[max(k - 1, 0)], chain[min(k + 1, S - 1)]
        # stage k holds positions j..i; it needs k stages before it and S-1-k after it
        for i in range(k, U - (S - 1 - k)):
            js = np.arange(k, i + 1) if k > 0 else np.zeros(1, dtype=np.int64)
            cost = np.where(nc[i + 1] - nc[js] > 0, np.inf, tc[i + 1] - tc[js])
            if k > 0:
                inb = IN[js, i]
                cost = cost + np.where(inb > 0, prob.lat[prv, d] + inb / prob.bw[prv, d], 0.0)
            if k < S - 1:
                outb = OUT[js, i]
                cost = cost + np.where(outb > 0, prob.lat[d, nxt] + outb / prob.bw[d, nxt], 0.0)
            mem = (pc[i + 1] - pc[js]) + frac * (ac[i + 1] - ac[js])
            cost[mem > prob.capacity[d]] = np.inf
            val = np.maximum(F[k - 1, js - 1], cost) if k > 0 else cost
            b = int(np.argmin(val))
            F[k, i], arg[k, i] = val[b], js[b]
    best = float(F[S - 1, U - 1])
    if not np.isfinite(best):
        return best, None
    stage = np.zeros(U, dtype=np.int64)
    i = U - 1
    for k in range(S - 1, -1, -1):
        j = int(arg[k, i])
        stage[j : i + 1] = k
        i = j - 1
    return best, stage


def chain_stages(
    prob: Problem, max_stages: int | None = None
) -> tuple[float, np.ndarray, list[int]]:
    """:func:`dp_stages` on the device chain less its unusable devices (:func:`usable_chain`);
    when no split fits there, on the same chain reversed (an equally fast path), since stage
    0 must hold the first unit: an accelerator at the head of the chain that cannot take it
    (its output is larger than the memory) left no plan where the host could hold it (found
    by fuzzing, 30 Nov 2026). ``(bottleneck, stage of each order position, chain used)``."""
    chain = usable_chain(prob, device_chain(prob.cluster))
    try:
        best, stage_pos = dp_stages(prob, chain, max_stages)
    except InfeasiblePlanError:
        if len(chain) < 2:
            raise
        chain = chain[::-1]
        best, stage_pos = dp_stages(prob, chain, max_stages)
    return best, stage_pos, chain


def dp_placement(prob: Problem) -> np.ndarray:
    """The DP's per-unit placement on the device chain (raises :class:`InfeasiblePlanError`)."""
    _, stage_pos, chain = chain_stages(prob)
    up = np.empty(prob.num_units, dtype=np.int64)
    up[prob.order] = np.asarray(chain)[stage_pos]
    return up


def chain_dp(
    graph: CompGraph,
    cluster: Cluster,
    oracle: Oracle,
    budget: int | None = None,
    *,
    max_stages: int | None = None,
    _name: str = "chain_dp",
) -> Plan:
    """Bottleneck-optimal contiguous stages on the device chain (one oracle evaluation)."""
    start = oracle_calls_start(oracle)
    prob = make_problem(graph, cluster, oracle)
    best, stage_pos, chain = chain_stages(prob, max_stages)
    up = np.empty(prob.num_units, dtype=np.int64)
    up[prob.order] = np.asarray(chain)[stage_pos]
    unit_stage = np.empty(prob.num_units, dtype=np.int64)
    unit_stage[prob.order] = stage_pos
    S = int(stage_pos.max()) + 1
    return finish(
        prob,
        up,
        _name,
        start,
        stage_device=chain[:S],
        unit_stage=unit_stage,
        dp_objective=best,
        stages=S,
        device_chain=chain,
    )


def pipedream_dp(
    graph: CompGraph,
    cluster: Cluster,
    oracle: Oracle,
    budget: int | None = None,
    *,
    max_stages: int | None = None,
) -> Plan:
    """The same DP as :func:`chain_dp` under its historical name (no stage replication)."""
    return chain_dp(graph, cluster, oracle, budget, max_stages=max_stages, _name="pipedream_dp")
