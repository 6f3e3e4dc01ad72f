"""`ilp`: an exact mixed-integer program for the max-load placement objective, solved with HiGHS.

After Tarnawski, Phanishayee, Devanur, Mahajan & Nina Paravecino, "Efficient
Algorithms for Device Placement of DNN Graph Operators" (NeurIPS 2020), whose
max-load objective is the steady-state time per sample of a pipeline. The
program minimises the **largest device load** (:meth:`Problem.max_load`): a
device's load is the compute time of its colocation units plus, for every unit
edge whose ends sit on different devices ``a -> b``, the transfer time
``lat(a, b) + bytes / bw(a, b)`` charged to both ``a`` and ``b``::

    min L
    s.t. sum_d x[u, d] = 1                              every unit on one device
         sum_u mem[u] x[u, d] <= capacity[d]            static memory
         y[e, a, b] >= x[s_e, a] + x[t_e, b] - 1        edge e crosses a -> b (a != b)
         L >= sum_u time[u, d] x[u, d]
              + sum_{e, b != d} c_e(d, b) y[e, d, b] + c_e(b, d) y[e, b, d]
         x binary (0 where the unit cannot run), y >= 0

The model is exact for the objective; its size grows as ``U*D + E*D*(D-1)``, so
graphs above ``max_variables`` are refused (coarsen them first). HiGHS runs
under ``time_limit`` seconds, warm-started from the pipeline DP's plan, and the
plan's ``meta["mip_gap"]`` reports the relative optimality gap it proved
(0 = optimal).
"""

from __future__ import annotations

import highspy
import numpy as np
import scipy.sparse as sp

from agents.baselines.common import (
    InfeasiblePlanError,
    Problem,
    finish,
    make_problem,
    oracle_calls_start,
)
from agents.baselines.pipedream import dp_placement
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from placement_env.oracles.base import Oracle

#: Default cap on the model's columns (``U*D + E*D*(D-1) + 1``).
MAX_VARIABLES = 250_000


def _warm_start(prob: Problem) -> np.ndarray | None:
    try:
        return dp_placement(prob)
    except InfeasiblePlanError:
        return None


def solve_max_load(
    prob: Problem,
    *,
    time_limit: float = 30.0,
    mip_rel_gap: float = 1e-6,
    max_variables: int = MAX_VARIABLES,
    threads: int = 1,
) -> tuple[np.ndarray, dict]:
    """Solve the MILP; returns ``(unit placement, info)`` with objective, bound, gap and status."""
    U, D = prob.num_units, prob.num_devices
    E = len(prob.usrc)
    pairs = [(a, b) for a in range(D) for b in range(D) if a != b]
    P = len(pairs)
    nx, ny = U * D, E * P
    nvar = nx + ny + 1
    if nvar > max_variables:
        raise ValueError(
            f"ilp: graph {prob.graph.meta.get('name', '?')!r} has {U} colocation units and {E} unit "
            f"edges on {D} devices, i.e. {nvar} variables > max_variables={max_variables}; coarsen "
            "the graph (graphs.coarsening) or raise max_variables"
        )
    allowed = prob.allowed
    tcost = np.where(np.isfinite(prob.time), prob.time, 0.0)
    scale = 1.0 / max(float(tcost.max(initial=0.0)), 1e-12)  # O(1) coefficients
    pa = np.array([a for a, _ in pairs], dtype=np.int64)
    pb = np.array([b for _, b in pairs], dtype=np.int64)
    # c[e, p] = transfer time of edge e over pair p
    c = (prob.lat[pa, pb][None, :] + prob.ubytes[:, None] / prob.bw[pa, pb][None, :]) * scale
    xi = np.arange(nx).reshape(U, D)
    yi = nx + np.arange(ny).reshape(E, P) if E else np.zeros((0, P), dtype=np.int64)
    L = nvar - 1
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0
    # one device per unit
    rows.append(np.repeat(np.arange(U), D))
    cols.append(xi.ravel())
    vals.append(np.ones(nx))
    lo.append(np.ones(U))
    hi.append(np.ones(U))
    r += U
    # memory
    cap = np.where(np.isfinite(prob.capacity), prob.capacity, np.inf)
    finite_cap = np.flatnonzero(np.isfinite(cap))
    for k, d in enumerate(finite_cap):
        rows.append(np.full(U, r + k))
        cols.append(xi[:, d])
        vals.append(prob.umem[:, d] / max(cap[d], 1.0))
        lo.append([-np.inf])
        hi.append([cap[d] / max(cap[d], 1.0)])
    r += len(finite_cap)
    # crossing indicators: y - x[s, a] - x[t, b] >= -1
    if E:
        ridx = r + np.arange(E * P)
        rows += [ridx, ridx, ridx]
        cols += [yi.ravel(), xi[prob.usrc][:, pa].ravel(), xi[prob.udst][:, pb].ravel()]
        vals += [np.ones(E * P), -np.ones(E * P), -np.ones(E * P)]
        lo.append(np.full(E * P, -1.0))
        hi.append(np.full(E * P, np.inf))
        r += E * P
    # loads: compute + transfers - L <= 0
    for d in range(D):
        rows.append(np.full(U, r + d))
        cols.append(xi[:, d])
        vals.append(tcost[:, d] * scale)
        touch = np.flatnonzero((pa == d) | (pb == d))
        if E and len(touch):
            rows.append(np.full(E * len(touch), r + d))
            cols.append(yi[:, touch].ravel())
            vals.append(c[:, touch].ravel())
        rows.append(np.array([r + d]))
        cols.append(np.array([L]))
        vals.append(np.array([-1.0]))
    lo.append(np.full(D, -np.inf))
    hi.append(np.zeros(D))
    r += D
    A = sp.csc_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, nvar)
    )
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = nvar, r
    cost = np.zeros(nvar)
    cost[L] = 1.0
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(nvar)
    ub = np.full(nvar, np.inf)
    ub[:nx] = allowed.ravel().astype(float)
    lp.col_upper_ = ub
    lp.row_lower_ = np.concatenate([np.asarray(x, float) for x in lo])
    lp.row_upper_ = np.concatenate([np.asarray(x, float) for x in hi])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = A.indptr
    lp.a_matrix_.index_ = A.indices
    lp.a_matrix_.value_ = A.data
    lp.integrality_ = [highspy.HighsVarType.kInteger] * nx + [highspy.HighsVarType.kContinuous] * (
        ny + 1
    )
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    h.setOptionValue("threads", int(threads))
    h.setOptionValue("random_seed", 0)
    h.passModel(lp)
    warm = _warm_start(prob)
    if warm is not None and prob.fits(warm):
        sol = highspy.HighsSolution()
        x0 = np.zeros(nvar)
        x0[xi[np.arange(U), warm]] = 1.0
        if E:
            cross = np.zeros((E, P))
            pid = {p: k for k, p in enumerate(pairs)}
            for e in range(E):
                a, b = warm[prob.usrc[e]], warm[prob.udst[e]]
                if a != b:
                    cross[e, pid[(int(a), int(b))]] = 1.0
            x0[nx : nx + ny] = cross.ravel()
        x0[L] = prob.max_load(warm) * scale
        sol.col_value = x0.tolist()
        h.setSolution(sol)
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    info = h.getInfo()
    if info.primal_solution_status != 2:  # no feasible integer solution
        raise InfeasiblePlanError(
            f"ilp: HiGHS found no memory-feasible placement of {prob.graph.meta.get('name', '?')!r} "
            f"(status: {status})"
        )
    xv = np.asarray(h.getSolution().col_value)[:nx].reshape(U, D)
    up = np.argmax(xv, axis=1).astype(np.int64)
    obj = prob.max_load(up)
    # loads are non-negative, so 0 is always a valid bound: the gap lies in [0, 1]
    bound = (
        max(float(info.mip_dual_bound) / scale, 0.0) if np.isfinite(info.mip_dual_bound) else 0.0
    )
    gap = max(0.0, (obj - bound) / obj) if obj > 0 else 0.0
    return up, {
        "ilp_objective": obj,
        "ilp_bound": bound,
        "mip_gap": float(gap),
        "ilp_status": status,
        "ilp_variables": nvar,
        "ilp_nodes": int(info.mip_node_count),
        "warm_start": warm is not None,
    }


def ilp(
    graph: CompGraph,
    cluster: Cluster,
    oracle: Oracle,
    budget: int | None = None,
    *,
    time_limit: float = 30.0,
    max_variables: int = MAX_VARIABLES,
) -> Plan:
    """Max-load MILP with HiGHS, time-limited; ``meta["mip_gap"]`` is the proven gap (one evaluation)."""
    start = oracle_calls_start(oracle)
    # its placements are arbitrary, not pipelines: charge every microbatch's activations
    # (an upper bound on any schedule), so a plan the MILP accepts never runs out of memory
    prob = make_problem(graph, cluster, oracle, act_fraction=1.0)
    up, info = solve_max_load(prob, time_limit=time_limit, max_variables=max_variables)
    return finish(prob, up, "ilp", start, objective="max_load", **info)
