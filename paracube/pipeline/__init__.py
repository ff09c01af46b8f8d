"""Pipeline parallelism: stage partitioning, schedules as data, simulator, executor."""

from paracube.pipeline.schedules import (
    SCHEDULES,
    Action,
    Schedule,
    build_schedule,
    check_schedule,
    get_schedule,
)
from paracube.pipeline.simulator import Costs, Timeline, simulate

__all__ = [
    "SCHEDULES",
    "Action",
    "Costs",
    "Schedule",
    "Timeline",
    "build_schedule",
    "check_schedule",
    "get_schedule",
    "simulate",
]
