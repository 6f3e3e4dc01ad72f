"""Learned placement policies: networks (Placeto, GDP) and their SB3 actor-critic policies."""

from __future__ import annotations

from agents.policies.base import PlacementNet
from agents.policies.dense import DenseGraph, dense_from_obs, obs_dims, to_pyg
from agents.policies.device_head import MASK_LOGIT, DeviceEncoder, PairScorer
from agents.policies.ensemble import GDPEnsemble
from agents.policies.gdp import GDPNet
from agents.policies.placeto import PlacetoNet
from agents.policies.sage import BiSAGEConv, GraphEncoder
from agents.policies.sb3 import (
    GdpEnsemblePolicy,
    GdpPolicy,
    GraphActorCriticPolicy,
    PlacetoPolicy,
)

__all__ = [
    "MASK_LOGIT",
    "BiSAGEConv",
    "DenseGraph",
    "DeviceEncoder",
    "GDPEnsemble",
    "GDPNet",
    "GdpEnsemblePolicy",
    "GdpPolicy",
    "GraphActorCriticPolicy",
    "GraphEncoder",
    "PairScorer",
    "PlacementNet",
    "PlacetoNet",
    "PlacetoPolicy",
    "dense_from_obs",
    "get",
    "names",
    "network_class",
    "network_names",
    "obs_dims",
    "to_pyg",
]

_POLICIES: dict[str, type[GraphActorCriticPolicy]] = {
    "placeto": PlacetoPolicy,
    "gdp": GdpPolicy,
}
#: policies of networks that are only loaded from files (not trained from scratch by name)
_FILE_POLICIES: dict[str, type[GraphActorCriticPolicy]] = {"gdp_ensemble": GdpEnsemblePolicy}
_NETWORKS: dict[str, type[PlacementNet]] = {
    "placeto": PlacetoNet,
    "gdp": GDPNet,
    "gdp_ensemble": GDPEnsemble,
}


def names() -> list[str]:
    """Names of the registered policies."""
    return sorted(_POLICIES)


def get(name: str) -> type[GraphActorCriticPolicy]:
    """The SB3 policy class registered as ``name`` (``ValueError`` listing the valid names);
    also ``"gdp_ensemble"``, the policy of an ensemble file (PPO from ``init_policy``)."""
    try:
        return {**_POLICIES, **_FILE_POLICIES}[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; available: {names()}") from None


def network_names() -> list[str]:
    """Names of the registered networks (what a policy file's ``network`` field may be)."""
    return sorted(_NETWORKS)


def network_class(name: str) -> type[PlacementNet]:
    """The network class registered as ``name`` (``ValueError`` listing the valid names)."""
    try:
        return _NETWORKS[name]
    except KeyError:
        raise ValueError(f"unknown network {name!r}; available: {sorted(_NETWORKS)}") from None
