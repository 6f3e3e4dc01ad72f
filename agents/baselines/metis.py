"""`metis`: k-way graph partitioning with METIS (Karypis & Kumar, SIAM J. Sci. Comput. 1998).

The classic partitioning baseline of the placement literature (e.g. Mirhoseini
et al., ICML 2017; Baechi, SoCC 2020). The undirected graph of colocation units
is cut into one part per device by ``pymetis``: it minimises the **edge cut
weighted by tensor bytes** subject to balanced parts, where a unit's vertex
weight is its compute time (target part weights follow device speed on
heterogeneous clusters). On identical devices the parts are then laid along the
topology-aware device chain in order of their mean topological position, so
neighbouring parts talk over fast links. Parts that overflow memory (or hold a
unit a device cannot run) are repaired by moving units with the least added
cut (:func:`repair_memory`).
"""

from __future__ import annotations

import numpy as np
import pymetis

from agents.baselines.common import (
    Problem,
    c_output_captured,
    check_seed,
    device_chain,
    finish,
    make_problem,
    mean_finite,
    oracle_calls_start,
    repair_memory,
)
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from placement_env.oracles.base import Oracle

#: Integer resolution of the weights handed to METIS.
WEIGHT_SCALE = 10_000


def _int_weights(x: np.ndarray) -> np.ndarray:
    top = float(x.max(initial=0.0))
    if top <= 0:
        return np.ones(len(x), dtype=np.int64)
    return np.maximum(np.rint(x / top * WEIGHT_SCALE), 1).astype(np.int64)


def metis_parts(
    prob: Problem, nparts: int, tpwgts: list[float] | None, seed: int
) -> tuple[np.ndarray, list[str]]:
    """METIS part of each unit (``int64[U]``) for the undirected byte-weighted unit graph, and
    the lines the METIS C library printed meanwhile (e.g. "Cannot bisect a graph with 0
    vertices!" when a part's target share is below one unit), which are captured for the
    plan's ``meta["metis_messages"]`` rather than left on the user's terminal."""
    U = prob.num_units
    if nparts <= 1 or U <= 1:
        return np.zeros(U, dtype=np.int64), []
    a = np.concatenate([prob.usrc, prob.udst])
    b = np.concatenate([prob.udst, prob.usrc])
    w = np.concatenate([prob.ubytes, prob.ubytes])
    key = a * U + b
    uniq, inv = np.unique(key, return_inverse=True)
    wsum = np.bincount(inv, weights=w, minlength=len(uniq))
    src, dst = uniq // U, uniq % U
    xadj = np.zeros(U + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=U), out=xadj[1:])
    vw = mean_finite(prob.time)
    if tpwgts is not None:
        # METIS refuses a target weight that is 0 in float32 (a device 1e300 times slower
        # than the others: "Incorrect tpwgts", then a RuntimeError); such a device gets a
        # share of at least MIN_SHARE, which changes no ordinary cluster's targets
        tp = np.maximum(np.asarray(tpwgts, dtype=np.float64), MIN_SHARE)
        tpwgts = (tp / tp.sum()).tolist()
    opts = pymetis.Options(seed=seed)
    with c_output_captured() as said:
        _, parts = pymetis.part_graph(
            nparts,
            adjacency=pymetis.CSRAdjacency(xadj.tolist(), dst.tolist()),
            vweights=_int_weights(vw).tolist(),
            eweights=_int_weights(wsum).tolist(),
            tpwgts=tpwgts,
            options=opts,
        )
    messages = [ln.strip().lstrip("*") for ln in said.text.splitlines() if ln.strip()]
    return np.asarray(parts, dtype=np.int64), messages


#: Smallest target share of one part handed to METIS (see :func:`metis_parts`).
MIN_SHARE = 1e-6


def metis(
    graph: CompGraph,
    cluster: Cluster,
    oracle: Oracle,
    budget: int | None = None,
    *,
    seed: int = 0,
) -> Plan:
    """Byte-weighted k-way cut with compute-balanced parts, memory-repaired (one evaluation)."""
    seed = check_seed("metis", seed)
    start = oracle_calls_start(oracle)
    prob = make_problem(graph, cluster, oracle)
    chain = device_chain(cluster)
    D = len(chain)
    speed = np.array([1.0 / max(prob.time[:, d].sum(), 1e-30) for d in chain])
    homogeneous = bool(np.allclose(speed, speed[0]))
    tpwgts = None if homogeneous else (speed / speed.sum()).tolist()
    parts, messages = metis_parts(prob, D, tpwgts, seed)
    if homogeneous:
        pos = np.empty(prob.num_units)
        pos[prob.order] = np.arange(prob.num_units)
        mean_pos = [pos[parts == k].mean() if (parts == k).any() else np.inf for k in range(D)]
        rank = np.argsort(np.argsort(mean_pos, kind="stable"), kind="stable")
        up = np.asarray(chain)[rank[parts]]
    else:
        up = np.asarray(chain)[parts]
    fitted = prob.fits(up)
    up = repair_memory(prob, up)
    a, b = up[prob.usrc], up[prob.udst]
    return finish(
        prob,
        up,
        "metis",
        start,
        cut_bytes=float(prob.ubytes[a != b].sum()),
        repaired=not fitted,
        seed=seed,
        metis_messages=messages,
    )
