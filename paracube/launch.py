"""Starting the ranks: torch's elastic launcher locally, or nothing under torchrun.

``paracube train --dp 4`` outside torchrun starts 4 local worker processes through
``torch.distributed.launcher.api.elastic_launch`` — the machinery behind ``torchrun
--standalone`` (c10d rendezvous on a free local port). Under ``torchrun`` (one or many
nodes) the command runs as one rank of the job it finds in the environment.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Callable

from paracube.errors import ParacubeError


def inside_torchrun() -> bool:
    """True when a launcher already set this process's rank (torchrun, srun wrappers …)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launched_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def launch_local(nprocs: int, entrypoint: Callable[..., int], *args) -> int:
    """Run ``entrypoint(*args)`` on ``nprocs`` local ranks; return the worst exit code.

    Entry points return an exit code (0, or 2 for a rejected configuration) rather than
    raising, so a clean refusal on every rank is not reported as a crash.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nprocs,
        run_id=f"paracube-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # as torchrun --standalone: a free port on this host
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    try:
        codes = elastic_launch(config, entrypoint)(*args)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        print(
            f"paracube: rank {rank} failed (exit {failure.exitcode}); see its traceback above",
            file=sys.stderr,
        )
        return 1
    return max((c or 0) for c in codes.values())


def run_rank(fn: Callable[..., None], *args) -> int:
    """Run one rank's work; turn paracube's own errors into one line (rank 0) and exit 2."""
    try:
        fn(*args)
        return 0
    except ParacubeError as e:
        if os.environ.get("RANK", "0") == "0" or e.exit_code != 2:
            print(f"paracube: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
