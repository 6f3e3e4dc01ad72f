"""Coarsen a training graph into at most K colocation groups of contiguous forward intervals."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from graphs.compgraph import FWD, KIND_NAMES, CompGraph
from graphs.schema import is_whole

#: Merging two segments across a layer boundary costs this many times more.
LAYER_PENALTY = 4.0


def _unit_order(graph: CompGraph, unit: np.ndarray, n_units: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge colocation units on forward cycles (SCCs) and order them topologically.

    Returns ``(super_of_unit, order)``: the super-unit of each unit and the
    super-units in a topological order of the forward edges (ties broken by
    the lowest node index of a member, i.e. the graph's own order).
    """
    fwd_edge = (graph.kind[graph.src] == FWD) & (graph.kind[graph.dst] == FWD)
    us, ud = unit[graph.src[fwd_edge]], unit[graph.dst[fwd_edge]]
    cross = us != ud
    us, ud = us[cross], ud[cross]
    adj = coo_matrix((np.ones(len(us)), (us, ud)), shape=(n_units, n_units)).tocsr()
    n_super, sup = connected_components(adj, directed=True, connection="strong")
    sup = sup.astype(np.int64)
    first = np.full(n_super, np.iinfo(np.int64).max)
    np.minimum.at(first, sup[unit], np.arange(graph.num_nodes))
    ss, sd = sup[us], sup[ud]
    keep = ss != sd
    pairs = (
        np.unique(np.stack([ss[keep], sd[keep]], 1), axis=0)
        if keep.any()
        else np.zeros((0, 2), int)
    )
    indeg = np.bincount(pairs[:, 1], minlength=n_super)
    succ: list[list[int]] = [[] for _ in range(n_super)]
    for a, b in pairs.tolist():
        succ[a].append(b)
    heap = [(int(first[s]), s) for s in range(n_super) if indeg[s] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        _, s = heapq.heappop(heap)
        order.append(s)
        for t in succ[s]:
            indeg[t] -= 1
            if indeg[t] == 0:
                heapq.heappush(heap, (int(first[t]), t))
    return sup, np.array(order, dtype=np.int64)


def _segments(weight: np.ndarray, layer: np.ndarray, cut_bytes: np.ndarray, k: int) -> np.ndarray:
    """Segment id per position of a sequence, merging neighbours until at most ``k`` remain.

    Repeatedly merges the adjacent pair with the smallest merged weight
    (times ``LAYER_PENALTY`` across a change of layer), ties broken by the
    bytes crossing the boundary: cheap chains fuse first, layers stay whole.
    """
    m = len(weight)
    if m <= k:
        return np.arange(m, dtype=np.int64)
    w = weight.astype(np.float64).copy()
    first_layer, last_layer = layer.copy(), layer.copy()
    nxt = list(range(1, m)) + [-1]
    prv = [-1] + list(range(m - 1))
    alive = np.ones(m, dtype=bool)
    version = np.zeros(m, dtype=np.int64)

    def key(a: int) -> tuple[float, float, int, int, int]:
        b = nxt[a]
        pen = LAYER_PENALTY if last_layer[a] != first_layer[b] else 1.0
        return ((w[a] + w[b]) * pen, float(cut_bytes[b - 1]), a, int(version[a]), int(version[b]))

    # cut_bytes[j] is the boundary between positions j and j+1; a segment starting at b has its
    # left boundary at b-1, which stays valid because segments keep their first position.
    heap = [key(a) for a in range(m - 1)]
    heapq.heapify(heap)
    count = m
    while count > k and heap:
        _, _, a, va, vb = heapq.heappop(heap)
        b = nxt[a] if alive[a] else -1
        if b < 0 or va != version[a] or vb != version[b]:
            continue
        w[a] += w[b]
        last_layer[a] = last_layer[b]
        alive[b] = False
        nxt[a] = nxt[b]
        if nxt[b] >= 0:
            prv[nxt[b]] = a
        version[a] += 1
        count -= 1
        if nxt[a] >= 0:
            heapq.heappush(heap, key(a))
        if prv[a] >= 0:
            heapq.heappush(heap, key(prv[a]))
    seg = np.cumsum(alive) - 1
    return seg.astype(np.int64)


def _sum_measured(
    values: np.ndarray, into: np.ndarray, n_out: int, refuse: Callable[[int, int, int, int], str]
) -> np.ndarray:
    """Per output ``o``: the sum of ``values`` (NaN = unmeasured) mapped to ``o`` by ``into``;
    NaN where none is measured. An output mixing measured and unmeasured values raises
    ``ValueError(refuse(o, measured, size, how many such outputs))``: the sum would drop them."""
    has = ~np.isnan(values)
    measured = np.bincount(into, weights=has.astype(float), minlength=n_out)
    size = np.bincount(into, minlength=n_out)
    mixed = np.flatnonzero((measured > 0) & (measured < size))
    if len(mixed):
        c = int(mixed[0])
        raise ValueError(refuse(c, int(measured[c]), int(size[c]), len(mixed)))
    total = np.bincount(into, weights=np.where(has, values, 0.0), minlength=n_out)
    return total + np.where(measured > 0, 0.0, np.nan)


def _total_times(
    graph: CompGraph, kind: str, cidx: np.ndarray, nc: int, names: Sequence[str]
) -> np.ndarray:
    """Summed measured ``times[kind]`` per coarse node; NaN where no member is measured. A
    coarse node with measured and unmeasured members is refused: the sum was NaN, so the
    simulator used the roofline for the whole node and the measurements were lost without
    a word (found by fuzzing: a 50 ms measured op became 0.011 ms)."""
    return _sum_measured(
        np.asarray(graph.times[kind], dtype=float),
        cidx,
        nc,
        lambda c, k, size, many: (
            f"coarsen: times[{kind!r}] measures {k} of the {size} nodes of coarse node "
            f"{names[c]!r} ({many} such node(s)); a sum would drop the measurements. Fill the "
            "others first (graphs.coarsening.fill_times(graph, cluster): the simulator's "
            f"roofline on a {kind!r} device) or drop times[{kind!r}]"
        ),
    )


def _edge_times(
    graph: CompGraph,
    ext: np.ndarray,
    inv: np.ndarray,
    n_tensor: int,
    cinv: np.ndarray,
    n_coarse: int,
    names: Sequence[str],
    src: np.ndarray,
    dst: np.ndarray,
) -> np.ndarray | None:
    """Measured transfer times (``edge_time``) of the coarse edges, as their bytes: the
    largest time of each distinct (source tensor, destination coarse node), summed per
    coarse edge; NaN where none is measured. A coarse edge that would sum measured and
    unmeasured transfers is refused (the simulator reads a set ``edge_time`` instead of
    the bytes, so the unmeasured ones would be dropped). Until 29 Nov 2026 ``edge_time``
    was dropped, so a Fiddle graph (every cost in ``edge_time``, no bytes) lost all its
    transfer costs when coarsened (found by fuzzing)."""
    if graph.edge_time is None:
        return None
    et = np.asarray(graph.edge_time, dtype=float)[ext]
    has = ~np.isnan(et)
    per = np.full(n_tensor, -np.inf)
    np.maximum.at(per, inv[has], et[has])
    per[np.isneginf(per)] = np.nan
    return _sum_measured(
        per,
        cinv,
        n_coarse,
        lambda c, k, size, many: (
            f"coarsen: edge_time measures {k} of the {size} transfers merged into the edge "
            f"{names[int(src[c])]!r} -> {names[int(dst[c])]!r} ({many} such edge(s)); a sum "
            "would drop the unmeasured ones. Give every edge an edge_time, or none"
        ),
    )


def node_seconds(
    graph: CompGraph, peak_flops: float, mem_bw: float, efficiency: float, launch: float = 0.0
) -> np.ndarray:
    """Roofline time per node: ``max(flops / (peak * eff), bytes / mem_bw) + launch``."""
    return (
        np.maximum(graph.flops / (peak_flops * efficiency), graph.bytes_accessed / mem_bw) + launch
    )


def fill_times(graph: CompGraph, cluster: Any) -> CompGraph:
    """``graph`` with the unmeasured (NaN) entries of ``times[k]`` replaced, for every device
    kind ``k`` of ``cluster``, by what the simulator uses for an unmeasured node on that kind:
    the whole-batch roofline ``max(flops / (peak * efficiency), bytes / mem_bw) + launch`` of
    the first device of that kind, in microseconds. Coarsening such a graph then conserves
    the measured times (``coarsen`` refuses nodes that mix measured and unmeasured times)."""
    times = dict(graph.times)
    changed = False
    for k, t in graph.times.items():
        dev = next((d for d in cluster.devices if d.kind == k), None)
        t = np.asarray(t, dtype=float)
        if dev is None or not np.isnan(t).any():
            continue
        roof = node_seconds(graph, dev.peak_flops, dev.mem_bw, dev.efficiency, dev.launch_overhead)
        times[k] = np.where(np.isnan(t), roof * 1e6, t)
        changed = True
    return graph.replace(times=times) if changed else graph


def _common_prefix(mods: list[str]) -> str:
    parts = [m.split(".") for m in mods if m]
    if not parts:
        return ""
    out = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        out.append(level[0])
    return ".".join(out)


def coarsen(graph: CompGraph, max_groups: int) -> CompGraph:
    """Merge ``graph`` into at most ``max_groups`` colocation groups.

    Forward colocation groups (never split; groups whose forward ops form a
    cycle with other groups are merged) are laid out in a topological order of
    the forward edges and cut into at most ``max_groups`` contiguous intervals
    (see :func:`_segments`: cheap chains fuse first, merges across layer
    boundaries are penalised). Every interval becomes one group with one
    forward node, one backward node and at most one optimizer node, holding
    the original nodes of that kind in the interval's groups, so the result is
    acyclic for graphs made by :func:`graphs.training.with_backward` (forward
    edges go forward in the order, gradient edges backward).

    Node costs ``flops``, ``bytes_accessed``, ``param_bytes``, ``act_bytes``
    and measured ``times`` are summed (totals conserved); ``out_bytes`` sums
    the members whose output leaves the coarse node. A cross-group edge
    carries the bytes of each distinct source tensor it moves to the
    destination (one transfer per tensor and destination), summed; edges
    inside a coarse node vanish; measured ``edge_time`` is merged as the bytes are. A coarse node is
    named after its first member (``"name+N"`` when it has ``N`` more), with
    ``"bwd:"`` / ``"opt:"`` prefixes, and ``meta["members"]`` lists the
    original names per coarse node.

    Raises ``ValueError`` if ``max_groups < 1`` or a colocation group has no
    forward node.
    """
    if not is_whole(max_groups, 1):  # None, NaN, inf were int() errors, True 1 (2 Dec 2026)
        raise ValueError(f"coarsen: max_groups must be an integer >= 1, got {max_groups!r}")
    max_groups = int(max_groups)
    n = graph.num_nodes
    ids, unit = graph.group_index()
    n_units = len(ids)
    is_fwd = graph.kind == FWD
    has_fwd = np.zeros(n_units, dtype=bool)
    has_fwd[unit[is_fwd]] = True
    if not has_fwd.all():
        u = int(np.flatnonzero(~has_fwd)[0])
        raise ValueError(
            f"coarsen: colocation group {int(ids[u])} (node "
            f"{graph.name[int(np.flatnonzero(unit == u)[0])]!r}) has no forward node; "
            "every group must contain a forward op"
        )
    sup, order = _unit_order(graph, unit, n_units)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    pos_of_node = rank[sup[unit]]  # position in the super-unit sequence
    m = len(order)

    # ---- per-position weight, layer and crossing bytes
    tf, tp = graph.flops.sum(), graph.param_bytes.sum()
    w = np.bincount(pos_of_node, weights=graph.flops / tf if tf > 0 else None, minlength=m)
    if tf <= 0:
        w = np.zeros(m)
    if tp > 0:
        w = w + 0.5 * np.bincount(pos_of_node, weights=graph.param_bytes / tp, minlength=m)
    layer = np.full(m, -1, dtype=np.int64)
    fwd_nodes = np.flatnonzero(is_fwd)
    heavy = fwd_nodes[np.lexsort((-graph.flops[fwd_nodes], pos_of_node[fwd_nodes]))]
    _, first_idx = np.unique(pos_of_node[heavy], return_index=True)
    layer[pos_of_node[heavy[first_idx]]] = graph.layer[heavy[first_idx]]
    fe = is_fwd[graph.src] & is_fwd[graph.dst]
    a, b = pos_of_node[graph.src[fe]], pos_of_node[graph.dst[fe]]
    diff = np.zeros(m + 1)
    np.add.at(diff, a, graph.edge_bytes[fe])
    np.add.at(diff, b, -graph.edge_bytes[fe])
    cut = np.cumsum(diff)[: max(m - 1, 0)]
    seg_of_pos = _segments(w, layer, cut, int(max_groups))
    seg = seg_of_pos[pos_of_node]  # coarse group of every node
    n_seg = int(seg_of_pos.max()) + 1 if m else 0

    # ---- coarse nodes: (segment, kind), forward first, then backward, then optimizer
    key = graph.kind.astype(np.int64) * n_seg + seg
    present, cidx = np.unique(key, return_inverse=True)
    cidx = cidx.astype(np.int64)
    nc = len(present)
    ckind, cseg = (present // n_seg).astype(np.int8), present % n_seg
    members: list[list[str]] = [[] for _ in range(nc)]
    # a graph coarsened before lists its own members: keep the original names, which the
    # runtime and the profiler look up (found by fuzzing: a re-coarsened graph listed
    # intermediate coarse names such as 'add+10', which the runtime placed by its fallback)
    inner = graph.meta.get("members")
    if not (isinstance(inner, list) and len(inner) == n):
        inner = None
    for i in np.lexsort((np.arange(n), pos_of_node)).tolist():
        if inner is None:
            members[cidx[i]].append(graph.name[i])
        else:
            members[cidx[i]].extend(inner[i])
    fwd_name: dict[int, str] = {}
    for c in range(nc):
        if ckind[c] == FWD:
            ms = members[c]
            fwd_name[int(cseg[c])] = ms[0] if len(ms) == 1 else f"{ms[0]}+{len(ms) - 1}"
    names = [
        fwd_name[int(cseg[c])]
        if ckind[c] == FWD
        else f"{KIND_NAMES[ckind[c]]}:{fwd_name[int(cseg[c])]}"
        for c in range(nc)
    ]
    # "x+1" (x and one more) may already be a member's own name: number the later ones
    seen: dict[str, int] = {}
    for c, nm in enumerate(names):
        if nm in seen:
            k = 2
            while f"{nm}#{k}" in seen:
                k += 1
            names[c] = f"{nm}#{k}"
        seen[names[c]] = c

    def total(arr: np.ndarray) -> np.ndarray:
        return np.bincount(cidx, weights=arr, minlength=nc)

    cs, cd = cidx[graph.src], cidx[graph.dst]
    ext = cs != cd
    leaves = np.zeros(n, dtype=bool)
    leaves[graph.src[ext]] = True
    sinks = np.bincount(graph.src, minlength=n) == 0
    out_bytes = total(np.where(leaves | sinks, graph.out_bytes, 0.0))
    # one transfer per (source tensor, destination coarse node)
    es, ed, eb = graph.src[ext], cd[ext], graph.edge_bytes[ext]
    if len(es):
        pair = es * nc + ed
        uniq, inv = np.unique(pair, return_inverse=True)
        per = np.zeros(len(uniq))
        np.maximum.at(per, inv, eb)
        csrc, cdst = cidx[uniq // nc], uniq % nc
        cpair = csrc * nc + cdst
        cu, cinv = np.unique(cpair, return_inverse=True)
        ebytes = np.bincount(cinv, weights=per, minlength=len(cu))
        src, dst = cu // nc, cu % nc
        etime = _edge_times(graph, ext, inv, len(uniq), cinv, len(cu), names, src, dst)
    else:
        src = dst = np.zeros(0, dtype=np.int64)
        ebytes = np.zeros(0)
        etime = None if graph.edge_time is None else np.zeros(0)
    layers = np.full(nc, -1, dtype=np.int64)
    mods: list[list[str]] = [[] for _ in range(nc)]
    for i in range(n):
        mods[cidx[i]].append(graph.module[i])
    heavy_all = np.lexsort((-graph.flops, cidx))
    _, fi = np.unique(cidx[heavy_all], return_index=True)
    layers[cidx[heavy_all[fi]]] = graph.layer[heavy_all[fi]]
    meta = dict(graph.meta)
    meta["members"] = members
    meta["coarsened_from"] = {
        "nodes": n,
        "hash": graph.content_hash(),
        "max_groups": int(max_groups),
    }
    try:
        return CompGraph(
            flops=total(graph.flops),
            bytes_accessed=total(graph.bytes_accessed),
            out_bytes=out_bytes,
            param_bytes=total(graph.param_bytes),
            act_bytes=total(graph.act_bytes),
            kind=ckind,
            group=cseg.astype(np.int64),
            layer=layers,
            name=tuple(names),
            module=tuple(_common_prefix(ms) for ms in mods),
            src=src.astype(np.int64),
            dst=dst.astype(np.int64),
            edge_bytes=ebytes,
            times={k: _total_times(graph, k, cidx, nc, names) for k in graph.times},
            edge_time=etime,
            meta=meta,
        )
    except ValueError as exc:
        if "cycle" not in str(exc):
            raise
        raise ValueError(
            f"coarsen: merging {graph.meta.get('name', 'graph')!r} into {n_seg} groups by kind "
            f"creates a cycle ({exc}); coarsen expects forward edges between forward nodes and "
            "gradient edges that reverse them, as made by graphs.training.with_backward"
        ) from exc


__all__ = ["LAYER_PENALTY", "coarsen"]
