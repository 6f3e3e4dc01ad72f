"""Baechi's memory-constrained placers: `m_topo`, `m_etf`, `m_sct` (Jeon et al., SoCC 2020).

Baechi ("Baechi: Fast Device Placement of Machine Learning Graphs") adapts
three classic algorithms to devices with bounded memory, and treats a
colocation group as one block: when its first node is placed, the whole
group's static memory is reserved on that device and every later node of the
group follows it.

- ``m_topo``: topological order, filling devices (along the device chain) up to
  an equal share of the total static memory; it balances memory, not time.
- ``m_etf``: Earliest Task First list scheduling (Hwang, Chow, Anger & Lee,
  SIAM J. Comput. 1989): repeatedly start the (ready node, device) pair with
  the earliest start time, where a node's start waits for its device and for
  its inputs' transfers. It greedily minimises the makespan of one
  microbatch's forward+backward+optimizer schedule.
- ``m_sct``: Small Communication Time first (Hanen & Munier, 1995): solve the
  LP relaxation of the makespan problem with communication delays to pick each
  node's *favourite child* (``x_ij < 1/2``), then list-schedule as ETF but start
  a ready favourite child on its favourite parent's device whenever waiting
  for that device costs less than the transfer it saves. The LP is solved with
  HiGHS (``scipy.optimize.linprog(method="highs")``).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from agents.baselines.common import (
    InfeasiblePlanError,
    Problem,
    device_chain,
    finish,
    make_problem,
    mean_finite,
    oracle_calls_start,
)
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from placement_env.oracles.base import Oracle


def _unit_name(prob: Problem, u: int) -> str:
    return prob.graph.name[int(np.flatnonzero(prob.unit_of == u)[0])]


def m_topo(graph: CompGraph, cluster: Cluster, oracle: Oracle, budget: int | None = None) -> Plan:
    """Memory-balanced topological fill of the device chain (one oracle evaluation)."""
    start = oracle_calls_start(oracle)
    prob = make_problem(graph, cluster, oracle)
    chain = device_chain(cluster)
    cm = prob.chain_memory(chain)  # the fill is a pipeline along the chain
    allowed = np.isfinite(prob.time) & (cm <= prob.capacity[None, :])
    share = prob.mem.sum() / len(chain)
    if share <= 0:  # nothing occupies memory: balance compute instead
        weight, share = prob.time.mean(axis=1), prob.time.mean(axis=1).sum() / len(chain)
    else:
        weight = prob.mem
    use = np.zeros(prob.num_devices)
    filled = np.zeros(prob.num_devices)
    up = np.zeros(prob.num_units, dtype=np.int64)
    k = 0
    for u in prob.order:
        while k < len(chain) - 1 and (
            filled[chain[k]] + weight[u] > share * (1 + 1e-9) and filled[chain[k]] > 0
        ):
            k += 1
        d = chain[k]
        if not (allowed[u, d] and use[d] + cm[u, d] <= prob.capacity[d]):
            room = [t for t in chain if allowed[u, t] and use[t] + cm[u, t] <= prob.capacity[t]]
            if not room:
                raise InfeasiblePlanError(
                    f"m_topo: the group of node {_unit_name(prob, u)!r} fits on no device with room left"
                )
            d = max(room, key=lambda t: prob.capacity[t] - use[t])
        up[u] = d
        use[d] += cm[u, d]
        filled[d] += weight[u]
    return finish(prob, up, "m_topo", start, device_chain=chain)


def _in_csr(prob: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g = prob.graph
    o = np.argsort(g.dst, kind="stable")
    ptr = np.zeros(g.num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(g.dst, minlength=g.num_nodes), out=ptr[1:])
    return ptr, g.src[o], g.edge_bytes[o] / prob.microbatches


def bottom_levels(prob: Problem) -> np.ndarray:
    """Longest path (mean compute time) from each node to an exit, for tie-breaking."""
    g = prob.graph
    w = mean_finite(prob.node_time)
    bl = w.copy()
    succ: list[list[int]] = [[] for _ in range(g.num_nodes)]
    for s, d in zip(g.src.tolist(), g.dst.tolist()):
        succ[s].append(d)
    for v in g.topo_order[::-1].tolist():
        if succ[v]:
            bl[v] = w[v] + max(bl[s] for s in succ[v])
    return bl


def list_schedule(
    prob: Problem, fav_parent: np.ndarray | None = None, fav_saving: np.ndarray | None = None
) -> tuple[np.ndarray, float]:
    """Memory-constrained ETF (or SCT when ``fav_parent`` is given) at node level.

    ``fav_parent[v]`` is the node whose favourite child ``v`` is (-1 if none) and
    ``fav_saving[v]`` the transfer time that colocating them saves.

    Returns ``(unit placement, estimated makespan in seconds)``. Raises
    :class:`InfeasiblePlanError` when a ready node's group fits nowhere.
    """
    g = prob.graph
    n, D = g.num_nodes, prob.num_devices
    ptr, psrc, pbytes = _in_csr(prob)
    allowed = prob.allowed
    bl = bottom_levels(prob)
    indeg = np.bincount(g.dst, minlength=n)
    succ: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(g.src.tolist(), g.dst.tolist()):
        succ[s].append(d)
    dev_free = np.zeros(D)
    use = np.zeros(D)
    finish_t = np.zeros(n)
    node_dev = np.full(n, -1, dtype=np.int64)
    unit_dev = np.full(prob.num_units, -1, dtype=np.int64)
    arrival: dict[int, np.ndarray] = {}

    def make_ready(v: int) -> None:
        a = np.zeros(D)
        for e in range(ptr[v], ptr[v + 1]):
            p = psrc[e]
            dp = node_dev[p]
            a = np.maximum(a, finish_t[p] + prob.lat[dp] + pbytes[e] / prob.bw[dp])
        arrival[v] = a

    for v in np.flatnonzero(indeg == 0).tolist():
        make_ready(v)
    while arrival:
        ready = list(arrival)
        A = np.stack([arrival[v] for v in ready])
        est = np.maximum(A, dev_free[None, :])
        for r, v in enumerate(ready):
            u = prob.unit_of[v]
            if unit_dev[u] >= 0:
                mask = np.arange(D) != unit_dev[u]
            else:
                mask = ~(allowed[u] & (use + prob.umem[u] <= prob.capacity))
                if mask.all():
                    raise InfeasiblePlanError(
                        f"list scheduling: the group of node {g.name[v]!r} fits on no device with room left"
                    )
            est[r, mask] = np.inf
        r, d = np.unravel_index(np.lexsort((np.repeat(-bl[ready], D), est.ravel()))[0], est.shape)
        if fav_parent is not None:
            # SCT rule: a ready favourite child may wait for its parent's device
            # as long as the wait is shorter than the transfer it avoids.
            limit = est[r, d]
            pick = None
            for rr, v in enumerate(ready):
                p = fav_parent[v]
                if p < 0:
                    continue
                dp = node_dev[p]
                if np.isfinite(est[rr, dp]) and est[rr, dp] <= limit + fav_saving[v]:
                    if pick is None or est[rr, dp] < est[pick]:
                        pick = (rr, dp)
            if pick is not None:
                r, d = pick
        v = ready[int(r)]
        d = int(d)
        u = prob.unit_of[v]
        if unit_dev[u] < 0:
            unit_dev[u] = d
            use[d] += prob.umem[u, d]
        node_dev[v] = d
        finish_t[v] = est[r, d] + prob.node_time[v, d]
        dev_free[d] = finish_t[v]
        del arrival[v]
        for s in succ[v]:
            indeg[s] -= 1
            if indeg[s] == 0:
                make_ready(s)
    return unit_dev, float(finish_t.max(initial=0.0))


def favourite_children(prob: Problem) -> tuple[np.ndarray, np.ndarray, dict]:
    """Hanen-Munier favourite children from the LP relaxation: ``(fav_parent[n], saving[n], info)``.

    LP over start times ``s``, makespan ``w`` and edge variables ``x_e in [0, 1]``
    (1 = the edge pays its transfer)::

        min w  s.t.  s_j >= s_i + p_i + c_e x_e   (each edge e = i -> j)
                     sum_{e out of i} x_e >= outdeg(i) - 1,  sum_{e into j} x_e >= indeg(j) - 1
                     w >= s_i + p_i,  s >= 0

    with ``p`` the mean compute time over devices and ``c`` the mean transfer
    time over device pairs. An edge with ``x_e < 1/2`` names a favourite child.
    """
    g = prob.graph
    n, E = g.num_nodes, g.num_edges
    p = mean_finite(prob.node_time)
    D = prob.num_devices
    off = ~np.eye(D, dtype=bool)
    if D > 1:
        c = prob.lat[off].mean() + (g.edge_bytes / prob.microbatches) * (1.0 / prob.bw[off]).mean()
    else:
        c = np.zeros(E)
    fav_parent = np.full(n, -1, dtype=np.int64)
    saving = np.zeros(n)
    if E == 0:
        return fav_parent, saving, {"lp_status": "no edges"}
    nv = n + E + 1
    rows, cols, vals, rhs = [], [], [], []
    r = 0
    ei = np.arange(E)
    # s_i - s_j + c_e x_e <= -p_i
    rows += [ei, ei, ei]
    cols += [g.src, g.dst, n + ei]
    vals += [np.ones(E), -np.ones(E), c]
    rhs.append(-p[g.src])
    r = E
    for ends, deg in (
        (g.src, np.bincount(g.src, minlength=n)),
        (g.dst, np.bincount(g.dst, minlength=n)),
    ):
        has = np.flatnonzero(deg > 0)
        rowid = np.full(n, -1)
        rowid[has] = r + np.arange(len(has))
        rows.append(rowid[ends])
        cols.append(n + ei)
        vals.append(-np.ones(E))
        rhs.append(-(deg[has] - 1.0))
        r += len(has)
    rows.append(r + np.arange(n))
    cols.append(np.arange(n))
    vals.append(np.ones(n))
    rows.append(r + np.arange(n))
    cols.append(np.full(n, nv - 1))
    vals.append(-np.ones(n))
    rhs.append(-p)
    r += n
    A = sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, nv)
    )
    cost = np.zeros(nv)
    cost[-1] = 1.0
    bounds = [(0, None)] * n + [(0, 1)] * E + [(0, None)]
    res = linprog(cost, A_ub=A, b_ub=np.concatenate(rhs), bounds=bounds, method="highs")
    if res.status != 0:
        return fav_parent, saving, {"lp_status": res.message}
    x = res.x[n : n + E]
    for e in np.flatnonzero(x < 0.5):
        fav_parent[g.dst[e]] = g.src[e]
        saving[g.dst[e]] = c[e]
    return fav_parent, saving, {"lp_status": "optimal", "lp_makespan": float(res.fun)}


def m_etf(graph: CompGraph, cluster: Cluster, oracle: Oracle, budget: int | None = None) -> Plan:
    """Memory-constrained Earliest Task First (one oracle evaluation).

    Its placements are not pipelines, so each unit is charged the activations of all
    microbatches (``act_fraction=1``): an upper bound on what any schedule keeps.
    """
    start = oracle_calls_start(oracle)
    prob = make_problem(graph, cluster, oracle, act_fraction=1.0)
    up, est = list_schedule(prob)
    return finish(prob, up, "m_etf", start, model_makespan=est)


def m_sct(graph: CompGraph, cluster: Cluster, oracle: Oracle, budget: int | None = None) -> Plan:
    """Memory-constrained Small Communication Time first with the LP's favourite children.

    Memory as in :func:`m_etf`: all microbatches' activations (``act_fraction=1``).
    """
    start = oracle_calls_start(oracle)
    prob = make_problem(graph, cluster, oracle, act_fraction=1.0)
    fav, saving, info = favourite_children(prob)
    up, est = list_schedule(prob, fav, saving)
    return finish(
        prob,
        up,
        "m_sct",
        start,
        model_makespan=est,
        favourite_edges=int((fav >= 0).sum()),
        **info,
    )
