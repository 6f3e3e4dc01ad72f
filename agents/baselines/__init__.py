"""Classic placement baselines, looked up by name: ``get(name)(graph, cluster, oracle, budget) -> Plan``.

Every baseline plans whole colocation units (a graph's groups), respects each
device's memory, scores its answer with the oracle, and returns a
:class:`graphs.plan.Plan` whose ``meta`` holds at least ``algorithm``,
``step_time``, ``oracle_calls`` and ``search_seconds``. When no
memory-feasible plan is found it raises :class:`InfeasiblePlanError`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any, Protocol

from agents.baselines.common import InfeasiblePlanError
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from placement_env.oracles.base import Oracle


class Baseline(Protocol):
    """``(graph, cluster, oracle, budget, **options) -> Plan``; budget = oracle evaluations (None = default)."""

    def __call__(
        self, graph: CompGraph, cluster: Cluster, oracle: Oracle, budget: int | None = None, /
    ) -> Plan: ...


#: name -> "module:function" (imported on first use, so optional solvers load lazily).
_REGISTRY: dict[str, str] = {
    "single": "agents.baselines.simple:single",
    "round_robin": "agents.baselines.simple:round_robin",
    "random": "agents.baselines.simple:random_search",
    "expert": "agents.baselines.expert:expert",
    "metis": "agents.baselines.metis:metis",
    "m_topo": "agents.baselines.baechi:m_topo",
    "m_etf": "agents.baselines.baechi:m_etf",
    "m_sct": "agents.baselines.baechi:m_sct",
    "pipedream_dp": "agents.baselines.pipedream:pipedream_dp",
    "chain_dp": "agents.baselines.pipedream:chain_dp",
    "ideal_dp": "agents.baselines.ideal_dp:ideal_dp",
    "ideal_dp_makespan": "agents.baselines.ideal_dp_makespan:ideal_dp_makespan",
    "ilp": "agents.baselines.ilp:ilp",
    "anneal": "agents.baselines.anneal:anneal",
    # hybrid-parallel planners: they return plans with a HybridLayout (Plan.layout)
    "megatron_grid": "agents.baselines.megatron_grid:megatron_grid",
    "alpa": "agents.baselines.alpa:alpa",
    "hybrid_anneal": "agents.baselines.hybrid_anneal:hybrid_anneal",
    "pipedream": "agents.baselines.pipedream_hybrid:pipedream",
}


#: The planners whose plans are hybrid layouts (the others place operators).
HYBRID_PLANNERS: tuple[str, ...] = ("megatron_grid", "alpa", "hybrid_anneal", "pipedream")


def names() -> list[str]:
    """The registered baseline names, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> Callable[..., Plan]:
    """The baseline called ``name``; ``ValueError`` listing the valid names otherwise.

    The function returned checks its first four arguments before it plans: ``graph`` a
    ``CompGraph``, ``cluster`` a ``Cluster`` and ``oracle`` an oracle (``TypeError`` naming the
    argument; an ``AttributeError`` from inside before), ``budget`` ``None`` or an integer >= 1
    (``ValueError``; one-call planners took ``-1``, ``2.5`` or ``"10"`` without a word, 2 Dec
    2026). Its signature is the planner's (``inspect.signature`` follows ``__wrapped__``)."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown baseline {name!r}; valid names: {names()}")
    return _checked(name)


@functools.cache
def _checked(name: str) -> Callable[..., Plan]:
    module, func = _REGISTRY[name].split(":")
    fn = getattr(importlib.import_module(module), func)

    @functools.wraps(fn)
    def planner(
        graph: Any, cluster: Any, oracle: Any, budget: Any = None, *a: Any, **kw: Any
    ) -> Plan:
        check_call(name, graph, cluster, oracle, budget)
        return fn(graph, cluster, oracle, budget, *a, **kw)

    return planner


def check_call(name: str, graph: Any, cluster: Any, oracle: Any, budget: Any) -> None:
    """The argument checks of :func:`get`'s planners (see there)."""
    from agents.baselines.common import check_budget
    from graphs.plan import check_graph_cluster

    check_graph_cluster(name, graph, cluster)
    if not any(callable(getattr(oracle, m, None)) for m in ("evaluate", "evaluate_layout")):
        raise TypeError(
            f"{name}: oracle must be an oracle with evaluate() (placement_env.oracles.Simulator"
            f"(graph, cluster, ...)), got {oracle!r}"
        )
    check_budget(name, budget, None)


def register(name: str, target: str) -> None:
    """Add a baseline as ``"package.module:function"``; refuses to shadow an existing name."""
    if name in _REGISTRY:
        raise ValueError(f"baseline {name!r} is already registered ({_REGISTRY[name]})")
    if ":" not in target:
        raise ValueError(f"baseline target must be 'module:function', got {target!r}")
    _REGISTRY[name] = target


__all__ = ["HYBRID_PLANNERS", "Baseline", "InfeasiblePlanError", "get", "names", "register"]
