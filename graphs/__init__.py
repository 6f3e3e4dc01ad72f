"""devplace graphs: training computation graphs, clusters, plans, extraction, zoo and I/O."""

from graphs.cluster import Cluster, Device, Link
from graphs.compgraph import BWD, FWD, KIND_NAMES, OPT, CompGraph
from graphs.plan import Plan, check_placement

__all__ = [
    "BWD",
    "FWD",
    "KIND_NAMES",
    "OPT",
    "Cluster",
    "CompGraph",
    "Device",
    "Link",
    "Plan",
    "check_placement",
]
