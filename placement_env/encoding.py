"""Observation encoding: unit graphs, the padded observation space and fast per-step encoding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from placement_env.types import (
    DEVICE_FEATURES,
    EDGE_FEATURES,
    GLOBAL_FEATURES,
    LINK_FEATURES,
    NODE_FEATURES,
    Bounds,
    EpisodeState,
    Instance,
    Observation,
    UnitGraph,
)

F_NODE, F_EDGE, F_DEV, F_LINK, F_GLOBAL = (
    len(NODE_FEATURES),
    len(EDGE_FEATURES),
    len(DEVICE_FEATURES),
    len(LINK_FEATURES),
    len(GLOBAL_FEATURES),
)
_LOG_RANGE = 1e4  # *_log features span four decades below the maximum
_N = {name: i for i, name in enumerate(NODE_FEATURES)}
_E = {name: i for i, name in enumerate(EDGE_FEATURES)}
_D = {name: i for i, name in enumerate(DEVICE_FEATURES)}
_G = {name: i for i, name in enumerate(GLOBAL_FEATURES)}


# --------------------------------------------------------------------------- unit graph
def unit_graph(graph: CompGraph) -> UnitGraph:
    """Quotient ``graph`` by colocation group; units numbered in topological order.

    A unit's rank is the first topological position of any of its nodes. Unit
    edges join distinct units that exchange tensors, one per ordered pair, with
    the bytes of all graph edges between them summed.
    """
    n = graph.num_nodes
    ids, inv = graph.group_index()
    U = len(ids)
    pos = np.empty(n, dtype=np.int64)
    pos[graph.topo_order] = np.arange(n, dtype=np.int64)
    first = np.full(U, n, dtype=np.int64)
    np.minimum.at(first, inv, pos)
    order = np.argsort(first, kind="stable")
    rank = np.empty(U, dtype=np.int64)
    rank[order] = np.arange(U, dtype=np.int64)
    node_unit = rank[inv]

    def per_unit(x: np.ndarray) -> np.ndarray:
        return np.bincount(node_unit, weights=x, minlength=U).astype(np.float64)

    us, ud = node_unit[graph.src], node_unit[graph.dst]
    keep = us != ud
    key = us[keep] * U + ud[keep]
    ukey, kinv = np.unique(key, return_inverse=True)
    eb = np.bincount(kinv.reshape(-1), weights=graph.edge_bytes[keep], minlength=len(ukey))
    return UnitGraph(
        num_units=U,
        node_unit=node_unit,
        group_id=ids[order],
        size=np.bincount(node_unit, minlength=U).astype(np.float64),
        flops=per_unit(graph.flops),
        bytes_accessed=per_unit(graph.bytes_accessed),
        param_bytes=per_unit(graph.param_bytes),
        act_bytes=per_unit(graph.act_bytes),
        out_bytes=per_unit(graph.out_bytes),
        src=(ukey // U).astype(np.int64),
        dst=(ukey % U).astype(np.int64),
        edge_bytes=eb.astype(np.float64),
    )


def instance_bounds(graph: CompGraph, cluster: Cluster) -> Bounds:
    """The smallest padding that fits this graph and cluster."""
    ug = unit_graph(graph)
    return Bounds(ug.num_units, max(ug.num_edges, 1), cluster.num_devices)


# --------------------------------------------------------------------------- spaces
def obs_shapes(b: Bounds) -> dict[str, tuple[int, ...]]:
    """Logical shape of each observation key (the spaces hold them flattened, row-major)."""
    return {
        "node_feat": (b.max_nodes, F_NODE),
        "edge_index": (2, b.max_edges),
        "edge_feat": (b.max_edges, F_EDGE),
        "device_feat": (b.max_devices, F_DEV),
        "link_feat": (b.max_devices, b.max_devices, F_LINK),
        "global_feat": (F_GLOBAL,),
        "placement": (b.max_nodes,),
        "current": (1,),
        "node_mask": (b.max_nodes,),
        "edge_mask": (b.max_edges,),
        "device_mask": (b.max_devices,),
    }


def observation_space(b: Bounds) -> spaces.Dict:
    """The ``spaces.Dict`` of 1-D ``Box``es every environment uses (see ``docs/environments.md``)."""
    if min(b) < 1:
        raise ValueError(f"observation bounds must all be >= 1, got {b}")
    shp = obs_shapes(b)

    def box(key: str, low: float, high: float, dtype: Any) -> spaces.Box:
        return spaces.Box(low, high, (int(np.prod(shp[key])),), dtype=dtype)

    return spaces.Dict(
        {
            "node_feat": box("node_feat", 0.0, 1.0, np.float32),
            "edge_index": box("edge_index", 0, b.max_nodes - 1, np.int64),
            "edge_feat": box("edge_feat", 0.0, 1.0, np.float32),
            "device_feat": box("device_feat", 0.0, 1.0, np.float32),
            "link_feat": box("link_feat", 0.0, 1.0, np.float32),
            "global_feat": box("global_feat", 0.0, 1.0, np.float32),
            "placement": box("placement", -1, b.max_devices - 1, np.int64),
            "current": box("current", -1, b.max_nodes - 1, np.int64),
            "node_mask": box("node_mask", 0, 1, np.int8),
            "edge_mask": box("edge_mask", 0, 1, np.int8),
            "device_mask": box("device_mask", 0, 1, np.int8),
        }
    )


def unflatten(obs: dict[str, Any], b: Bounds) -> dict[str, Any]:
    """Reshape flat observation arrays (numpy or torch, optionally batched) to their logical shapes.

    A leading batch dimension is kept: ``node_feat`` of shape ``(B, max_nodes*F)``
    becomes ``(B, max_nodes, F)``.
    """
    out = {}
    for k, shape in obs_shapes(b).items():
        x = obs[k]
        flat = int(np.prod(shape))
        if x.shape[-1] != flat:
            raise ValueError(
                f"observation key {k!r} has last dimension {x.shape[-1]}, expected {flat} for {b}"
            )
        out[k] = x.reshape(*x.shape[:-1], *shape)
    return out


# --------------------------------------------------------------------------- helpers
def _lognorm(x: np.ndarray) -> np.ndarray:
    m = float(x.max()) if x.size else 0.0
    if m <= 0:
        return np.zeros_like(x, dtype=np.float64)
    return np.log1p(_LOG_RANGE * x / m) / np.log1p(_LOG_RANGE)


def _rel(x: np.ndarray) -> np.ndarray:
    m = float(x.max()) if x.size else 0.0
    return x / m if m > 0 else np.zeros_like(x, dtype=np.float64)


def _mid_cumsum(x: np.ndarray) -> np.ndarray:
    """Share of ``x`` before each entry plus half its own (a position in [0, 1] weighted by ``x``)."""
    tot = float(x.sum()) if x.size else 0.0
    if not np.isfinite(tot) or tot <= 0:
        return np.zeros_like(x, dtype=np.float64)
    return ((np.cumsum(x) - 0.5 * x) / tot).clip(0.0, 1.0)


def _finite_pos(x: float, default: float = 1.0) -> float:
    return float(x) if np.isfinite(x) and x > 0 else default


def roofline_times(graph: CompGraph, cluster: Cluster) -> np.ndarray:
    """``(n, D)`` seconds per node for the whole batch: measured ``graph.times`` where given, else roofline.

    Used only when the oracle offers no ``node_times()``. ``inf`` (cannot run) is kept.
    """
    fl = graph.flops[:, None] / cluster.effective_flops[None, :]
    mb = graph.bytes_accessed[:, None] / cluster.mem_bw[None, :]
    over = np.array([d.launch_overhead for d in cluster.devices])[None, :]
    t = np.maximum(fl, mb) + over
    for j, kind in enumerate(cluster.kinds):
        meas = graph.times.get(kind)
        if meas is not None:
            ok = ~np.isnan(meas)
            t[ok, j] = meas[ok] * 1e-6
    return t


# --------------------------------------------------------------------------- encoder
@dataclass(eq=False)
class InstanceEncoding:
    """Everything about one instance the per-step encoder needs, precomputed once.

    Built by :func:`prepare`; :meth:`encode` turns an :class:`EpisodeState` into
    an observation dict in a few vectorised numpy operations.
    """

    instance: Instance
    units: UnitGraph
    bounds: Bounds
    lower_bound: float  # seconds (> 0)
    unit_time: np.ndarray  # (U, D) float64 seconds of each unit on each device (inf = cannot)
    unit_mem: np.ndarray  # (U,) float64 persistent bytes of each unit
    runnable: np.ndarray  # (U, D) bool every node of the unit can run on the device
    capacity: np.ndarray  # (D,) float64 device memory bytes (inf allowed)
    inv_bw: np.ndarray  # (D, D) float64 1 / route bandwidth, 0 on the diagonal
    latency: np.ndarray  # (D, D) float64 route latency seconds
    speed_rel: np.ndarray  # (D,) float64
    node_static: np.ndarray  # (max_nodes, F_NODE) float32 static columns filled
    edge_static: np.ndarray  # (max_edges, F_EDGE) float32 static columns filled
    device_static: np.ndarray  # (max_devices, F_DEV) float32 static columns filled
    link_feat: np.ndarray  # (max_devices * max_devices * F_LINK,) float32
    edge_index: np.ndarray  # (2 * max_edges,) int64
    node_mask: np.ndarray  # (max_nodes,) int8
    edge_mask: np.ndarray  # (max_edges,) int8
    device_mask: np.ndarray  # (max_devices,) int8
    global_static: np.ndarray  # (F_GLOBAL,) float32

    @property
    def num_units(self) -> int:
        return self.units.num_units

    @property
    def num_devices(self) -> int:
        return self.instance.cluster.num_devices

    def device_used(self, placement: np.ndarray) -> np.ndarray:
        """``(D,)`` persistent bytes per device under a unit placement (-1 entries ignored)."""
        placed = placement >= 0
        return np.bincount(
            placement[placed], weights=self.unit_mem[placed], minlength=self.num_devices
        )

    def encode(self, st: EpisodeState, progress: float = 0.0) -> dict[str, np.ndarray]:
        """The observation dict of state ``st`` (fresh arrays on every call)."""
        U, D, ub = self.num_units, self.num_devices, self.units
        b = self.bounds
        pl = st.placement
        placed = pl >= 0
        safe = np.where(placed, pl, 0)
        lb = self.lower_bound

        node = self.node_static.copy()
        if 0 <= st.current < U:
            node[st.current, _N["current"]] = 1.0
        node[:U, _N["visited"]] = st.visited
        node[:U, _N["device_pos"]] = np.where(placed, pl / max(b.max_devices - 1, 1), 0.0)
        prev = np.empty(U, dtype=np.int64)
        prev[0] = -2
        prev[1:] = pl[:-1]
        node[:U, _N["boundary"]] = placed & (pl != prev) & (np.arange(U) > 0)
        node[:U, _N["device_speed"]] = np.where(placed, self.speed_rel[safe], 0.0)

        edge = self.edge_static.copy()
        E = ub.num_edges
        if E:
            ps, pd = pl[ub.src], pl[ub.dst]
            both = (ps >= 0) & (pd >= 0)
            cut = both & (ps != pd)
            s0, d0 = np.where(both, ps, 0), np.where(both, pd, 0)
            comm = np.where(cut, self.latency[s0, d0] + ub.edge_bytes * self.inv_bw[s0, d0], 0.0)
            edge[:E, _E["cut"]] = cut
            edge[:E, _E["comm_lb"]] = np.minimum(comm / lb, 1.0)
            cutb = np.where(cut, ub.edge_bytes, 0.0)
            tot = np.bincount(ub.src, ub.edge_bytes, U) + np.bincount(ub.dst, ub.edge_bytes, U)
            crossing = np.bincount(ub.src, cutb, U) + np.bincount(ub.dst, cutb, U)
            node[:U, _N["cut_frac"]] = np.divide(
                crossing, tot, out=np.zeros(U), where=tot > 0
            ).clip(0.0, 1.0)

        dev = self.device_static.copy()
        used = self.device_used(pl)
        cap = self.capacity
        finite = np.isfinite(cap)
        ratio = np.where(finite, used / np.where(finite, cap, 1.0), 0.0)
        dev[:D, _D["used_frac"]] = np.minimum(ratio, 1.0)
        dev[:D, _D["free_frac"]] = np.where(finite, np.maximum(1.0 - ratio, 0.0), 1.0)
        dev[:D, _D["over"]] = ratio > 1.0
        ut = self.unit_time[np.arange(U), safe]
        ut = np.where(placed & np.isfinite(ut), ut, 0.0)
        load = np.bincount(safe, weights=ut, minlength=D)
        dev[:D, _D["load_lb"]] = np.minimum(load / lb, 1.0)
        dev[:D, _D["units_frac"]] = np.bincount(safe, weights=placed, minlength=D) / U
        if 0 <= st.current < U and placed[st.current]:
            dev[pl[st.current], _D["current_dev"]] = 1.0

        glob = self.global_static.copy()
        glob[_G["progress"]] = min(max(progress, 0.0), 1.0)
        if np.isfinite(st.step_time) and st.step_time > 0:
            glob[_G["efficiency"]] = min(lb / st.step_time, 1.0)
        if np.isfinite(st.best_step_time) and st.best_step_time > 0:
            glob[_G["best_efficiency"]] = min(lb / st.best_step_time, 1.0)
        glob[_G["oom"]] = float(st.oom)

        placement = np.full(b.max_nodes, -1, dtype=np.int64)
        placement[:U] = pl
        return Observation(
            node_feat=node,
            edge_index=self.edge_index.copy(),
            edge_feat=edge,
            device_feat=dev,
            link_feat=self.link_feat.copy(),
            global_feat=glob,
            placement=placement,
            current=np.array([st.current if 0 <= st.current < U else -1], dtype=np.int64),
            node_mask=self.node_mask.copy(),
            edge_mask=self.edge_mask.copy(),
            device_mask=self.device_mask.copy(),
        ).as_dict()


def prepare(
    instance: Instance,
    bounds: Bounds,
    *,
    lower_bound: float,
    node_times: np.ndarray | None = None,
    units: UnitGraph | None = None,
) -> InstanceEncoding:
    """Precompute the static parts of the observation of ``instance``.

    Args:
        instance: the graph and cluster.
        bounds: padding sizes; the instance must fit (``ValueError`` otherwise).
        lower_bound: the oracle's lower bound on the step time, seconds (normalises times).
        node_times: ``(n, D)`` seconds per node and device for one step; default
            :func:`roofline_times`.
        units: the unit graph if already computed.
    """
    g, c = instance.graph, instance.cluster
    ub = units if units is not None else unit_graph(g)
    U, E, D = ub.num_units, ub.num_edges, c.num_devices
    label = instance.name or g.meta.get("name", "?")
    for what, have, cap in (
        ("colocation units", U, bounds.max_nodes),
        ("unit edges", E, bounds.max_edges),
        ("devices", D, bounds.max_devices),
    ):
        if have > cap:
            raise ValueError(
                f"instance {label!r} on {c.name!r} has {have} {what}, more than the env's "
                f"bound {cap}; raise the bound ({bounds})"
            )
    if U < 1:
        raise ValueError(f"instance {label!r} has no nodes")
    nt = roofline_times(g, c) if node_times is None else np.asarray(node_times, dtype=np.float64)
    if nt.shape != (g.num_nodes, D):
        raise ValueError(f"node_times has shape {nt.shape}, expected ({g.num_nodes}, {D})")
    unit_time = np.zeros((U, D))
    np.add.at(unit_time, ub.node_unit, nt)
    lb = _finite_pos(lower_bound, default=0.0)
    fastest = np.where(np.isfinite(unit_time), unit_time, np.inf).min(axis=1)
    fastest = np.where(np.isfinite(fastest), fastest, 0.0)
    if lb <= 0:  # degenerate instance (no work): fall back to the total fastest-device work
        lb = _finite_pos(float(fastest.sum()), default=1e-6)

    cap = c.memory.astype(np.float64)
    finite_cap = cap[np.isfinite(cap)]
    min_cap = float(finite_cap.min()) if finite_cap.size else np.inf
    max_cap = float(finite_cap.max()) if finite_cap.size else np.inf
    mem_need = ub.param_bytes + ub.act_bytes
    node = np.zeros((bounds.max_nodes, F_NODE), dtype=np.float32)
    cols = {
        "time_rel": _rel(fastest),
        "time_log": _lognorm(fastest),
        "time_lb": np.minimum(fastest / lb, 1.0),
        "flops_log": _lognorm(ub.flops),
        "bytes_log": _lognorm(ub.bytes_accessed),
        "param_rel": _rel(ub.param_bytes),
        "param_log": _lognorm(ub.param_bytes),
        "act_log": _lognorm(ub.act_bytes),
        "out_log": _lognorm(ub.out_bytes),
        "mem_need": np.minimum(mem_need / min_cap, 1.0) if np.isfinite(min_cap) else 0.0,
        "topo_pos": np.arange(U) / max(U - 1, 1),
        "size_log": _lognorm(ub.size),
        "work_pos": _mid_cumsum(fastest),
        "mem_pos": _mid_cumsum(ub.param_bytes),
    }
    for k, v in cols.items():
        node[:U, _N[k]] = v

    edge = np.zeros((bounds.max_edges, F_EDGE), dtype=np.float32)
    edge[:E, _E["bytes_rel"]] = _rel(ub.edge_bytes)
    edge[:E, _E["bytes_log"]] = _lognorm(ub.edge_bytes)
    edge[:E, _E["forward"]] = ub.src < ub.dst
    edge_index = np.zeros((2, bounds.max_edges), dtype=np.int64)
    edge_index[0, :E], edge_index[1, :E] = ub.src, ub.dst

    speed = c.effective_flops
    dev = np.zeros((bounds.max_devices, F_DEV), dtype=np.float32)
    dev[:D, _D["speed_rel"]] = speed / speed.max()
    dev[:D, _D["membw_rel"]] = c.mem_bw / c.mem_bw.max()
    dev[:D, _D["mem_rel"]] = np.where(np.isfinite(cap), cap / max_cap, 1.0)
    total_need = float(mem_need.sum())
    dev[:D, _D["mem_vs_graph"]] = (
        np.minimum(cap / total_need, 1.0) if total_need > 0 else np.ones(D)
    )

    dev[:D, _D["speed_pos"]] = _mid_cumsum(speed)
    dev[:D, _D["mem_pos"]] = _mid_cumsum(
        np.where(np.isfinite(cap), cap, max_cap if np.isfinite(max_cap) else 1.0)
    )

    bw = c.bandwidth_matrix()
    lat = c.latency_matrix()
    off = ~np.eye(D, dtype=bool)
    link = np.zeros((bounds.max_devices, bounds.max_devices, F_LINK), dtype=np.float32)
    if D > 1:
        bw_max = float(bw[off].max())
        lat_max = float(lat[off].max())
        link[:D, :D, 0] = np.where(off, bw / bw_max, 1.0)
        link[:D, :D, 1] = np.where(off, lat / lat_max, 0.0) if lat_max > 0 else 0.0
    else:
        link[0, 0, 0] = 1.0
    inv_bw = np.where(off, 1.0 / np.where(off, bw, 1.0), 0.0)

    glob = np.zeros(F_GLOBAL, dtype=np.float32)
    glob[_G["units_frac"]] = U / bounds.max_nodes
    glob[_G["devices_frac"]] = D / bounds.max_devices
    tot_cap = float(finite_cap.sum()) if finite_cap.size else np.inf
    glob[_G["mem_pressure"]] = (
        min(float(ub.param_bytes.sum()) / tot_cap, 1.0) if np.isfinite(tot_cap) else 0.0
    )

    def mask(k: int, size: int) -> np.ndarray:
        m = np.zeros(size, dtype=np.int8)
        m[:k] = 1
        return m

    return InstanceEncoding(
        instance=instance,
        units=ub,
        bounds=bounds,
        lower_bound=lb,
        unit_time=unit_time,
        unit_mem=ub.param_bytes.copy(),
        runnable=np.isfinite(unit_time),
        capacity=cap,
        inv_bw=inv_bw,
        latency=np.where(off, lat, 0.0),
        speed_rel=speed / speed.max(),
        node_static=node,
        edge_static=edge,
        device_static=dev,
        link_feat=link.reshape(-1),
        edge_index=edge_index.reshape(-1),
        node_mask=mask(U, bounds.max_nodes),
        edge_mask=mask(E, bounds.max_edges),
        device_mask=mask(D, bounds.max_devices),
        global_static=glob,
    )
