"""The simulator's max-load objective at node level, for the exact planners (`ideal_dp`, `ilp`).

:class:`MaxLoadModel` restates the rules of ``Simulator(objective="max_load")``
(``placement_env/oracles/simulator.py``, ``_kernels.max_load_kernel``) as arrays
the planners optimise over, in the simulator's own unit (microseconds):

* compute of node ``i`` on device ``d``: ``graph.times[kind][i]`` where present,
  else the whole-batch roofline ``max(flops / (peak * eff), bytes / mem_bw) +
  launch_overhead`` (``inf``: the node cannot run there);
* transfers: for each producer node ``x`` and each *other* device ``b`` holding a
  consumer of ``x``, ``c(x, b)`` is charged to ``b`` and ``max_b c(x, b)`` to
  ``x``'s own device; devices of kind ``"cpu"`` are never charged. ``c(x, b)`` is
  the largest explicit ``edge_time`` of an edge from ``x`` to ``b`` when one is
  set, else the store-and-forward route time of the largest edge bytes.

Per distinct producer-consumer pair ``p`` the model keeps its bytes and explicit
time; ``pair_cost(p, a, b)`` is its transfer time from ``a`` to ``b``. When every
node's out-edges are all explicit or all link-priced (true of Fiddle files and
zoo graphs) ``c(x, b) = max`` of ``pair_cost`` over ``x``'s consumers on ``b``
exactly; otherwise that max is an upper bound and :attr:`exact` is False.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphs.cluster import Cluster
from graphs.compgraph import CompGraph


@dataclass(frozen=True, eq=False)
class MaxLoadModel:
    """Node-level max-load costs of ``graph`` on ``cluster`` (microseconds).

    Attributes (``n`` nodes, ``D`` devices, ``P`` distinct producer-consumer pairs)::

        comp     float64[n, D]  compute microseconds (inf = cannot run)
        psrc     int64[P]       producer node of each pair
        pdst     int64[P]       consumer node
        pbytes   float64[P]     largest edge bytes of the pair
        ptime    float64[P]     largest explicit edge time (us), NaN = link-priced
        rlat     float64[D, D]  summed route latency a -> b (s), 0 on the diagonal
        rinv     float64[D, D]  summed 1 / bandwidth over the route (s / byte)
        nocomm   bool[D]        device pays no transfer cost (kind "cpu")
        exact    bool           c(x, b) is the max of the pair costs (no mixed out-edges)
        uniform  bool           every route a != b costs the same (rlat, rinv constant)
    """

    comp: np.ndarray
    psrc: np.ndarray
    pdst: np.ndarray
    pbytes: np.ndarray
    ptime: np.ndarray
    rlat: np.ndarray
    rinv: np.ndarray
    nocomm: np.ndarray
    exact: bool
    uniform: bool

    @property
    def num_devices(self) -> int:
        return self.comp.shape[1]

    def pair_cost(self, a: int | np.ndarray, b: int | np.ndarray) -> np.ndarray:
        """``float64[P]`` microseconds of every pair sent from device ``a`` to ``b`` (``a != b``)."""
        link = (self.rlat[a, b] + self.pbytes * self.rinv[a, b]) * 1e6
        return np.where(np.isnan(self.ptime), link, self.ptime)

    def uniform_cost(self) -> np.ndarray:
        """``float64[P]``: the pair costs when every route costs the same, else the largest over routes."""
        D = self.num_devices
        if D < 2:
            return np.zeros(len(self.psrc))
        off = ~np.eye(D, dtype=bool)
        lat, inv = self.rlat[off].max(), self.rinv[off].max()
        link = (lat + self.pbytes * inv) * 1e6
        return np.where(np.isnan(self.ptime), link, self.ptime)

    def loads(self, placement: np.ndarray, skip: np.ndarray | None = None) -> np.ndarray:
        """``float64[D]`` load of each device (microseconds) under a per-node ``placement``.

        ``skip``: ``bool[n]`` nodes whose compute is left out (their transfers still count).
        """
        p = np.asarray(placement, dtype=np.int64)
        D = self.num_devices
        w = self.comp[np.arange(len(p)), p]
        if skip is not None:
            w = np.where(skip, 0.0, w)
        load = np.bincount(p, weights=w, minlength=D).astype(float)
        a, b = p[self.psrc], p[self.pdst]
        cross = a != b
        if not cross.any():
            return load
        src, a, b = self.psrc[cross], a[cross], b[cross]
        link = (self.rlat[a, b] + self.pbytes[cross] * self.rinv[a, b]) * 1e6
        expl = self.ptime[cross]
        # c(x, b): the largest explicit time to b if any, else the link time of the largest bytes
        key = src * D + b
        has = ~np.isnan(expl)
        cx = {}
        for k, t, e, h in zip(key.tolist(), link.tolist(), expl.tolist(), has.tolist()):
            prev = cx.get(k)
            cur = (h, e if h else t)
            if prev is None or (cur[0] and not prev[0]) or (cur[0] == prev[0] and cur[1] > prev[1]):
                cx[k] = cur
        own = np.zeros(len(p))
        for k, (_, c) in cx.items():
            x, bb = divmod(k, D)
            if not self.nocomm[bb]:
                load[bb] += c
            own[x] = max(own[x], c)
        np.add.at(load, p, np.where(self.nocomm[p], 0.0, own))
        return load

    def max_load(self, placement: np.ndarray) -> float:
        """The largest device load (microseconds)."""
        return float(self.loads(placement).max())


def compute_microseconds(graph: CompGraph, cluster: Cluster) -> np.ndarray:
    """``float64[n, D]`` whole-batch compute time per node and device, as ``Simulator`` max-load."""
    out = np.empty((graph.num_nodes, cluster.num_devices))
    for d, dev in enumerate(cluster.devices):
        roof = (
            np.maximum(
                graph.flops / (dev.peak_flops * dev.efficiency), graph.bytes_accessed / dev.mem_bw
            )
            + dev.launch_overhead
        ) * 1e6
        t = graph.times.get(dev.kind)
        out[:, d] = roof if t is None else np.where(np.isnan(t), roof, t)
    return out


def build_model(graph: CompGraph, cluster: Cluster) -> MaxLoadModel:
    """Collect the max-load costs of ``graph`` on ``cluster`` (see the module docstring)."""
    D = cluster.num_devices
    src, dst = graph.src, graph.dst
    et = graph.edge_time if graph.edge_time is not None else np.full(graph.num_edges, np.nan)
    key = src.astype(np.int64) * max(graph.num_nodes, 1) + dst
    uniq, inv = np.unique(key, return_inverse=True)
    P = len(uniq)
    pbytes = np.zeros(P)
    np.maximum.at(pbytes, inv, graph.edge_bytes)
    ptime = np.full(P, -np.inf)
    has = ~np.isnan(et)
    np.maximum.at(ptime, inv[has], et[has])
    ptime[np.isneginf(ptime)] = np.nan
    psrc = (uniq // max(graph.num_nodes, 1)).astype(np.int64)
    pdst = (uniq % max(graph.num_nodes, 1)).astype(np.int64)
    # mixed out-edges (some explicit, some link-priced) make the per-pair max an upper bound
    expl = np.bincount(psrc, weights=~np.isnan(ptime), minlength=graph.num_nodes)
    tot = np.bincount(psrc, minlength=graph.num_nodes)
    exact = bool(np.all((expl == 0) | (expl == tot)))
    rlat = np.zeros((D, D))
    rinv = np.zeros((D, D))
    for a in range(D):
        for b in range(D):
            if a != b:
                for lk in cluster.route(a, b):
                    ln = cluster.links[lk]
                    rlat[a, b] += ln.latency
                    rinv[a, b] += 1.0 / ln.bandwidth
    off = ~np.eye(D, dtype=bool)
    uniform = bool(D < 2 or (np.ptp(rlat[off]) == 0 and np.ptp(rinv[off]) == 0))
    return MaxLoadModel(
        comp=compute_microseconds(graph, cluster),
        psrc=psrc,
        pdst=pdst,
        pbytes=pbytes,
        ptime=ptime,
        rlat=rlat,
        rinv=rinv,
        nocomm=np.array([dev.kind == "cpu" for dev in cluster.devices], dtype=bool),
        exact=exact,
        uniform=uniform,
    )
