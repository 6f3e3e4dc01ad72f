"""Oracles score placements: the cost-model Simulator and the ProfiledOracle."""

from placement_env.oracles.base import Oracle, ScheduleEvent, SimResult

__all__ = ["Oracle", "ScheduleEvent", "SimResult"]
