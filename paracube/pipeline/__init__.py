"""Pipeline parallelism: stage partitioning, schedules as data, simulator, executor."""

from paracube.pipeline.schedules import SCHEDULES, Action, build_schedule, check_schedule
from paracube.pipeline.simulator import Costs, Timeline, simulate

__all__ = ["SCHEDULES", "Action", "Costs", "Timeline", "build_schedule", "check_schedule", "simulate"]
