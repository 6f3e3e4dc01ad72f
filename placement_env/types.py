"""Typed containers of the placement environments: instances, unit graphs, observations, state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from graphs.cluster import Cluster
from graphs.compgraph import CompGraph

# --------------------------------------------------------------------------- features
#: Columns of ``node_feat`` (one row per colocation unit). ``*_log`` columns are
#: ``log1p(1e4 * x / max(x)) / log1p(1e4)`` (four decades below the graph's maximum).
NODE_FEATURES: tuple[str, ...] = (
    "time_rel",  # unit compute time on its fastest device / max over units
    "time_log",  # log-normalised compute time
    "time_lb",  # compute time / instance lower bound (clipped to 1)
    "flops_log",  # log-normalised FLOPs
    "bytes_log",  # log-normalised bytes accessed
    "param_rel",  # persistent state bytes / max over units
    "param_log",  # log-normalised persistent state bytes
    "act_log",  # log-normalised activation bytes
    "out_log",  # log-normalised output bytes
    "mem_need",  # (param + act bytes) / smallest device capacity (clipped to 1)
    "topo_pos",  # unit index / (U - 1): position in the topological unit order
    "size_log",  # log-normalised number of member nodes
    "work_pos",  # compute time of the units before it + half its own / total (fastest devices)
    "mem_pos",  # persistent bytes of the units before it + half its own / total
    "current",  # 1 for the unit the action refers to (Sweep), else 0
    "visited",  # 1 for units already decided or moved this episode
    "device_pos",  # current device index / (max_devices - 1)
    "boundary",  # 1 if the unit's device differs from the previous unit's (stage start)
    "device_speed",  # relative speed of the unit's current device
    "cut_frac",  # fraction of the unit's edge bytes that cross devices now
)
#: Columns of ``edge_feat`` (one row per unit edge).
EDGE_FEATURES: tuple[str, ...] = (
    "bytes_rel",  # summed tensor bytes / max over unit edges
    "bytes_log",  # log-normalised bytes
    "forward",  # 1 if src precedes dst in the unit order, else 0
    "cut",  # 1 if the endpoints are on different devices now
    "comm_lb",  # uncontended transfer time under the current placement / lower bound (clip 1)
)
#: Columns of ``device_feat`` (one row per device).
DEVICE_FEATURES: tuple[str, ...] = (
    "speed_rel",  # effective FLOP/s / max over the cluster
    "membw_rel",  # memory bandwidth / max over the cluster
    "mem_rel",  # capacity / max finite capacity (unbounded = 1)
    "mem_vs_graph",  # capacity / total persistent+activation bytes of the graph (clip 1)
    "speed_pos",  # FLOP/s of the devices before it + half its own / total (device order)
    "mem_pos",  # capacity of the devices before it + half its own / total (device order)
    "used_frac",  # persistent bytes placed here / capacity (clip 1)
    "free_frac",  # max(0, capacity - persistent bytes placed here) / capacity
    "over",  # 1 if the persistent bytes placed here exceed the capacity
    "load_lb",  # compute time of the units placed here / lower bound (clip 1)
    "units_frac",  # units placed here / U
    "current_dev",  # 1 for the device now holding the current unit
)
#: Channels of ``link_feat`` (one ``(max_devices, max_devices)`` matrix each).
LINK_FEATURES: tuple[str, ...] = (
    "bw_rel",  # route bottleneck bandwidth / max over pairs (diagonal 1, padding 0)
    "lat_rel",  # route latency / max over pairs (diagonal 0, padding 0)
)
#: Entries of ``global_feat``.
GLOBAL_FEATURES: tuple[str, ...] = (
    "progress",  # steps taken / episode horizon (0 where there is none)
    "efficiency",  # lower bound / current step time (0 before any evaluation)
    "best_efficiency",  # lower bound / best step time this episode
    "oom",  # 1 if the current placement runs out of memory
    "units_frac",  # U / max_nodes
    "devices_frac",  # D / max_devices
    "mem_pressure",  # total persistent bytes / total finite device capacity (clip 1)
)


class Bounds(NamedTuple):
    """Padding sizes of the observation: every instance must fit."""

    max_nodes: int  # colocation units
    max_edges: int  # unit edges
    max_devices: int


@dataclass(frozen=True, eq=False)
class Instance:
    """One problem: a graph to place on a cluster (what a generator yields)."""

    graph: CompGraph
    cluster: Cluster
    name: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """Content identity, used to cache per-instance data."""
        return (self.graph.content_hash(), self.cluster.content_hash())


@dataclass(frozen=True, eq=False)
class UnitGraph:
    """The quotient of a CompGraph by its colocation groups, units in topological order.

    Unit ``u`` is the ``u``-th group by the first topological position of any of
    its nodes, so every contiguous index range is a valid pipeline stage.
    """

    num_units: int  # U
    node_unit: np.ndarray  # (n,) int64  unit of each graph node
    group_id: np.ndarray  # (U,) int64  colocation group id of each unit
    size: np.ndarray  # (U,) float64  member nodes per unit
    flops: np.ndarray  # (U,) float64
    bytes_accessed: np.ndarray  # (U,) float64
    param_bytes: np.ndarray  # (U,) float64  persistent state (weights+grads+optimizer)
    act_bytes: np.ndarray  # (U,) float64
    out_bytes: np.ndarray  # (U,) float64
    src: np.ndarray  # (E,) int64  unit edges, one per ordered unit pair with traffic
    dst: np.ndarray  # (E,) int64
    edge_bytes: np.ndarray  # (E,) float64  summed bytes of the graph edges between them

    @property
    def num_edges(self) -> int:
        return len(self.src)

    def node_placement(self, unit_placement: np.ndarray) -> np.ndarray:
        """Expand a per-unit device array ``(U,)`` to the graph's per-node placement ``(n,)``."""
        return unit_placement[self.node_unit]


@dataclass(eq=False)
class Observation:
    """One observation, padded. ``as_dict()`` gives the flat arrays the spaces hold.

    Every Box is 1-D (SB3 warns on other ranks); the logical shapes are given
    here and in :data:`placement_env.encoding.OBS_SHAPES`.
    """

    node_feat: np.ndarray  # (max_nodes, len(NODE_FEATURES)) float32 in [0, 1]
    edge_index: np.ndarray  # (2, max_edges) int64 unit indices, padding 0
    edge_feat: np.ndarray  # (max_edges, len(EDGE_FEATURES)) float32 in [0, 1]
    device_feat: np.ndarray  # (max_devices, len(DEVICE_FEATURES)) float32 in [0, 1]
    link_feat: np.ndarray  # (max_devices, max_devices, len(LINK_FEATURES)) float32 in [0, 1]
    global_feat: np.ndarray  # (len(GLOBAL_FEATURES),) float32 in [0, 1]
    placement: np.ndarray  # (max_nodes,) int64 device of each unit, -1 = unplaced / padding
    current: np.ndarray  # (1,) int64 current unit, -1 = none
    node_mask: np.ndarray  # (max_nodes,) int8 1 = real unit
    edge_mask: np.ndarray  # (max_edges,) int8 1 = real edge
    device_mask: np.ndarray  # (max_devices,) int8 1 = real device

    def as_dict(self) -> dict[str, np.ndarray]:
        return {k: np.ascontiguousarray(v).reshape(-1) for k, v in self.__dict__.items()}


@dataclass(eq=False)
class EpisodeState:
    """Mutable per-episode state shared by all environments."""

    placement: np.ndarray  # (U,) int64 device of each unit, -1 = not placed yet
    visited: np.ndarray  # (U,) bool units decided / moved this episode
    current: int = -1  # unit the next action refers to (-1 = none)
    steps: int = 0
    step_time: float = float("nan")  # seconds, last evaluation (nan = none yet)
    best_step_time: float = float("inf")  # seconds, best feasible this episode (inf = none)
    cost: float = float("nan")  # normalised cost of the current placement
    oom: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
