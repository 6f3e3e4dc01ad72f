"""devplace graphs: training computation graphs, clusters, plans, extraction, zoo and I/O."""

from __future__ import annotations

import importlib
from typing import Any

from graphs.cluster import Cluster, Device, Link
from graphs.compgraph import BWD, FWD, KIND_NAMES, OPT, CompGraph
from graphs.plan import Plan, check_placement

# Heavier parts load on first use (torch only when extracting).
_LAZY_FUNCS = {"extract": "graphs.extraction", "coarsen": "graphs.coarsening"}
_LAZY_MODULES = {"zoo", "io", "clusters", "synthetic"}

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
    "clusters",
    "coarsen",
    "extract",
    "io",
    "synthetic",
    "zoo",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_FUNCS:
        return getattr(importlib.import_module(_LAZY_FUNCS[name]), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(f"graphs.{name}")
    raise AttributeError(f"module 'graphs' has no attribute {name!r}")
