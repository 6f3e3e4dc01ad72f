"""`anneal`: simulated annealing / MCMC search over placements, FlexFlow style.

After FlexFlow's execution-optimizer search (Jia, Zaharia & Aiken, "Beyond
Data and Model Parallelism for Deep Neural Networks", SysML 2019), which runs
Metropolis-Hastings over strategies scored by a simulator, and classic
simulated annealing (Kirkpatrick et al., Science 1983). It minimises the
**oracle's step time** directly. Each step draws one of the moves placement
papers use (:func:`propose`): shift a stage boundary (units next to a change of
device along the topological order join the other side, as in pipeline
partitioners), move a unit to a device that holds one of its graph neighbours
(Placeto / Baechi-style locality), swap the devices of two units, or move a
whole colocation group to a random device (the only move before); moves keep the
static-memory model (:class:`Problem`). A move is accepted with
probability ``min(1, exp(-(new - cur) / T))``; plans the oracle reports as
out of memory are rejected. ``T`` decays geometrically from ``t0 * cur`` to
``t_end * t0 * cur``. The search starts from ``init`` when given (a per-node
placement, e.g. another baseline's plan: a warm start), else from the pipeline
DP's plan (a random memory-feasible one if that fails), and spends
**exactly** ``budget`` evaluations (default 1000) including the first, unless
``time_limit`` seconds run out first (then ``T`` follows the larger of the two
progress fractions, calls and seconds, so the schedule still cools to its end).
The returned plan is the best feasible one evaluated, so it is never slower than
a feasible start; ``meta["curve"]`` lists ``(oracle calls, wall seconds, best
step time)`` at the first feasible plan and at every improvement, for comparisons
at equal calls and at equal wall-clock (:func:`best_at`).
"""

from __future__ import annotations

import math
import time

import numpy as np

from agents.baselines.common import (
    InfeasiblePlanError,
    Problem,
    check_budget,
    check_seed,
    evaluate_units,
    finish,
    make_problem,
    oracle_calls_start,
    result_ok,
)
from agents.baselines.pipedream import dp_placement
from agents.baselines.simple import random_feasible
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan, check_placement
from graphs.schema import is_number
from placement_env.oracles.base import Oracle


def initial_placement(prob: Problem, rng: np.random.Generator) -> np.ndarray:
    """The pipeline DP's placement, else a random memory-feasible one."""
    try:
        return dp_placement(prob)
    except InfeasiblePlanError:
        pass
    for _ in range(100):
        up = random_feasible(prob, rng)
        if up is not None:
            return up
    raise InfeasiblePlanError(
        f"anneal: found no memory-feasible starting placement for {prob.graph.meta.get('name', '?')!r}"
    )


def unit_placement(prob: Problem, placement: np.ndarray, who: str = "anneal") -> np.ndarray:
    """The per-unit form of a per-node ``placement`` (or of a :class:`Plan` for this graph and
    cluster: another planner's result given as it is was "placement has shape ()", fuzzing);
    ``ValueError`` if it splits a colocation group."""
    if isinstance(placement, Plan):
        if placement.layout is not None:
            raise ValueError(f"{who}: init is a hybrid (dp x tp x pp) plan, not a placement")
        placement.check(prob.graph, prob.cluster)
        placement = placement.placement
    p = check_placement(placement, prob.graph, prob.cluster)
    up = np.full(prob.num_units, -1, dtype=np.int64)
    up[prob.unit_of] = p  # last writer wins; checked below
    split = np.flatnonzero(up[prob.unit_of] != p)
    if len(split):
        i = int(split[0])
        raise ValueError(
            f"{who}: init puts node {prob.graph.name[i]!r} on device {int(p[i])} but its colocation "
            f"group on device {int(up[prob.unit_of[i]])}; expected one device per group"
        )
    return up


#: Move kinds and their probabilities (placement papers' neighbourhoods; see the module docstring).
MOVES: dict[str, float] = {"boundary": 0.3, "neighbour": 0.3, "swap": 0.2, "group": 0.2}


def unit_neighbours(prob: Problem) -> list[np.ndarray]:
    """Units joined to each unit by a unit edge (either direction)."""
    U = prob.num_units
    a = np.concatenate([prob.usrc, prob.udst])
    b = np.concatenate([prob.udst, prob.usrc])
    order = np.argsort(a, kind="stable")
    ptr = np.zeros(U + 1, dtype=np.int64)
    np.cumsum(np.bincount(a, minlength=U), out=ptr[1:])
    b = b[order]
    return [np.unique(b[ptr[u] : ptr[u + 1]]) for u in range(U)]


def _fits_move(prob: Problem, use: np.ndarray, units: np.ndarray, src: np.ndarray, t: int) -> bool:
    """Whether moving ``units`` (now on devices ``src``) to device ``t`` keeps ``t`` within memory."""
    moving = units[src != t]
    if not len(moving):
        return False
    if not prob.allowed[moving, t].all():
        return False
    return bool(use[t] + prob.umem[moving, t].sum() <= prob.capacity[t])


def propose(
    prob: Problem,
    up: np.ndarray,
    use: np.ndarray,
    rng: np.random.Generator,
    nbrs: list[np.ndarray] | None = None,
    kind: str | None = None,
) -> tuple[np.ndarray, str] | None:
    """A neighbour of ``up`` that fits the memory model, and the move that made it.

    ``kind`` (default: drawn from :data:`MOVES`): ``"boundary"`` shifts a stage boundary
    (along the units' topological order, the 1-3 units just before or after a change of
    device join the device on the other side); ``"neighbour"`` moves a unit to a device
    holding one of its graph neighbours; ``"swap"`` exchanges the devices of two units;
    ``"group"`` moves a unit -- a whole colocation group -- to a random other device.
    Up to 32 draws per move; ``None`` when none fits.
    """
    U, D = prob.num_units, prob.num_devices
    if D < 2 or U == 0:
        return None
    allowed = prob.allowed
    if nbrs is None:
        nbrs = unit_neighbours(prob)
    names = list(MOVES)
    kinds = (
        [kind]
        if kind
        else list(rng.choice(names, size=len(names), replace=False, p=list(MOVES.values())))
    )
    seq = up[prob.order]
    cuts = np.flatnonzero(seq[1:] != seq[:-1])  # boundary between positions i and i+1
    for k in kinds:
        for _ in range(32):
            new = up.copy()
            if k == "boundary":
                if not len(cuts):
                    break
                i = int(rng.choice(cuts))
                w = int(rng.integers(1, 4))
                if rng.random() < 0.5:  # the units before the cut join the device after it
                    pos = np.arange(max(i - w + 1, 0), i + 1)
                    t = int(seq[i + 1])
                else:
                    pos = np.arange(i + 1, min(i + 1 + w, U))
                    t = int(seq[i])
                units = prob.order[pos]
                if not _fits_move(prob, use, units, up[units], t):
                    continue
                new[units] = t
            elif k == "neighbour":
                u = int(rng.integers(U))
                devs = np.unique(up[nbrs[u]]) if len(nbrs[u]) else np.zeros(0, dtype=np.int64)
                devs = devs[devs != up[u]]
                if not len(devs):
                    continue
                t = int(rng.choice(devs))
                if not _fits_move(prob, use, np.array([u]), up[[u]], t):
                    continue
                new[u] = t
            elif k == "swap":
                u, v = (int(x) for x in rng.integers(U, size=2))
                a, b = int(up[u]), int(up[v])
                if a == b or not (allowed[u, b] and allowed[v, a]):
                    continue
                if not (
                    use[a] - prob.umem[u, a] + prob.umem[v, a] <= prob.capacity[a]
                    and use[b] - prob.umem[v, b] + prob.umem[u, b] <= prob.capacity[b]
                ):
                    continue
                new[u], new[v] = b, a
            else:  # "group"
                u = int(rng.integers(U))
                ok = np.flatnonzero(allowed[u] & (use + prob.umem[u] <= prob.capacity))
                ok = ok[ok != up[u]]
                if not len(ok):
                    continue
                new[u] = int(rng.choice(ok))
            return new, str(k)
    return None


def anneal(
    graph: CompGraph,
    cluster: Cluster,
    oracle: Oracle,
    budget: int | None = None,
    *,
    seed: int = 0,
    t0: float = 0.01,
    t_end: float = 1e-3,
    init: np.ndarray | Plan | None = None,
    time_limit: float | None = None,
) -> Plan:
    """Metropolis search on the oracle's step time; ``budget`` evaluations (default 1000),
    or fewer when ``time_limit`` seconds (counted from the call) run out first.

    ``init``: a per-node placement (one device per node, colocation groups kept
    together) to start from instead of the pipeline DP's plan. It may be
    infeasible; the search then moves towards plans that fit. The first evaluation
    is always made, whatever ``time_limit``.
    """
    start = oracle_calls_start(oracle)
    t_start = time.perf_counter()
    n_eval = check_budget("anneal", budget, 1000)
    seed = check_seed("anneal", seed)
    if time_limit is not None and not is_number(time_limit, 0, lo_open=True):
        raise ValueError(f"anneal: time_limit must be > 0 seconds, got {time_limit!r}")
    for what, v in (("t0", t0), ("t_end", t_end)):  # "1" a TypeError, inf taken (2 Dec 2026)
        if not is_number(v):
            raise ValueError(f"anneal: {what} must be a finite number, got {v!r}")
    if not (t0 > 0 and 0 < t_end <= 1):
        raise ValueError(f"anneal: need t0 > 0 and 0 < t_end <= 1, got t0={t0}, t_end={t_end}")
    prob = make_problem(graph, cluster, oracle)
    rng = np.random.default_rng(seed)
    cur = initial_placement(prob, rng) if init is None else unit_placement(prob, init)
    res = evaluate_units(prob, cur)
    spent, accepted, stuck = 1, 0, 0
    cur_cost = float(res.step_time) if result_ok(res) else math.inf
    best = (cur_cost, cur, res) if result_ok(res) else None
    curve: list[tuple[int, float, float]] = []
    if best is not None:
        curve.append((1, time.perf_counter() - t_start, cur_cost))
    first = cur_cost
    use = prob.memory_use(cur)
    temp0 = t0 * (cur_cost if np.isfinite(cur_cost) else 1.0)
    temp = temp0
    stop = "budget"
    nbrs = unit_neighbours(prob)
    tried = dict.fromkeys(MOVES, 0)
    took = dict.fromkeys(MOVES, 0)
    while spent < n_eval:
        elapsed = time.perf_counter() - t_start
        if time_limit is not None and elapsed >= time_limit:
            stop = "time_limit"
            break
        step = propose(prob, cur, use, rng, nbrs)
        if step is None:
            stuck += 1
            if stuck > 10 * n_eval:
                break
            continue
        new, kind = step
        tried[kind] += 1
        r = evaluate_units(prob, new)
        spent += 1
        frac = (spent - 1) / max(n_eval - 1, 1)
        if time_limit is not None:
            frac = max(frac, (time.perf_counter() - t_start) / time_limit)
        temp = temp0 * t_end ** min(frac, 1.0)
        if not result_ok(r):
            continue
        cost = float(r.step_time)
        if cost <= cur_cost or rng.random() < math.exp(-(cost - cur_cost) / max(temp, 1e-300)):
            cur, cur_cost, accepted = new, cost, accepted + 1
            took[kind] += 1
            use = prob.memory_use(cur)
            if best is None or cost < best[0]:
                best = (cost, new, r)
                curve.append((spent, time.perf_counter() - t_start, cost))
    if best is None:
        raise InfeasiblePlanError(
            f"anneal: none of {spent} evaluated placements of {graph.meta.get('name', '?')!r} fits in memory"
        )
    return finish(
        prob,
        best[1],
        "anneal",
        start,
        result=best[2],
        initial_step_time=first,
        accepted=accepted,
        acceptance_rate=accepted / max(spent - 1, 1),
        seed=seed,
        warm_start=init is not None,
        moves_tried=tried,
        moves_accepted=took,
        evaluations=spent,
        stopped_by=stop,
        time_limit=time_limit,
        curve=curve,
    )


def best_at(
    curve: list[tuple[int, float, float]], *, calls: int | None = None, seconds: float | None = None
) -> float | None:
    """The best step time of an ``anneal`` ``meta["curve"]`` within ``calls`` oracle calls
    and/or ``seconds`` of wall time (``None``: no feasible plan by then)."""
    out = None
    for n, t, v in curve:
        if (calls is None or n <= calls) and (seconds is None or t <= seconds):
            out = v if out is None else min(out, v)
    return out
