"""The placement environments: Sweep (Placeto), Reassign, Stage (pipelines), OneShot (GDP)."""

from placement_env.envs.base import PlacementEnv, SimulatorFactory
from placement_env.envs.oneshot import OneShotEnv
from placement_env.envs.reassign import ReassignEnv
from placement_env.envs.stage import StageEnv
from placement_env.envs.sweep import SweepEnv

__all__ = ["OneShotEnv", "PlacementEnv", "ReassignEnv", "SimulatorFactory", "StageEnv", "SweepEnv"]
