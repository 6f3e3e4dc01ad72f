"""devplace agents: graph policies trained with PPO, classic baselines, exported policies."""

from __future__ import annotations

import importlib
from typing import Any

# name -> (module, attribute or None for the module itself); imported on first use,
# so ``import agents`` stays cheap and does not pull in torch or SB3.
_LAZY: dict[str, tuple[str, str | None]] = {
    "policies": ("agents.policies", None),
    "baselines": ("agents.baselines", None),
    "make_ppo": ("agents.ppo", "make_ppo"),
    "make_hybrid_ppo": ("agents.ppo", "make_hybrid_ppo"),
    "make_vec_env": ("agents.ppo", "make_vec_env"),
    "BestPlanTracker": ("agents.callbacks", "BestPlanTracker"),
    "export_policy": ("agents.export", "export_policy"),
    "load_policy": ("agents.export", "load_policy"),
    "ExportedPolicy": ("agents.export", "ExportedPolicy"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'agents' has no attribute {name!r}") from None
    mod = importlib.import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
