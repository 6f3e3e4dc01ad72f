"""Learned placement policies: networks (Placeto, GDP) and their SB3 actor-critic policies."""

from __future__ import annotations

from agents.policies.base import PlacementNet
from agents.policies.dense import DenseGraph, dense_from_obs, obs_dims, to_pyg
from agents.policies.device_head import MASK_LOGIT, DeviceEncoder, PairScorer
from agents.policies.gdp import GDPNet
from agents.policies.placeto import PlacetoNet
from agents.policies.sage import BiSAGEConv, GraphEncoder
from agents.policies.sb3 import GdpPolicy, GraphActorCriticPolicy, PlacetoPolicy

__all__ = [
    "MASK_LOGIT",
    "BiSAGEConv",
    "DenseGraph",
    "DeviceEncoder",
    "GDPNet",
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
    "obs_dims",
    "to_pyg",
]

_POLICIES: dict[str, type[GraphActorCriticPolicy]] = {
    "placeto": PlacetoPolicy,
    "gdp": GdpPolicy,
}
_NETWORKS: dict[str, type[PlacementNet]] = {
    "placeto": PlacetoNet,
    "gdp": GDPNet,
}


def names() -> list[str]:
    """Names of the registered policies."""
    return sorted(_POLICIES)


def get(name: str) -> type[GraphActorCriticPolicy]:
    """The SB3 policy class registered as ``name`` (``ValueError`` listing the valid names)."""
    try:
        return _POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; available: {names()}") from None


def network_class(name: str) -> type[PlacementNet]:
    """The network class registered as ``name`` (``ValueError`` listing the valid names)."""
    try:
        return _NETWORKS[name]
    except KeyError:
        raise ValueError(f"unknown network {name!r}; available: {sorted(_NETWORKS)}") from None
