"""`ideal_dp`: the optimal contiguous split for max-load, by dynamic programming over ideals.

After Tarnawski, Phanishayee, Devanur, Mahajan & Nina Paravecino, "Efficient
Algorithms for Device Placement of DNN Graph Operators" (NeurIPS 2020), Section 4.

**Splits considered.** Colocation units (the graph's groups) are ordered by the
*precedence DAG*: edges between forward nodes, plus, for a unit with no forward
node, its backward/optimizer edges mirrored (as the paper's artificial forward
nodes do); units on a cycle of it are fused, since no contiguous split can part
them. The fused units are the DP's *items*. A split is *contiguous* when its
stages can be ordered so that every prefix union is an *ideal* (a
downward-closed item set) -- equivalently the devices' quotient graph is
acyclic. Each stage goes to its own device; backward and optimizer nodes follow
their unit.

**Objective.** Exactly ``Simulator(objective="max_load")`` (see
:class:`agents.baselines.maxload.MaxLoadModel`): a stage's load is its compute
plus, on a non-CPU device, for each producer node inside with a consumer outside
the largest such transfer, and for each producer outside with consumers inside
the largest of those. In a contiguous split a stage's device holds exactly that
stage, so this is the device's load whatever the other stages are, provided
every route between two devices costs the same (``MaxLoadModel.uniform``; else
the dearest route is charged, an upper bound, and ``meta["exact"]`` is False).

**Devices.** Devices with equal compute times, capacity and CPU-ness form a
*class* (e.g. 8 accelerators + 1 host CPU = 2 classes, the paper's FPGAs and
CPUs). ``dp[I][k]`` = least bottleneck of splitting ideal ``I`` into stages on
``k[c]`` devices of each class ``c``;
``dp[I][k] = min_{J <= I, c} max(dp[J][k - e_c], cost_c(I \\ J))`` with memory
``mem(I \\ J) <= capacity_c``; the answer is ``min_k dp[all][k]``.

**Explosion, and what is pruned.** The number of ideals grows exponentially with
the graph's width. Remedies, each reported in ``meta``:

1. *Bounding* (exact): chain DPs over three topological orders of the items (the
   paper's "linearize" remedy, O(items^2) stages each: the items' own order, a
   depth-first one and a level one, :func:`linear_extensions`) run first and give
   an upper bound ``UB``; the full DP keeps only stages whose compute is within
   ``UB``, and after which the remaining work still fits the remaining devices
   within ``UB``, and the ideals reached that way. Nothing better than ``UB`` is lost.
2. *Dropping edge-free units* (``isolated="drop"``, the default): a unit with no
   edge to any other unit (a constant, a parameter read by nothing else, a
   BatchNorm step counter) would double the ideals, yet adds only its compute
   and memory to whichever device holds it. The DP runs without them; then each
   is put, largest first, on the device where it fits in memory and raises the
   largest load least (:func:`reinsert_isolated`). The plan is still a
   contiguous split. It is reported ``exact`` only when its objective meets a
   lower bound on the whole problem's contiguous optimum, ``dp_lower_bound`` =
   max(the reduced DP's optimum -- removing edge-free units from any split lowers
   no load and frees memory --, the least total compute / devices); otherwise
   ``meta["dp_gap"]`` = objective / bound - 1 (``meta["dropped_units"]``). When the
   reduced DP finished but the re-insertion is not proven, the DP with those units kept
   runs too (in at most twice the time spent so far, or 1 s, within ``time_limit``) and
   the better plan is returned (``meta["isolated"]`` says so,
   ``meta["dropped_units_plan_objective"]`` is the re-inserted plan's); since 30 Nov 2026,
   when fuzzing found re-insertion 37-65 % above the contiguous optimum on small graphs.
   ``isolated="keep"`` keeps them in the DP (the behaviour before).
3. *Pinning isolated items* (a documented restriction): items with no precedence
   edge at all that are still left (with ``isolated="keep"``, or joined to others
   only by backward edges) would each double the ideals;
   when there are more than ``pin_isolated_above`` of them they are chained to
   their neighbours in the topological order (``meta["pinned_items"]``).
4. *Limits*: when the full DP exceeds ``max_ideals`` (default: as many ideals as
   fit in about 1 GiB of tables, ``TABLE_BYTES``; a value given is honoured, whatever
   memory it takes: ``meta["ideal_table_bytes"]``) or ``time_limit`` it stops
   and the best of the chain DPs' plans and the full DP's incumbent is returned
   (``meta["status"]`` says which limit; ``meta["exact"]`` False).
5. *More linearizations when the full DP stopped* (``random_orders``, default 2000
   in :func:`ideal_dp`): the time left before ``time_limit`` goes to chain DPs over
   random depth-first topological orders (the items a placed item releases are
   pushed in a random order, :func:`random_linear_extension`; seeded by ``seed``),
   each bounded by the best split so far. A heuristic for the plan returned, not a
   proof: ``meta["random_orders"]`` (orders run), ``meta["objective_before_random_orders"]``
   (seconds) and ``meta["random_orders_improved"]``.

Cuts that keep the enumeration small (none changes the optimum; see
:mod:`agents.baselines._ideal_kernel`): a stage's compute or memory past what any
class can take within the incumbent ``UB``; a stage after which the work left
exceeds what the free devices can do within ``UB``; and, since the stages are
enumerated with their items in increasing order, a skipped item and everything
after it can no longer join the stage, so once their work exceeds what the free
devices can do within ``UB`` the whole branch is cut; and (``transfer_cut=True``, the
default) a branch is cut once the transfers that every stage in it must pay -- with
the ideal it starts from and with the items it can no longer take -- plus its
compute exceed ``UB`` on every class that could hold it.

``meta["ideals_total"]`` is how many ideals the item DAG has (the empty and the full set
included; a float, since it can pass 1e36), counted before the DP from the DAG's
series-parallel structure (:func:`agents.baselines.ideal_count.count_ideals`, within
``COUNT_SECONDS`` and 5 % of ``time_limit``; ``None`` when the count did not finish): the
DP visits at most these, and far fewer within its bound, so a figure far beyond
``max_ideals`` says no time limit will let it finish. When the count fits the table limit
the tables are sized to it and the DP runs once (else they start at 200,000 ideals and the
DP starts again with four times as many each time it runs out, :func:`run_growing`).

``meta["exact"]`` is True only when the full DP finished on exact costs with
nothing pinned (and, with units dropped, the re-inserted plan meets the bound):
the plan is then optimal among all contiguous splits.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from agents.baselines._ideal_kernel import (
    STATUS_COLLISION,
    STATUS_DONE,
    STATUS_IDEALS,
    STATUS_STACK,
    STATUS_TIME,
    ideal_dp_kernel,
)
from agents.baselines.common import (
    InfeasiblePlanError,
    Problem,
    check_flag,
    check_seconds,
    check_seed,
    finish,
    make_problem,
    oracle_calls_start,
)
from agents.baselines.ideal_count import count_ideals
from agents.baselines.maxload import MaxLoadModel, build_model
from graphs.cluster import Cluster
from graphs.compgraph import FWD, CompGraph
from graphs.plan import Plan
from graphs.schema import is_whole
from placement_env.oracles.base import Oracle

#: Memory for the DP's ideal tables when ``max_ideals`` is None (bytes).
TABLE_BYTES = 1 << 30

#: Most seconds spent counting the item DAG's ideals (``meta["ideals_total"]``,
#: :func:`agents.baselines.ideal_count.count_ideals`); at most 5 % of ``time_limit``.
COUNT_SECONDS = 1.0


def _as_float(n: int) -> float:
    try:
        return float(n)
    except OverflowError:
        return float("inf")


_STATUS = {
    STATUS_DONE: "done",
    STATUS_TIME: "time_limit",
    STATUS_IDEALS: "max_ideals",
    STATUS_COLLISION: "hash_collision",
    STATUS_STACK: "stack_limit",
}


@dataclass(frozen=True)
class Items:
    """The DP's atoms: ``item_of_unit[u]``, numbered in a topological order of the precedence DAG."""

    item_of_unit: np.ndarray  # int64[U]
    succ: list[list[int]]  # precedence successors per item (after pinning)
    pinned: int  # isolated items chained to their neighbours
    fused_units: int  # units merged with others because they lie on a precedence cycle


def edge_free_units(graph: CompGraph, unit_of: np.ndarray) -> np.ndarray:
    """``bool[U]``: units with no graph edge to any other unit (e.g. a constant or a counter).

    Such a unit adds only its compute and memory to the device it is on: no transfer is
    charged for it and no precedence ties it to a stage.
    """
    U = int(unit_of.max()) + 1 if len(unit_of) else 0
    a, b = unit_of[graph.src], unit_of[graph.dst]
    cross = a != b
    touched = np.zeros(U, dtype=bool)
    touched[a[cross]] = True
    touched[b[cross]] = True
    return ~touched


def precedence_items(
    graph: CompGraph,
    unit_of: np.ndarray,
    pin_isolated_above: int | None = 8,
    drop: np.ndarray | None = None,
) -> Items:
    """Fuse units along cycles of the precedence DAG, number them topologically, pin isolated ones.

    ``pin_isolated_above``: chain isolated items when there are more than this many
    (``None``: never; ``0``: always). ``drop``: ``bool[U]`` units left out of the items
    (they must have no edge to another unit, :func:`edge_free_units`); their
    ``item_of_unit`` is -1.
    """
    if pin_isolated_above is not None and not is_whole(pin_isolated_above, 0):
        raise ValueError(
            "ideal_dp: pin_isolated_above must be an integer >= 0 or None (never pin), "
            f"got {pin_isolated_above!r}"
        )
    U = int(unit_of.max()) + 1 if len(unit_of) else 0
    fwd = graph.kind == FWD
    has_fwd = np.bincount(unit_of[fwd], minlength=U) > 0
    src, dst = graph.src, graph.dst
    ff = fwd[src] & fwd[dst]
    orphan = ~fwd[src] & ~fwd[dst] & (~has_fwd[unit_of[src]] | ~has_fwd[unit_of[dst]])
    us = np.concatenate([unit_of[src[ff]], unit_of[dst[orphan]]])
    ud = np.concatenate([unit_of[dst[ff]], unit_of[src[orphan]]])
    keep = us != ud
    us, ud = us[keep], ud[keep]
    A = sp.csr_matrix((np.ones(len(us)), (us, ud)), shape=(U, U))
    nb, lab = connected_components(A, directed=True, connection="strong")
    gone = np.zeros(nb, dtype=bool)
    if drop is not None and drop.any():
        assert edge_free_units(graph, unit_of)[drop].all(), "only edge-free units can be dropped"
        gone[lab[np.flatnonzero(drop)]] = True
    bs, bd = lab[us], lab[ud]
    keep = bs != bd
    pairs = sorted(set(zip(bs[keep].tolist(), bd[keep].tolist())))
    succ: list[set[int]] = [set() for _ in range(nb)]
    indeg = np.zeros(nb, dtype=np.int64)
    for a, b in pairs:
        succ[a].add(b)
        indeg[b] += 1
    # topological order of blocks, ties by their first node in the graph's topological order
    pos = np.empty(graph.num_nodes, dtype=np.int64)
    pos[graph.topo_order] = np.arange(graph.num_nodes)
    first = np.full(nb, graph.num_nodes, dtype=np.int64)
    np.minimum.at(first, lab[unit_of], pos)
    heap = [(int(first[b]), b) for b in range(nb) if indeg[b] == 0 and not gone[b]]
    heapq.heapify(heap)
    order: list[int] = []
    deg = indeg.copy()
    while heap:
        _, b = heapq.heappop(heap)
        order.append(b)
        for c in sorted(succ[b]):
            deg[c] -= 1
            if deg[c] == 0:
                heapq.heappush(heap, (int(first[c]), c))
    assert len(order) == nb - int(gone.sum()), (
        "precedence graph must be acyclic after fusing its cycles"
    )
    nk = len(order)
    isolated = (
        [b for b in range(nb) if indeg[b] == 0 and not succ[b] and not gone[b]] if nk > 1 else []
    )
    pinned = 0
    if pin_isolated_above is not None and len(isolated) > pin_isolated_above:
        where = {b: i for i, b in enumerate(order)}
        for b in isolated:
            i = where[b]
            if i > 0:
                succ[order[i - 1]].add(b)
            if i + 1 < nk:
                succ[b].add(order[i + 1])
        pinned = len(isolated)
    rank = np.full(nb, -1, dtype=np.int64)
    rank[np.asarray(order, dtype=np.int64)] = np.arange(nk)
    item_succ: list[list[int]] = [[] for _ in range(nk)]
    for b in order:
        item_succ[int(rank[b])] = sorted(int(rank[c]) for c in succ[b])
    return Items(
        item_of_unit=rank[lab].astype(np.int64),
        succ=item_succ,
        pinned=pinned,
        fused_units=int(U - nb),
    )


def dp_items(
    graph: CompGraph,
    unit_of: np.ndarray,
    isolated: str = "drop",
    pin_isolated_above: int | None = 8,
) -> tuple[Items, np.ndarray]:
    """``(items, drop)``: the DP's items (:func:`precedence_items`) and ``bool[U]``, the
    edge-free units left out of them (``isolated="drop"``, all but one if every unit is)."""
    U = int(unit_of.max()) + 1 if len(unit_of) else 0
    drop = np.zeros(U, dtype=bool)
    if isolated == "drop" and U > 1:
        drop = edge_free_units(graph, unit_of)
        if drop.all():  # keep one unit for the DP
            drop[0] = False
    return precedence_items(graph, unit_of, pin_isolated_above, drop=drop), drop


def device_classes(
    model: MaxLoadModel, capacity: np.ndarray
) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    """``(devices of each class, capacity per class, pays transfers per class)``.

    Devices fall into one class when their compute times, capacity and CPU-ness agree.
    """
    groups: dict[tuple, list[int]] = {}
    for d in range(model.num_devices):
        key = (model.comp[:, d].tobytes(), float(capacity[d]), bool(model.nocomm[d]))
        groups.setdefault(key, []).append(d)
    classes = list(groups.values())
    cap = np.array([float(capacity[c[0]]) for c in classes])
    pays = np.array([not model.nocomm[c[0]] for c in classes], dtype=bool)
    return classes, cap, pays


def _csr(keys: np.ndarray, n: int, *cols: np.ndarray) -> tuple[np.ndarray, ...]:
    order = np.argsort(keys, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=ptr[1:])
    return (ptr, *(np.ascontiguousarray(c[order]) for c in cols))


def _succ_csr(succ: list[list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    B = len(succ)
    a = np.array([i for i, s in enumerate(succ) for _ in s], dtype=np.int64)
    b = np.array([j for s in succ for j in s], dtype=np.int64)
    sptr, sidx = _csr(a, B, b)
    pptr, pidx = _csr(b, B, a)
    return sptr, sidx, pptr, pidx


@dataclass(frozen=True, eq=False)
class StageKernel:
    """The kernel's inputs that do not depend on the items' order, and :meth:`run` to call it.

    Built by :func:`stage_kernel`; shared by `ideal_dp` (max-load) and `ideal_dp_makespan`
    (sums of stage costs under a cap on each, ``summed=True``).
    """

    B: int  # items
    n: int  # graph nodes
    node_item: np.ndarray  # int64[n] item of each node (-1: dropped)
    keepn: np.ndarray  # int64[.] nodes of kept items
    classes: list[list[int]]  # devices of each class
    cap: np.ndarray  # float64[K] usable bytes per class
    pays: np.ndarray  # bool[K] class pays transfers
    counts: np.ndarray  # int64[K] devices per class
    comp_item: np.ndarray  # float64[B, K]
    work_item: np.ndarray  # float64[B] least compute over classes
    mem_item: np.ndarray  # float64[B]
    rate: np.ndarray  # float64[K]
    pairs: tuple[np.ndarray, ...]  # CSR consumer / producer pairs across items
    keys: np.ndarray  # int64[B] Zobrist keys
    per_ideal: int  # table bytes per ideal
    # position-dependent memory (see `stage_kernel`'s ``act_frac``); off by default
    act_item: np.ndarray | None = None  # float64[B]
    act_extra: np.ndarray | None = None  # float64[P]

    def run(
        self,
        perm: np.ndarray,
        succ: list[list[int]],
        ub: float,
        limit: int,
        deadline: float,
        transfer_cut: bool = True,
        *,
        summed: bool = False,
        sum_bound: float = np.inf,
    ) -> tuple[int, np.ndarray | None, float, int, int]:
        """The kernel with items relabelled so that ``perm`` (new -> old) is their order;
        ``succ`` in the new labels must only point to larger labels.

        ``(status, device of each item or None, the best value, ideals, stages scored)``;
        the value is the bottleneck, or with ``summed`` the least sum of stage costs with
        every stage below ``ub``.
        """
        B, n = self.B, self.n
        act_item = self.act_item if self.act_item is not None else np.zeros(B)
        act_extra = self.act_extra if self.act_extra is not None else np.zeros(1)
        rank = np.empty(B, dtype=np.int64)
        rank[perm] = np.arange(B)
        ni = np.zeros(n, dtype=np.int64)  # dropped nodes: no cross pair reaches them
        ni[self.keepn] = rank[self.node_item[self.keepn]]
        inptr, inidx = _csr(ni[self.keepn], B, self.keepn)
        sptr, sidx, pptr, pidx = _succ_csr(succ)
        status, nI, dp, bJ, bC, bits, full, visited = ideal_dp_kernel(
            B, sptr, sidx, np.diff(pptr), pptr, pidx, inptr, inidx, ni, *self.pairs,
            self.comp_item[perm], self.work_item[perm], self.mem_item[perm], self.cap,
            self.pays, self.counts, float(ub), self.keys, int(limit), float(deadline),
            self.rate, True, bool(transfer_cut), bool(summed), float(sum_bound),
            self.act_extra is not None, act_item[perm], act_extra,
        )  # fmt: skip
        if status == STATUS_COLLISION or full < 0 or not np.isfinite(dp[full].min()):
            return status, None, np.inf, nI, visited
        dev = _backtrack(dp, bJ, bC, bits, full, self.counts, self.classes, B)
        out = np.empty(B, dtype=np.int64)
        out[perm] = dev
        return status, out, float(dp[full].min()), nI, visited


def stage_kernel(
    prob: Problem,
    model: MaxLoadModel,
    items: Items,
    keepu: np.ndarray,
    act_frac: np.ndarray | None = None,
) -> StageKernel:
    """Per-item compute, work, memory and the transfer pairs of ``items`` (kept units ``keepu``).

    Memory is ``prob.mem`` per unit; with ``act_frac`` (one share per stage position
    ``0 .. D - 1``) it is ``prob.param + act_frac[p] * prob.act`` for a stage placed
    after ``p`` others instead (1F1B: stage ``p`` keeps ``min(M, D - p)`` of ``M``
    microbatches' activations)."""
    graph = prob.graph
    B = len(items.succ)
    node_item = items.item_of_unit[prob.unit_of]
    keepn = np.flatnonzero(node_item >= 0)
    classes, cap, pays = device_classes(model, prob.capacity)
    counts = np.array([len(c) for c in classes], dtype=np.int64)
    K = len(classes)
    rep = np.array([c[0] for c in classes], dtype=np.int64)
    comp_item = np.zeros((B, K))
    np.add.at(comp_item, node_item[keepn], model.comp[keepn][:, rep])
    fin = np.where(np.isfinite(comp_item), comp_item, np.inf)
    work_item = fin.min(axis=1) if K else np.zeros(B)
    work_item = np.where(np.isfinite(work_item), work_item, 0.0)
    # the most work (in least-compute units) one second of a class-c device can do
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(
            (comp_item > 0) & np.isfinite(comp_item), work_item[:, None] / comp_item, 0.0
        )
    rate = np.minimum(ratio.max(axis=0), 1.0) if B else np.ones(K)
    rate = np.where(rate > 0, rate, 1.0)  # no item has compute there: no bound from it
    iu = items.item_of_unit[keepu]
    act_item = act_extra = None
    if act_frac is None:
        mem_item = np.bincount(iu, weights=prob.mem[keepu], minlength=B)
    else:
        assert prob.param is not None and prob.act is not None
        act_frac = np.asarray(act_frac, dtype=np.float64)
        if act_frac.shape != (prob.num_devices,) or (act_frac < 0).any():
            raise ValueError(
                f"stage_kernel: act_frac must hold {prob.num_devices} shares >= 0, got {act_frac}"
            )
        fmin = float(act_frac.min())
        mem_item = np.bincount(iu, weights=prob.param[keepu] + fmin * prob.act[keepu], minlength=B)
        act_item = np.bincount(iu, weights=prob.act[keepu], minlength=B)
        act_extra = act_frac - fmin
    cost = model.uniform_cost()
    cross = node_item[model.psrc] != node_item[model.pdst]
    ps, pd, pc = model.psrc[cross], model.pdst[cross], cost[cross]
    n = graph.num_nodes
    optr, oidx, ocost = _csr(ps, n, pd, pc)
    iptr, iidx, icost = _csr(pd, n, ps, pc)
    keys = np.random.default_rng(0x1DEA1).integers(1, 2**63 - 1, size=B, dtype=np.int64)
    # NK dp columns per ideal (8 + 4 + 1 bytes each), its bit set, size, hash, list link and
    # hash-table entry
    NK = int(np.prod(counts + 1))
    W = (B + 63) // 64
    return StageKernel(
        B=B, n=n, node_item=node_item, keepn=keepn, classes=classes, cap=cap, pays=pays,
        counts=counts, comp_item=comp_item, work_item=work_item, mem_item=mem_item, rate=rate,
        pairs=(optr, oidx, ocost, iptr, iidx, icost), keys=keys, per_ideal=NK * 13 + W * 8 + 40,
        act_item=act_item, act_extra=act_extra,
    )  # fmt: skip


def ideal_capacity(max_ideals: int | None, per_ideal: int, name: str = "ideal_dp") -> int:
    """Ideals the tables may hold: ``max_ideals`` (checked) or as many as fit in TABLE_BYTES."""
    if max_ideals is not None and (
        isinstance(max_ideals, bool)
        or not isinstance(max_ideals, (int, float, np.integer, np.floating))
        or not float(max_ideals).is_integer()
        or max_ideals < 1
    ):
        raise ValueError(f"{name}: max_ideals must be a positive int or None, got {max_ideals!r}")
    return int(max(16, TABLE_BYTES // per_ideal) if max_ideals is None else max_ideals)


def run_growing(
    call: Callable[[int], tuple[int, np.ndarray | None, float, int, int]],
    cap_ideals: int,
    start: int | None = None,
) -> tuple[tuple[int, np.ndarray | None, float, int, int], int]:
    """``(call(limit), limit)``: the kernel run with tables of ``start`` (default 200,000)
    ideals, again with four times as many while it runs out of them, up to ``cap_ideals``;
    the stages scored (the result's last field) are summed over the tries. A ``start`` of
    the DAG's whole ideal count never runs out, so the DP runs once."""
    limit = min(cap_ideals, 200_000 if start is None else max(16, int(start)))
    visited = 0
    while True:
        out = call(limit)
        visited += out[4]
        if out[0] != STATUS_IDEALS or limit >= cap_ideals:
            return (*out[:4], visited), limit
        limit = min(4 * limit, cap_ideals)  # out of table: again with a larger one


def solve_ideal_dp(
    prob: Problem,
    model: MaxLoadModel,
    *,
    time_limit: float = 60.0,
    max_ideals: int | None = None,
    pin_isolated_above: int | None = 8,
    isolated: str = "drop",
    transfer_cut: bool = True,
    act_frac: np.ndarray | None = None,
    reverse: bool = False,
    random_orders: int = 0,
    seed: int = 0,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Run the chain DP then the DP over ideals; ``(device of each unit, info)`` (see the module docstring).

    ``random_orders``: when the full DP stops at a limit, up to this many chain DPs over
    random depth-first orders (:func:`random_linear_extension`, generator seeded by
    ``seed``) run in the time left before ``time_limit``; the best split of all is kept.

    ``act_frac``: position-dependent stage memory (:func:`stage_kernel`), for
    `ideal_dp_makespan` under 1F1B; ``prob.mem`` per unit when None. ``reverse``: the DPs
    build the splits from the last stage backwards (:func:`reversed_order`), so that a
    stage's position counts the stages after it; the splits and their costs are the same."""
    if isolated not in ("drop", "keep"):
        raise ValueError(f"ideal_dp: isolated must be 'drop' or 'keep', got {isolated!r}")
    check_flag("ideal_dp", "transfer_cut", transfer_cut)
    t0 = time.perf_counter()
    deadline = t0 + check_seconds("ideal_dp", "time_limit", time_limit)
    graph = prob.graph
    unit_of = prob.unit_of
    items, drop = dp_items(graph, unit_of, isolated, pin_isolated_above)
    B = len(items.succ)
    keepu = np.flatnonzero(~drop)
    kern = stage_kernel(prob, model, items, keepu, act_frac=act_frac)
    classes = kern.classes
    # ``max_ideals=None``: as many as fit in TABLE_BYTES, an explicit value is honoured
    # whatever it takes. The tables start at 200,000 ideals and grow fourfold while the DP
    # runs out of them.
    per_ideal = kern.per_ideal
    cap_ideals = ideal_capacity(max_ideals, per_ideal)

    def run(
        perm: np.ndarray, succ: list[list[int]], ub: float, limit: int
    ) -> tuple[int, np.ndarray | None, float, int, int]:
        return kern.run(perm, succ, ub, limit, deadline, transfer_cut)

    # ---- chain DPs over a few topological orders: the upper bound (and the fallback plan)
    place_lin, val_lin, vis_lin = None, np.inf, 0
    chain = [[i + 1] if i + 1 < B else [] for i in range(B)]

    def run_chain(perm: np.ndarray, ub: float) -> tuple[int, np.ndarray | None, float, int, int]:
        return run(perm[::-1].copy() if reverse else perm, chain, ub, B + 2)

    for perm in linear_extensions(items.succ):
        st, pl, v, _, vis = run_chain(perm, val_lin)
        vis_lin += vis
        if st == STATUS_TIME:
            raise InfeasiblePlanError(
                f"ideal_dp: the chain DP over {B} items of {graph.meta.get('name', '?')!r} did not "
                f"finish within time_limit={time_limit} s; raise the limit"
            )
        if pl is not None and v < val_lin:
            place_lin, val_lin = pl, v
    t_lin = time.perf_counter() - t0
    info: dict[str, Any] = {
        "items": B,
        "units": int(prob.num_units),
        "fused_units": items.fused_units,
        "pinned_items": items.pinned,
        "device_classes": [list(c) for c in classes],
        "chain_objective": val_lin * 1e-6,
        "chain_seconds": t_lin,
        "cost_model_exact": bool(model.exact and model.uniform),
    }
    # how many ideals the full DP could have to visit (None: not counted within the budget)
    t_count = time.perf_counter()
    total = count_ideals(items.succ, time_limit=min(COUNT_SECONDS, 0.05 * time_limit))
    # a float (JSON has no big integers); inf past the float range (e.g. 3 ** 1000)
    info["ideals_total"] = None if total is None else _as_float(total)
    info["ideals_total_seconds"] = time.perf_counter() - t_count
    # ---- the DP over ideals, bounded by the chains' best
    full_perm, full_succ = reversed_order(items.succ) if reverse else (np.arange(B), items.succ)
    # tables for every ideal when they fit (one run), else grown from 200,000 as needed
    start = int(total) if total is not None and total <= cap_ideals else None
    (status, place, val, nI, visited), limit = run_growing(
        lambda lim: run(full_perm, full_succ, val_lin, lim), cap_ideals, start
    )
    visited_all = vis_lin + visited
    info.update(
        status=_STATUS[status], ideals=int(nI), stages_scored=int(visited_all),
        ideal_limit=limit, ideal_table_bytes=int(limit * per_ideal), transfer_cut=bool(transfer_cut),
    )  # fmt: skip
    if place is None or not (val < val_lin):
        place, val = place_lin, val_lin
    if status != STATUS_DONE and random_orders > 0:
        place, val = _more_linearizations(
            items.succ, run_chain, place, val, random_orders, seed, deadline, info
        )
    if place is None:
        raise InfeasiblePlanError(
            f"ideal_dp: no contiguous split of {graph.meta.get('name', '?')!r} onto "
            f"{prob.num_devices} devices fits in memory (or every split puts a node where it cannot run)"
        )
    info["dp_objective"] = val * 1e-6
    up = np.full(prob.num_units, -1, dtype=np.int64)
    up[keepu] = place[items.item_of_unit[keepu]]
    dp_done = bool(status == STATUS_DONE and items.pinned == 0)
    info["isolated"] = isolated
    info["dropped_units"] = int(drop.sum())
    if drop.any():
        up = reinsert_isolated(prob, model, up, np.flatnonzero(drop))
        # bounds on the contiguous optimum of the whole problem: the reduced DP's optimum
        # (removing edge-free units from a split lowers no load and frees memory) and the
        # least total compute spread over every device
        obj = model.max_load(up[unit_of])
        work = np.where(np.isfinite(model.comp), model.comp, np.inf).min(axis=1)
        lb = float(np.where(np.isfinite(work), work, 0.0).sum()) / model.num_devices
        if dp_done and info["cost_model_exact"]:
            lb = max(lb, val)
        info["dp_lower_bound"] = lb * 1e-6
        info["dp_gap"] = (
            max(float(obj / lb - 1.0), 0.0) if lb > 0 else (0.0 if obj == 0 else float("inf"))
        )
        info["dp_objective"] = obj * 1e-6
        proven = dp_done and info["cost_model_exact"] and obj <= lb * (1 + 1e-9)
    else:
        proven = dp_done and info["cost_model_exact"]
        info["dp_lower_bound"] = val * 1e-6 if proven else 0.0
        info["dp_gap"] = 0.0 if proven else float("nan")
    info["exact"] = bool(proven)
    info["optimal_among"] = (
        "contiguous splits"
        if proven or (dp_done and not drop.any())
        else "none proven: edge-free units re-inserted greedily; the gap is to a lower bound"
        if dp_done
        else "contiguous splits with isolated items pinned"
        if status == STATUS_DONE
        else "none proven: the full DP stopped; best of the chain DPs and the full DP's incumbent"
    )
    now = time.perf_counter()
    left = min(deadline - now, max(1.0, 2.0 * (now - t0)))
    if drop.any() and dp_done and not proven and left > 0:
        # the greedy re-insertion can put an edge-free unit on a full device: the DP with
        # those units kept (in at most twice the time spent, or 1 s), and the better plan
        # (a 4-unit graph: 4.1 re-inserted against 3.0, the contiguous optimum; fuzzing)
        try:
            up_k, info_k = solve_ideal_dp(
                prob, model, time_limit=left, max_ideals=max_ideals,
                pin_isolated_above=pin_isolated_above, isolated="keep",
                transfer_cut=transfer_cut, act_frac=act_frac, reverse=reverse,
                random_orders=random_orders, seed=seed,
            )  # fmt: skip
        except InfeasiblePlanError:
            up_k = None
        info["dropped_units_plan_objective"] = info["dp_objective"]
        if up_k is not None:
            obj_k = model.max_load(up_k[unit_of])
            if obj_k < model.max_load(up[unit_of]) or info_k["exact"]:
                info_k["dropped_units"] = int(drop.sum())
                info_k["dropped_units_plan_objective"] = info["dp_objective"]
                info_k["isolated"] = "keep (after drop: the DP with the edge-free units did better)"
                return up_k, info_k
    return up, info


def reinsert_isolated(
    prob: Problem, model: MaxLoadModel, up: np.ndarray, units: np.ndarray
) -> np.ndarray:
    """Put each edge-free unit of ``units`` (largest compute first) on the device where it
    fits in memory and raises the largest load least (ties: the least loaded after it).

    ``up``: device per unit, -1 for ``units``. The result is still a contiguous split: an
    edge-free unit adds no edge between devices.
    """
    up = up.copy()
    U, D = prob.num_units, model.num_devices
    T = np.zeros((U, D))
    np.add.at(T, prob.unit_of, model.comp)
    kept = up >= 0
    node_dev = np.where(kept[prob.unit_of], up[prob.unit_of], 0)
    loads = model.loads(node_dev, skip=~kept[prob.unit_of])  # without the units to insert
    use = np.bincount(up[kept], weights=prob.mem[kept], minlength=D).astype(float)
    work = np.where(np.isfinite(T), T, np.inf).min(axis=1)
    for u in units[np.argsort(-work[units], kind="stable")]:
        ok = np.isfinite(T[u]) & (use + prob.mem[u] <= prob.capacity)
        if not ok.any():
            raise InfeasiblePlanError(
                f"ideal_dp: no device has room for the edge-free unit {int(u)} of "
                f"{prob.graph.meta.get('name', '?')!r} after the DP's split; try isolated='keep'"
            )
        after = np.where(ok, loads + np.where(ok, T[u], 0.0), np.inf)
        peak = np.maximum(after, loads.max())
        d = int(np.lexsort((after, peak))[0])
        up[u] = d
        loads[d] += T[u, d]
        use[d] += prob.mem[u]
    return up


def check_orders(who: str, random_orders: Any, seed: Any) -> None:
    """``random_orders`` an integer >= 0 and ``seed`` an integer >= 0, else ``ValueError``
    naming ``who`` and the option."""
    if not is_whole(random_orders, 0):
        raise ValueError(f"{who}: random_orders must be an integer >= 0, got {random_orders!r}")
    check_seed(who, seed)


def _in_degrees(succ: list[list[int]]) -> np.ndarray:
    """Predecessors of each item (int64)."""
    deg = np.zeros(len(succ), dtype=np.int64)
    for s in succ:
        for j in s:
            deg[j] += 1
    return deg


def random_linear_extension(succ: list[list[int]], rng: np.random.Generator) -> np.ndarray:
    """A random depth-first topological order of the items (``succ`` points to larger
    labels): the item placed next is the one released last, and the items that one
    placement releases are pushed in a random order. On branchy graphs these orders put
    whole branches together in ever different arrangements, which the three fixed orders
    of :func:`linear_extensions` cannot."""
    deg = _in_degrees(succ)
    stack = [int(i) for i in rng.permutation(np.flatnonzero(deg == 0))]
    order: list[int] = []
    while stack:
        v = stack.pop()
        order.append(v)
        new = []
        for j in succ[v]:
            deg[j] -= 1
            if deg[j] == 0:
                new.append(j)
        if len(new) > 1:
            new = [new[k] for k in rng.permutation(len(new))]
        stack.extend(new)
    return np.asarray(order, dtype=np.int64)


def _more_linearizations(
    succ: list[list[int]],
    run_chain: Callable[[np.ndarray, float], tuple[int, np.ndarray | None, float, int, int]],
    place: np.ndarray | None,
    val: float,
    orders: int,
    seed: int,
    deadline: float,
    info: dict[str, Any],
) -> tuple[np.ndarray | None, float]:
    """Chain DPs over up to ``orders`` random depth-first orders, each bounded by the best
    split so far, until ``deadline``; the best split and its objective (``info`` records
    how many ran, the objective before them and whether they beat it)."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    ran, start_val = 0, val
    while ran < orders and time.perf_counter() < deadline:
        st, pl, v, _, _ = run_chain(random_linear_extension(succ, rng), val)
        if st == STATUS_TIME:
            break
        ran += 1
        if pl is not None and v < val:
            place, val = pl, v
    info.update(
        random_orders=ran,
        objective_before_random_orders=float(start_val * 1e-6),
        random_orders_improved=bool(val < start_val),
        random_orders_seconds=time.perf_counter() - t0,
    )
    return place, val


def reversed_order(succ: list[list[int]]) -> tuple[np.ndarray, list[list[int]]]:
    """``(perm, succ')`` for :meth:`StageKernel.run` on the reversed precedence: new label
    ``i`` is item ``B - 1 - i`` and ``succ'`` its predecessors, relabelled (larger labels).
    A stage's cost depends only on its item set, so the DP finds the same splits, built
    from the last stage backwards."""
    B = len(succ)
    pred: list[list[int]] = [[] for _ in range(B)]
    for a, sa in enumerate(succ):
        for b in sa:
            pred[B - 1 - b].append(B - 1 - a)
    return np.arange(B)[::-1].copy(), [sorted(p) for p in pred]


def linear_extensions(succ: list[list[int]]) -> list[np.ndarray]:
    """Three topological orders of the items (``succ`` points to larger labels): the labels
    themselves, a depth-first order (a branch is finished before the next starts) and a
    level order (by longest path from a source: branches advance together)."""
    B = len(succ)
    orders = [np.arange(B)]
    indeg = _in_degrees(succ)
    deg, stack, dfs = indeg.copy(), [i for i in range(B - 1, -1, -1) if indeg[i] == 0], []
    while stack:
        v = stack.pop()
        dfs.append(v)
        for j in sorted(succ[v], reverse=True):
            deg[j] -= 1
            if deg[j] == 0:
                stack.append(j)
    orders.append(np.asarray(dfs, dtype=np.int64))
    level = np.zeros(B, dtype=np.int64)
    for v in range(B):  # labels are topological
        for j in succ[v]:
            level[j] = max(level[j], level[v] + 1)
    orders.append(np.lexsort((np.arange(B), level)).astype(np.int64))
    uniq: list[np.ndarray] = []
    for o in orders:
        if not any(np.array_equal(o, u) for u in uniq):
            uniq.append(o)
    return uniq


def _backtrack(
    dp: np.ndarray,
    bJ: np.ndarray,
    bC: np.ndarray,
    bits: np.ndarray,
    full: int,
    counts: np.ndarray,
    classes: list[list[int]],
    B: int,
) -> np.ndarray:
    """Per-item device of the best split ending at ideal ``full``."""
    stride = np.cumprod(np.concatenate([[1], counts[:-1] + 1])).astype(np.int64)
    k = int(np.argmin(dp[full]))
    cur = full
    item_dev = np.full(B, -1, dtype=np.int64)
    used = [0] * len(classes)
    shifts = np.arange(64, dtype=np.uint64)
    while cur != 0:
        prev, c = int(bJ[cur, k]), int(bC[cur, k])
        diff = bits[cur] & ~bits[prev]
        members = np.flatnonzero(((diff[:, None] >> shifts[None, :]) & np.uint64(1)).ravel())
        members = members[members < B]
        item_dev[members] = classes[c][used[c]]
        used[c] += 1
        k -= int(stride[c])
        cur = prev
    assert (item_dev >= 0).all()
    return item_dev


def ideal_dp(
    graph: CompGraph,
    cluster: Cluster,
    oracle: Oracle,
    budget: int | None = None,
    *,
    time_limit: float = 60.0,
    max_ideals: int | None = None,
    pin_isolated_above: int | None = 8,
    isolated: str = "drop",
    transfer_cut: bool = True,
    random_orders: int = 2000,
    seed: int = 0,
) -> Plan:
    """Max-load-optimal contiguous split by the DP over ideals (one oracle evaluation).

    ``isolated``: ``"drop"`` (default) solves without edge-free units and re-inserts
    them, ``"keep"`` keeps them in the DP (see the module docstring). ``transfer_cut``
    (default on): cut enumeration branches by the transfers they cannot avoid; off
    only to measure it (the optimum is the same). ``random_orders`` (default 2000; 0 turns
    it off) and ``seed``: when the full DP stops at a limit, chain DPs over that many
    random depth-first orders in the time left (a heuristic for the plan, not a proof).

    ``meta``: ``dp_objective`` (seconds; equals the max-load step time when
    ``exact``), ``exact``, ``dp_lower_bound``, ``dp_gap``, ``dropped_units``, ``optimal_among``, ``status`` (``done`` or the limit
    that stopped the full DP), ``ideals``, ``items``, ``pinned_items``,
    ``chain_objective``, ``device_classes``; after a stopped DP ``random_orders``,
    ``objective_before_random_orders``, ``random_orders_improved``.
    """
    check_orders("ideal_dp", random_orders, seed)
    start = oracle_calls_start(oracle)
    prob = exact_problem(graph, cluster, oracle)
    model = exact_model(graph, cluster, prob)
    up, info = solve_ideal_dp(
        prob, model, time_limit=time_limit, max_ideals=max_ideals,
        pin_isolated_above=pin_isolated_above, isolated=isolated, transfer_cut=transfer_cut,
        random_orders=random_orders, seed=seed,
    )  # fmt: skip
    return finish(prob, up, "ideal_dp", start, objective="max_load", **info)


def exact_model(graph: CompGraph, cluster: Cluster, prob: Problem) -> MaxLoadModel:
    """:func:`build_model` with the nodes of every unit that ``prob`` bars from a device
    (``prob.time`` inf: it cannot run there, or, under a makespan oracle, its own state and
    largest transient exceed the device's memory) made unable to run there. Without it the
    exact planners put stateless units on an accelerator smaller than their outputs, which
    their memory rule let through and the oracle then refused, and reported no plan where a
    host CPU could take everything (fuzzing, 30 Nov 2026)."""
    model = build_model(graph, cluster)
    if not graph.num_nodes:
        return model
    barred = ~np.isfinite(prob.time)[prob.unit_of]
    if not barred.any():
        return model
    return replace(model, comp=np.where(barred, np.inf, model.comp))


def exact_problem(graph: CompGraph, cluster: Cluster, oracle: Oracle) -> Problem:
    """The unit view with the oracle's memory rule: exact for max-load (parameter bytes
    against device memory); for makespan oracles every microbatch's activations are
    charged (an upper bound on any schedule), as for the ILP."""
    if getattr(oracle, "objective", "makespan") == "max_load":
        return make_problem(graph, cluster, oracle)
    return make_problem(graph, cluster, oracle, act_fraction=1.0)
