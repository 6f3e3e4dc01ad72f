"""devplace placement environments (Gymnasium) and oracles."""

from gymnasium.envs.registration import register, registry

#: The registered environment ids.
ENV_IDS = (
    "placement_env/Sweep-v0",
    "placement_env/Reassign-v0",
    "placement_env/Stage-v0",
    "placement_env/OneShot-v0",
    "placement_env/Hybrid-v0",
)

if ENV_IDS[0] not in registry:
    register(id="placement_env/Sweep-v0", entry_point="placement_env.envs.sweep:SweepEnv")
    register(
        id="placement_env/Reassign-v0",
        entry_point="placement_env.envs.reassign:ReassignEnv",
        max_episode_steps=256,
    )
    register(
        id="placement_env/Stage-v0",
        entry_point="placement_env.envs.stage:StageEnv",
        max_episode_steps=128,
    )
    register(id="placement_env/OneShot-v0", entry_point="placement_env.envs.oneshot:OneShotEnv")
    register(
        id="placement_env/Hybrid-v0",
        entry_point="placement_env.envs.hybrid:HybridEnv",
        max_episode_steps=64,
    )


def env_keywords(env_id: str) -> set[str] | None:
    """The keyword arguments the env class of ``env_id`` takes (None: any, or unknown): what
    ``env.env_kwargs`` and a policy file's ``env_options`` may set."""
    import importlib
    import inspect

    import gymnasium as gym

    entry = gym.spec(env_id).entry_point
    if not isinstance(entry, str):
        return None
    module, _, name = entry.partition(":")
    params = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return set(params)


def creator_error(exc: BaseException) -> str:
    """The env's own message of an error ``gym.make`` re-raised (without gymnasium's
    "was raised from the environment creator ... with kwargs" tail)."""
    return str(exc).split(" was raised from the environment creator")[0]


__all__ = ["ENV_IDS", "creator_error", "env_keywords"]
