"""`ilp`: the max-load placement MILP with the simulator's exact transfer accounting, solved by HiGHS.

After the integer program of Tarnawski, Phanishayee, Devanur, Mahajan & Nina
Paravecino, "Efficient Algorithms for Device Placement of DNN Graph Operators"
(NeurIPS 2020), for the max-load objective (steady-state time per sample of a
pipeline). Placements need not be contiguous. The cost accounting is exactly
``Simulator(objective="max_load")`` (:class:`agents.baselines.maxload.MaxLoadModel`):
per producer *node* ``x`` and destination device ``b`` holding a consumer,
``c(x, b)`` is charged to ``b`` and ``max_b c(x, b)`` to ``x``'s device, CPUs
never pay. With ``x[u, d]`` binary (unit ``u`` on device ``d``), ``X`` the unit of
``x`` and ``k`` the transfer cost of ``x``'s largest edge into consumer unit ``V``::

    min L
    s.t. sum_d x[u, d] = 1                                  every unit on one device
         sum_u mem[u] x[u, d] <= capacity[d]                memory (parameter bytes for max-load)
         r[x, b] >= k(x, V, a, b) (x[X, a] + x[V, b] - 1)   x on a sends to b    (a != b, b pays)
         o[x, a] >= k(x, V, a, b) (x[X, a] + x[V, b] - 1)   x's own charge on a  (a != b, a pays)
         L >= sum_u time[u, d] x[u, d] + sum_x r[x, d] + o[x, d]      every device d
         x binary (0 where the unit cannot run or does not fit alone), r, o >= 0

At an integral ``x`` the least feasible ``r[x, b]`` is ``max_V k`` over ``x``'s consumer
units on ``b`` = ``c(x, b)``, and the least ``o[x, a]`` is ``max_b c(x, b)``, so the
optimum of the program is the simulator's max-load optimum. When every route
between two devices costs the same (``MaxLoadModel.uniform``) the ``a, b`` pairs
collapse to ``r[x, d] >= k (x[V, d] - x[X, d])`` and ``o[x, d] >= k (x[X, d] -
x[V, d])``, ``D`` rows per (producer, consumer unit) instead of ``D (D - 1)`` each.

HiGHS runs under ``time_limit`` seconds, warm-started from `ideal_dp`'s
contiguous optimum. ``meta``: ``ilp_objective`` (the incumbent's max-load,
seconds, recomputed from its placement), ``ilp_bound`` (HiGHS's proven lower
bound), ``mip_gap`` (``(objective - bound) / objective``; 0 = proven optimal),
``ilp_status``, ``warm_start`` and ``warm_objective``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import highspy
import numpy as np
import scipy.sparse as sp

from agents.baselines.anneal import unit_placement
from agents.baselines.common import (
    InfeasiblePlanError,
    Problem,
    c_output_captured,
    check_flag,
    check_seconds,
    finish,
    oracle_calls_start,
)
from agents.baselines.ideal_dp import (
    check_orders,
    device_classes,
    exact_model,
    exact_problem,
    solve_ideal_dp,
)
from agents.baselines.maxload import MaxLoadModel
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from graphs.schema import is_whole
from placement_env.oracles.base import Oracle

#: Default cap on the model's columns.
MAX_VARIABLES = 500_000
#: Default cap on its rows. bench_exact.py's layered-l (1,210,281 rows, 49,369 columns) builds and
#: runs in 2.2 GiB, HiGHS stopping 8 s past a 60 s limit; far above, its presolve and root LP
#: stop answering the time limit.
MAX_ROWS = 1_500_000


def _groups(prob: Problem, model: MaxLoadModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(producer node, consumer unit, index into model pairs -> group)`` of cross-unit pairs."""
    U = prob.num_units
    X = prob.unit_of[model.psrc]
    V = prob.unit_of[model.pdst]
    cross = np.flatnonzero(X != V)
    key = model.psrc[cross] * max(U, 1) + V[cross]
    uniq, inv = np.unique(key, return_inverse=True)
    return (uniq // max(U, 1)).astype(np.int64), (uniq % max(U, 1)).astype(np.int64), cross, inv


def unit_times(prob: Problem, model: MaxLoadModel) -> np.ndarray:
    """``float64[U, D]`` compute microseconds of each unit on each device (inf = cannot run)."""
    t = np.zeros((prob.num_units, model.num_devices))
    np.add.at(t, prob.unit_of, model.comp)
    return t


def solve_max_load(
    prob: Problem,
    model: MaxLoadModel,
    *,
    time_limit: float = 60.0,
    mip_rel_gap: float = 1e-6,
    max_variables: int = MAX_VARIABLES,
    max_rows: int = MAX_ROWS,
    threads: int = 1,
    warm: np.ndarray | None = None,
    symmetry: bool = False,
    highs_options: dict[str, Any] | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Solve the MILP; ``(device of each unit, info)`` with objective, bound, gap and status.

    ``symmetry`` (default off: measured slower, see ``docs/baselines.md``): order
    interchangeable devices (:func:`symmetric_devices`) by compute load,
    ``sum_u time[u] x[u, d_j] >= sum_u time[u] x[u, d_j+1]``, so HiGHS does not explore
    their permuted copies (any plan has a permuted copy of equal objective that meets
    the rows). ``highs_options``: HiGHS options set after the defaults (e.g.
    ``{"mip_heuristic_effort": 0.2}``).
    """
    U, D = prob.num_units, model.num_devices
    gx, gV, cross, ginv = _groups(prob, model)
    G = len(gx)
    producers, gp = np.unique(gx, return_inverse=True)
    Px = len(producers)
    pay = np.flatnonzero(~model.nocomm)
    C = len(pay)
    cpos = np.full(D, -1, dtype=np.int64)
    cpos[pay] = np.arange(C)
    nx = U * D
    nr = Px * C
    nvar = nx + 2 * nr + 1
    if nvar > max_variables:
        raise ValueError(
            f"ilp: graph {prob.graph.meta.get('name', '?')!r} has {U} colocation units and {Px} "
            f"producer nodes with consumers in other units on {D} devices, i.e. {nvar} variables > "
            f"max_variables={max_variables}; coarsen the graph (graphs.coarsening) or raise max_variables"
        )
    n_rows = (
        U
        + D
        + int(np.isfinite(prob.capacity).sum())
        + 2 * G * (C if model.uniform else D * (D - 1))
    )
    if n_rows > max_rows:
        raise ValueError(
            f"ilp: graph {prob.graph.meta.get('name', '?')!r} has {G} (producer node, consumer unit) "
            f"pairs on {D} devices, i.e. about {n_rows} rows > max_rows={max_rows}; coarsen the graph "
            "(graphs.coarsening) or raise max_rows"
        )
    T = unit_times(prob, model)
    allowed = np.isfinite(T) & (prob.mem[:, None] <= prob.capacity[None, :])
    tcost = np.where(np.isfinite(T), T, 0.0)
    scale = 1.0 / max(float(tcost.max(initial=0.0)), 1e-12)
    xi = np.arange(nx).reshape(U, D)
    ri = nx + np.arange(nr).reshape(max(Px, 0), C) if C else np.zeros((Px, 0), dtype=np.int64)
    oi = nx + nr + np.arange(nr).reshape(max(Px, 0), C) if C else np.zeros((Px, 0), dtype=np.int64)
    L = nvar - 1
    X = prob.unit_of[gx]
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lo: list[np.ndarray] = []
    hi: list[np.ndarray] = []
    r = 0
    rows.append(np.repeat(np.arange(U), D))
    cols.append(xi.ravel())
    vals.append(np.ones(nx))
    lo.append(np.ones(U))
    hi.append(np.ones(U))
    r += U
    for d in np.flatnonzero(np.isfinite(prob.capacity)):
        sc = max(float(prob.capacity[d]), 1.0)
        rows.append(np.full(U, r))
        cols.append(xi[:, d])
        vals.append(prob.mem / sc)
        lo.append(np.array([-np.inf]))
        hi.append(np.array([prob.capacity[d] / sc]))
        r += 1
    # transfer rows: "var >= k * (...)" written as var - k*x... >= rhs; remember (row -> var) for warm starts
    link_var: list[np.ndarray] = []
    if G and C:
        if model.uniform:
            k = np.zeros(G)
            np.maximum.at(k, ginv, model.uniform_cost()[cross])
            k *= scale
            gg, dd = np.meshgrid(np.arange(G), pay, indexing="ij")
            gg, dd = gg.ravel(), dd.ravel()
            kk = k[gg]
            for var, sx, sv in ((ri, +1.0, -1.0), (oi, -1.0, +1.0)):
                m = len(gg)
                ridx = r + np.arange(m)
                vcol = var[gp[gg], cpos[dd]]
                rows += [ridx, ridx, ridx]
                cols += [vcol, xi[X[gg], dd], xi[gV[gg], dd]]
                vals += [np.ones(m), sx * kk, sv * kk]
                lo.append(np.zeros(m))
                hi.append(np.full(m, np.inf))
                link_var.append(vcol)
                r += m
        else:
            pa, pb = np.nonzero(~np.eye(D, dtype=bool))
            for a, b in zip(pa.tolist(), pb.tolist()):
                k = np.zeros(G)
                np.maximum.at(k, ginv, model.pair_cost(a, b)[cross])
                k *= scale
                for var, dev in ((ri, b), (oi, a)):
                    if cpos[dev] < 0:
                        continue
                    ridx = r + np.arange(G)
                    vcol = var[gp, cpos[dev]]
                    rows += [ridx, ridx, ridx]
                    cols += [vcol, xi[X, a], xi[gV, b]]
                    vals += [np.ones(G), -k, -k]
                    lo.append(-k)
                    hi.append(np.full(G, np.inf))
                    link_var.append(vcol)
                    r += G
    n_link_rows = sum(len(v) for v in link_var)
    link_start = r - n_link_rows
    load_start = r
    for d in range(D):
        rows.append(np.full(U, r))
        cols.append(xi[:, d])
        vals.append(tcost[:, d] * scale)
        if cpos[d] >= 0 and Px:
            rows.append(np.full(2 * Px, r))
            cols.append(np.concatenate([ri[:, cpos[d]], oi[:, cpos[d]]]))
            vals.append(np.ones(2 * Px))
        rows.append(np.array([r]))
        cols.append(np.array([L]))
        vals.append(np.array([-1.0]))
        r += 1
    lo.append(np.full(D, -np.inf))
    hi.append(np.zeros(D))
    sym = symmetric_devices(model, prob.capacity) if symmetry else []
    n_sym = 0
    for grp in sym:
        tg = tcost[:, grp[0]] * scale
        for a, b in zip(grp[:-1], grp[1:]):
            rows += [np.full(U, r), np.full(U, r)]
            cols += [xi[:, a], xi[:, b]]
            vals += [tg, -tg]
            lo.append(np.zeros(1))
            hi.append(np.full(1, np.inf))
            r += 1
            n_sym += 1
    if warm is not None and sym:
        warm = canonical_order(warm, tcost, sym)
    A = sp.csc_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, nvar)
    )
    row_lo = np.concatenate([np.asarray(v, float) for v in lo])
    row_hi = np.concatenate([np.asarray(v, float) for v in hi])
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = nvar, r
    cost = np.zeros(nvar)
    cost[L] = 1.0
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(nvar)
    ub = np.full(nvar, np.inf)
    ub[:nx] = allowed.ravel().astype(float)
    lp.col_upper_ = ub
    lp.row_lower_ = row_lo
    lp.row_upper_ = row_hi
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = A.indptr
    lp.a_matrix_.index_ = A.indices
    lp.a_matrix_.value_ = A.data
    lp.integrality_ = [highspy.HighsVarType.kInteger] * nx + [highspy.HighsVarType.kContinuous] * (
        nvar - nx
    )
    with c_output_captured():  # HiGHS prints its banner when constructed
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(max(time_limit, 0.01)))
    h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    h.setOptionValue("threads", int(threads))
    h.setOptionValue("random_seed", 0)
    for key, value in (highs_options or {}).items():
        if h.setOptionValue(key, value) != highspy.HighsStatus.kOk:
            raise ValueError(f"ilp: HiGHS refused option {key}={value!r}")
    h.passModel(lp)
    if warm is not None:
        _set_start(
            h, A, warm, xi, nx, L, nvar, row_lo, link_var, link_start, load_start, n_link_rows
        )
    t0 = time.perf_counter()
    h.run()
    sol = np.asarray(h.getSolution().col_value)
    if (
        warm is not None
        and h.getInfo().primal_solution_status == 2
        and abs(h.getInfo().objective_function_value - sol[L]) > 1e-9 * max(abs(sol[L]), 1.0)
    ):
        # HiGHS 1.16 can return an optimal start with its objective and bound unset; solve
        # again without the start so the reported bound is HiGHS's own proof
        h.clearSolver()
        h.passModel(lp)
        h.setOptionValue("time_limit", max(time_limit - (time.perf_counter() - t0), 0.01))
        h.run()
        sol = np.asarray(h.getSolution().col_value)
    status = h.modelStatusToString(h.getModelStatus())
    info = h.getInfo()
    if info.primal_solution_status != 2:
        raise InfeasiblePlanError(
            f"ilp: HiGHS found no memory-feasible placement of {prob.graph.meta.get('name', '?')!r} "
            f"(status: {status}{'' if status != 'Time limit reached' else f' after {time_limit} s'})"
        )
    xv = sol[:nx].reshape(U, D)
    up = np.argmax(xv, axis=1).astype(np.int64)
    if warm is not None and model.max_load(warm[prob.unit_of]) < model.max_load(up[prob.unit_of]):
        up = np.asarray(warm, dtype=np.int64)  # never worse than the start
    obj = model.max_load(up[prob.unit_of]) * 1e-6
    bound = (
        max(float(info.mip_dual_bound) / scale * 1e-6, 0.0)
        if np.isfinite(info.mip_dual_bound)
        else 0.0
    )
    bound = min(bound, obj)
    gap = (obj - bound) / obj if obj > 0 else 0.0
    return up, {
        "ilp_objective": obj,
        "ilp_bound": bound,
        "mip_gap": float(gap),
        "ilp_status": status,
        "ilp_seconds": time.perf_counter() - t0,
        "ilp_variables": int(nvar),
        "ilp_rows": int(r),
        "ilp_nodes": int(info.mip_node_count),
        "ilp_formulation": "uniform routes" if model.uniform else "per device pair",
        "symmetry_rows": int(n_sym),
        "symmetric_devices": [list(g) for g in sym],
        "cost_model_exact": bool(model.exact),
    }


def symmetric_devices(model: MaxLoadModel, capacity: np.ndarray) -> list[list[int]]:
    """Groups (of 2 or more) of interchangeable devices: same compute times, memory and
    CPU-ness (:func:`agents.baselines.ideal_dp.device_classes`), and swapping any two of
    a group leaves every route's latency and bandwidth unchanged."""
    D = model.num_devices
    out: list[list[int]] = []
    for cls in device_classes(model, capacity)[0]:
        groups: list[list[int]] = []
        for d in cls:
            for grp in groups:
                perm = np.arange(D)
                perm[[grp[0], d]] = perm[[d, grp[0]]]
                if np.array_equal(model.rlat[np.ix_(perm, perm)], model.rlat) and np.array_equal(
                    model.rinv[np.ix_(perm, perm)], model.rinv
                ):
                    grp.append(d)
                    break
            else:
                groups.append([d])
        out += [g for g in groups if len(g) > 1]
    return out


def canonical_order(up: np.ndarray, tcost: np.ndarray, sym: list[list[int]]) -> np.ndarray:
    """``up`` with each group's devices relabelled so that their compute loads decrease
    along the group (the form the symmetry rows admit); the objective is unchanged."""
    up = np.asarray(up, dtype=np.int64).copy()
    U = len(up)
    new = up.copy()
    for grp in sym:
        load = np.array([tcost[up == d, d].sum() for d in grp])
        order = np.argsort(-load, kind="stable")
        for j, k in enumerate(order):
            new[up == grp[k]] = grp[j]
    assert len(new) == U
    return new


def _set_start(
    h: highspy.Highs,
    A: sp.csc_matrix,
    warm: np.ndarray,
    xi: np.ndarray,
    nx: int,
    L: int,
    nvar: int,
    row_lo: np.ndarray,
    link_var: list[np.ndarray],
    link_start: int,
    load_start: int,
    n_link_rows: int,
) -> None:
    """Give HiGHS the placement ``warm`` with the least transfer and load values it implies."""
    U = xi.shape[0]
    x0 = np.zeros(nvar)
    x0[xi[np.arange(U), warm]] = 1.0
    # least continuous values that satisfy every transfer row, then the loads
    Ar = A.tocsr()
    if n_link_rows:
        need = row_lo[link_start:load_start] - Ar[link_start:load_start] @ x0
        vcols = np.concatenate(link_var)
        np.maximum.at(x0, vcols, need)
        x0[nx:L] = np.maximum(x0[nx:L], 0.0)
    D = xi.shape[1]
    x0[L] = max(float((Ar[load_start : load_start + D] @ x0).max(initial=0.0)), 0.0)
    sol = highspy.HighsSolution()
    sol.col_value = x0.tolist()
    h.setSolution(sol)


def ilp(
    graph: CompGraph,
    cluster: Cluster,
    oracle: Oracle,
    budget: int | None = None,
    *,
    time_limit: float = 60.0,
    warm_time_limit: float | None = None,
    max_variables: int = MAX_VARIABLES,
    max_rows: int = MAX_ROWS,
    warm_start: bool = True,
    init: np.ndarray | Plan | None = None,
    symmetry: bool = False,
    highs_options: dict[str, Any] | None = None,
    random_orders: int = 2000,
    seed: int = 0,
) -> Plan:
    """Max-load MILP (HiGHS), warm-started from `ideal_dp`; one oracle evaluation.

    ``time_limit`` bounds HiGHS; ``warm_time_limit`` (default ``time_limit``) the DP;
    ``random_orders`` and ``seed`` are the DP's (see :func:`ideal_dp`).
    ``symmetry``: ordering rows for interchangeable devices (off by default: on coarsened zoo
    graphs they slowed HiGHS's proofs 2.5-19x in 4 of 5 cases, ``docs/ilp_symmetry_table.md``);
    ``highs_options``: passed to HiGHS (see :func:`solve_max_load`).
    ``init``: a per-node placement (colocation groups kept together) to start from
    instead of solving `ideal_dp`. For a makespan oracle the memory rule charges every microbatch's activations
    (an upper bound on any schedule) and the oracle's step time is reported.
    """
    check_seconds("ilp", "time_limit", time_limit)
    # NaN turned a cap off, None / "1" were TypeErrors, a list of pairs an AttributeError
    for name, cap in (("max_variables", max_variables), ("max_rows", max_rows)):
        if not is_whole(cap, 1):
            raise ValueError(f"ilp: {name} must be an integer >= 1, got {cap!r}")
    if highs_options is not None and (
        not isinstance(highs_options, Mapping) or not all(isinstance(k, str) for k in highs_options)
    ):
        raise ValueError(
            f"ilp: highs_options must be a mapping of HiGHS option names to values, got {highs_options!r}"
        )
    for name, flag in (("warm_start", warm_start), ("symmetry", symmetry)):
        check_flag("ilp", name, flag)  # "no" was taken as true (fuzzing)
    if warm_time_limit is not None:
        check_seconds("ilp", "warm_time_limit", warm_time_limit)
    check_orders("ilp", random_orders, seed)
    start = oracle_calls_start(oracle)
    prob = exact_problem(graph, cluster, oracle)
    model = exact_model(graph, cluster, prob)
    warm, warm_info = None, {}
    if init is not None:  # a given per-node placement (e.g. ideal_dp's plan) replaces the DP
        warm = unit_placement(prob, init, who="ilp")
        if not prob.fits(warm):
            raise ValueError(
                "ilp: init does not fit the devices' memory (or puts a unit where it cannot run)"
            )
        warm_info = {"warm_objective": float(model.max_load(warm[prob.unit_of]) * 1e-6)}
    elif warm_start:
        try:
            warm, wi = solve_ideal_dp(
                prob, model, time_limit=time_limit if warm_time_limit is None else warm_time_limit,
                random_orders=random_orders, seed=seed,
            )  # fmt: skip
            warm_info = {
                "warm_objective": float(model.max_load(warm[prob.unit_of]) * 1e-6),
                "warm_exact": wi["exact"],
            }
        except InfeasiblePlanError:
            warm = None
    up, info = solve_max_load(
        prob,
        model,
        time_limit=time_limit,
        max_variables=max_variables,
        max_rows=max_rows,
        warm=warm,
        symmetry=symmetry,
        highs_options=highs_options,
    )
    return finish(
        prob,
        up,
        "ilp",
        start,
        objective="max_load",
        warm_start=warm is not None,
        **warm_info,
        **info,
    )
