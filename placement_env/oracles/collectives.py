"""Collective-communication times (ring and hierarchical all-reduce, reduce-scatter, all-gather, p2p) over a cluster's topology."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from graphs.cluster import Cluster

#: Groups of at most this many devices on a cluster without node structure get the best
#: ring order by exhaustive search (bottleneck bandwidth); larger ones use rank order.
RING_SEARCH_MAX = 8


def ring_allreduce_time(nbytes: float, n: int, bw: float, lat: float) -> float:
    """Ring all-reduce of an ``nbytes`` buffer over ``n`` ranks whose ring links carry ``bw``
    bytes/s per direction with ``lat`` seconds per step: ``2 (n-1)/n * nbytes / bw +
    2 (n-1) lat`` (reduce-scatter then all-gather; Patarasuk & Yuan 2009, NCCL's ring)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / bw + 2.0 * (n - 1) * lat


def ring_reduce_scatter_time(nbytes: float, n: int, bw: float, lat: float) -> float:
    """Ring reduce-scatter of an ``nbytes`` buffer (each rank ends with ``nbytes / n``):
    ``(n-1)/n * nbytes / bw + (n-1) lat``. All-gather to an ``nbytes`` result costs the same."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * nbytes / bw + (n - 1) * lat


ring_allgather_time = ring_reduce_scatter_time


@dataclass(frozen=True)
class Link2:
    """Bandwidth (bytes/s per direction) and latency (s) of one level of the hierarchy."""

    bw: float
    lat: float


@dataclass(frozen=True)
class GroupShape:
    """Where a communication group's ranks sit: ``per_node`` ranks in each of ``nodes`` nodes."""

    per_node: int
    nodes: int

    @property
    def size(self) -> int:
        return self.per_node * self.nodes


@dataclass(frozen=True, eq=False)
class Topology:
    """The two levels the hybrid cost model sees: GPUs inside a node (NVLink/NVSwitch) and
    nodes joined by one NIC per GPU (InfiniBand), read from a :class:`Cluster`.

    ``gpus_per_node`` comes from ``cluster.meta["gpus_per_node"]`` (the multi-node presets of
    :func:`graphs.clusters.load` set it); without it the whole cluster is one node.
    ``intra`` is the route from device 0 to device 1 (bottleneck bandwidth, summed
    latency), ``inter`` the route from device 0 to device ``gpus_per_node``. On a cluster
    without node structure whose devices are not all-to-all (e.g. the DGX-1 cube mesh),
    a group's ring bandwidth is that of its best ring through the cluster's routes
    (:meth:`ring_link`), not ``intra``.
    """

    cluster: Cluster
    gpus_per_node: int
    intra: Link2
    inter: Link2
    uniform: bool
    _rings: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_cluster(cls, cluster: Cluster) -> Topology:
        D = cluster.num_devices
        G = min(int(cluster.meta.get("gpus_per_node", D)), D)
        if G < 1 or D % G:
            raise ValueError(
                f"Topology: cluster {cluster.name!r} has {D} devices, not a multiple of "
                f"gpus_per_node={G}"
            )

        def link(a: int, b: int) -> Link2:
            r = cluster.route(a, b)
            return Link2(
                min(cluster.links[i].bandwidth for i in r), sum(cluster.links[i].latency for i in r)
            )

        intra = link(0, 1) if G > 1 else Link2(float("inf"), 0.0)
        inter = link(0, G) if D > G else intra
        uniform = "gpus_per_node" in cluster.meta or _all_to_all(cluster, G)
        return cls(cluster, G, intra, inter, uniform)

    # ----------------------------------------------------------- groups
    def shape(self, ranks: np.ndarray) -> GroupShape:
        """:class:`GroupShape` of a group of device indices (equal count per node assumed,
        as for every group of a :class:`graphs.layout.HybridLayout` mesh)."""
        nodes = np.unique(np.asarray(ranks) // self.gpus_per_node)
        return GroupShape(len(ranks) // len(nodes), len(nodes))

    def representatives(self, groups: np.ndarray) -> np.ndarray:
        """One row of ``groups`` (the groups of one collective that run at once, e.g. a stage's
        tensor-parallel groups) per cost class: on node-structured or all-to-all clusters a
        group's time depends only on how many nodes it spans; elsewhere every row."""
        groups = np.atleast_2d(np.asarray(groups, dtype=np.int64))
        if len(groups) == 1 or not self.uniform:
            return groups
        nodes = groups // self.gpus_per_node
        if (nodes == nodes[:, :1]).all():  # every group inside one node: all alike
            return groups[:1]
        spans = 1 + (np.diff(np.sort(nodes, axis=1), axis=1) > 0).sum(axis=1)
        _, first = np.unique(spans, return_index=True)
        return groups[np.sort(first)]

    def slowest(self, time_of: Callable[[np.ndarray], float], groups: np.ndarray) -> float:
        """The largest ``time_of(group)`` over the rows of ``groups`` (collectives that run at
        once: the step waits for the slowest), timed on :meth:`representatives` only."""
        return max(time_of(g) for g in self.representatives(groups))

    def ring_link(self, ranks: tuple[int, ...]) -> Link2:
        """Bottleneck bandwidth and largest latency of the best ring through ``ranks`` in one
        node (all-to-all nodes: ``intra``)."""
        if self.uniform:
            return self.intra
        key = tuple(sorted(ranks))
        hit = self._rings.get(key)
        if hit is None:
            hit = _best_ring(self.cluster, key)
            self._rings[key] = hit
        return hit

    # ----------------------------------------------------------- collectives
    def allreduce(self, nbytes: float, ranks: np.ndarray) -> float:
        """All-reduce time of ``nbytes`` over the device group ``ranks``: a ring inside one
        node; across nodes, hierarchical (NCCL-style): reduce-scatter inside each node,
        ``per_node`` parallel rings of ``nbytes / per_node`` across the nodes (one NIC per
        GPU), all-gather inside each node."""
        sh = self.shape(ranks)
        if sh.size <= 1:
            return 0.0
        if sh.nodes == 1:
            ln = self.ring_link(tuple(int(r) for r in ranks))
            return ring_allreduce_time(nbytes, sh.per_node, ln.bw, ln.lat)
        g = sh.per_node
        return 2.0 * ring_reduce_scatter_time(
            nbytes, g, self.intra.bw, self.intra.lat
        ) + ring_allreduce_time(nbytes / g, sh.nodes, self.inter.bw, self.inter.lat)

    def reduce_scatter(self, nbytes: float, ranks: np.ndarray) -> float:
        """Reduce-scatter of an ``nbytes`` buffer over ``ranks`` (hierarchical across nodes:
        inside each node, then ``per_node`` parallel rings of ``nbytes / per_node``).
        An all-gather of an ``nbytes`` result takes the same time."""
        sh = self.shape(ranks)
        if sh.size <= 1:
            return 0.0
        if sh.nodes == 1:
            ln = self.ring_link(tuple(int(r) for r in ranks))
            return ring_reduce_scatter_time(nbytes, sh.per_node, ln.bw, ln.lat)
        g = sh.per_node
        return ring_reduce_scatter_time(
            nbytes, g, self.intra.bw, self.intra.lat
        ) + ring_reduce_scatter_time(nbytes / g, sh.nodes, self.inter.bw, self.inter.lat)

    allgather = reduce_scatter

    def p2p(self, nbytes: float, a: int, b: int) -> float:
        """Point-to-point time of ``nbytes`` from device ``a`` to ``b`` (same node: ``intra``,
        else ``inter``; on a non-uniform single node, the route's bottleneck)."""
        if a == b or nbytes <= 0:
            return 0.0
        if a // self.gpus_per_node != b // self.gpus_per_node:
            return self.inter.lat + nbytes / self.inter.bw
        if self.uniform:
            return self.intra.lat + nbytes / self.intra.bw
        return self.cluster.transfer_time(a, b, nbytes)


def _all_to_all(cluster: Cluster, G: int) -> bool:
    """True when every pair of the first node's devices has the same route bottleneck."""
    n = min(G, cluster.num_devices)
    if n <= 2:
        return True
    bws = {
        min(cluster.links[i].bandwidth for i in cluster.route(a, b))
        for a in range(n)
        for b in range(n)
        if a != b
    }
    return len(bws) == 1


def _best_ring(cluster: Cluster, ranks: tuple[int, ...]) -> Link2:
    n = len(ranks)
    if n <= 1:
        return Link2(float("inf"), 0.0)
    bw, lat = _pair_tables(cluster)
    sub_bw = bw[np.ix_(ranks, ranks)]
    sub_lat = lat[np.ix_(ranks, ranks)]
    if n == 2:
        return Link2(
            float(min(sub_bw[0, 1], sub_bw[1, 0])), float(max(sub_lat[0, 1], sub_lat[1, 0]))
        )
    orders = (
        ((0, *p) for p in itertools.permutations(range(1, n)))
        if n <= RING_SEARCH_MAX
        else iter([tuple(range(n))])
    )
    best, best_o = -1.0, tuple(range(n))
    for o in orders:
        b = min(sub_bw[o[i], o[(i + 1) % n]] for i in range(n))
        if b > best:
            best, best_o = b, o
    lmax = max(sub_lat[best_o[i], best_o[(i + 1) % n]] for i in range(n))
    return Link2(float(best), float(lmax))


def _pair_tables(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    hit = cluster.__dict__.get("_pair_tables")
    if hit is None:
        hit = (cluster.bandwidth_matrix(), cluster.latency_matrix())
        object.__setattr__(cluster, "_pair_tables", hit)
    return hit


__all__ = [
    "GroupShape",
    "Link2",
    "Topology",
    "ring_allgather_time",
    "ring_allreduce_time",
    "ring_reduce_scatter_time",
]
