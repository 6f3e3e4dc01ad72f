"""Reference baselines: one device (`single`), `round_robin` and best-of-N `random` placement.

`single` is the no-parallelism reference of every placement paper (e.g.
Mirhoseini et al., ICML 2017, Table 1 "Single-CPU/GPU"); it minimises nothing
but reports the fastest device that holds the whole model. `round_robin` deals
colocation units to devices in turn (a load-spreading strawman). `random`
(the random-search baseline of Mirhoseini et al. 2017 and Addanki et al.,
ICLR 2019) minimises the oracle's step time over N memory-feasible random
placements.
"""

from __future__ import annotations

import numpy as np

from agents.baselines.common import (
    InfeasiblePlanError,
    Problem,
    check_budget,
    check_seed,
    evaluate_units,
    finish,
    fmt_bytes,
    make_problem,
    oracle_calls_start,
    result_ok,
)
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from placement_env.oracles.base import Oracle, SimResult


def single(graph: CompGraph, cluster: Cluster, oracle: Oracle, budget: int | None = None) -> Plan:
    """Everything on the fastest device that fits (oracle-checked); infeasible if none does.

    Devices are tried fastest first (summed compute time); a device whose memory
    is below the graph's persistent state is skipped without an evaluation. At
    most ``budget`` devices are evaluated (default: all).
    """
    start = oracle_calls_start(oracle)
    prob = make_problem(graph, cluster, oracle)
    U, D = prob.num_units, prob.num_devices
    total = prob.time.sum(axis=0)
    state = float(graph.param_bytes.sum())
    tries = check_budget("single", budget, D)
    reasons = []
    for d in np.argsort(total, kind="stable"):
        name = cluster.devices[d].name
        if not np.isfinite(total[d]):
            reasons.append(f"{name}: some node cannot run there")
            continue
        if state > cluster.devices[d].memory:
            reasons.append(
                f"{name}: persistent state {fmt_bytes(state)} > memory {fmt_bytes(cluster.devices[d].memory)}"
            )
            continue
        if tries <= 0:
            reasons.append(f"{name}: evaluation budget spent")
            continue
        tries -= 1
        up = np.full(U, d, dtype=np.int64)
        res = evaluate_units(prob, up)
        if result_ok(res):
            return finish(prob, up, "single", start, result=res, device=int(d))
        reasons.append(
            f"{name}: out of memory (peak {fmt_bytes(float(res.peak_memory[d]))})"
            if res.oom
            else f"{name}: infeasible ({getattr(res, 'infeasible_reason', '') or 'infinite step time'})"
        )
    raise InfeasiblePlanError(
        f"single: graph {graph.meta.get('name', '?')!r} fits on no single device of "
        f"{cluster.name!r}: {'; '.join(reasons)}"
    )


def round_robin(
    graph: CompGraph, cluster: Cluster, oracle: Oracle, budget: int | None = None
) -> Plan:
    """Units in topological order go to devices 0, 1, ..., D-1, 0, ... skipping full devices."""
    start = oracle_calls_start(oracle)
    prob = make_problem(graph, cluster, oracle)
    D = prob.num_devices
    allowed = prob.allowed
    up = np.zeros(prob.num_units, dtype=np.int64)
    use = np.zeros(D)
    nxt = 0
    for u in prob.order:
        for k in range(D):
            d = (nxt + k) % D
            if allowed[u, d] and use[d] + prob.umem[u, d] <= prob.capacity[d]:
                break
        else:
            raise InfeasiblePlanError(
                f"round_robin: unit of node {graph.name[np.flatnonzero(prob.unit_of == u)[0]]!r} "
                "fits on no device with room left"
            )
        up[u] = d
        use[d] += prob.umem[u, d]
        nxt = (d + 1) % D
    return finish(prob, up, "round_robin", start)


def random_feasible(prob: Problem, rng: np.random.Generator) -> np.ndarray | None:
    """A uniformly random unit placement that fits the memory model, or None if a draw dead-ends."""
    allowed = prob.allowed
    use = np.zeros(prob.num_devices)
    up = np.zeros(prob.num_units, dtype=np.int64)
    for u in rng.permutation(prob.num_units):
        ok = np.flatnonzero(allowed[u] & (use + prob.umem[u] <= prob.capacity))
        if not len(ok):
            return None
        d = int(rng.choice(ok))
        up[u] = d
        use[d] += prob.umem[u, d]
    return up


def random_search(
    graph: CompGraph,
    cluster: Cluster,
    oracle: Oracle,
    budget: int | None = None,
    *,
    seed: int = 0,
) -> Plan:
    """Best of ``budget`` (default 100) random memory-feasible placements by oracle step time."""
    start = oracle_calls_start(oracle)
    prob = make_problem(graph, cluster, oracle)
    n = check_budget("random", budget, 100)
    rng = np.random.default_rng(check_seed("random", seed))
    best: tuple[float, np.ndarray, SimResult] | None = None
    draws = dead = 0
    while draws < n and dead < 20 * n:
        up = random_feasible(prob, rng)
        if up is None:
            dead += 1
            continue
        draws += 1
        res = evaluate_units(prob, up)
        if result_ok(res) and (best is None or res.step_time < best[0]):
            best = (float(res.step_time), up, res)
    if best is None:
        raise InfeasiblePlanError(
            f"random: none of {draws} random placements ({dead} dead-ended draws) fits in memory"
        )
    return finish(prob, best[1], "random", start, result=best[2], samples=draws, seed=seed)
