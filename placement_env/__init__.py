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

__all__ = ["ENV_IDS"]
