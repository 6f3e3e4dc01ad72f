"""Oracles score placements: the cost-model Simulator and the ProfiledOracle."""

from placement_env.oracles.base import Oracle, ScheduleEvent, SimResult
from placement_env.oracles.simulator import OBJECTIVES, SCHEDULES, Simulator

__all__ = ["OBJECTIVES", "SCHEDULES", "Oracle", "ScheduleEvent", "SimResult", "Simulator"]
