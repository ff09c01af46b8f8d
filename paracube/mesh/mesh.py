"""ProcessMesh: the (pp, dp, tp) groups built on torch's DeviceMesh.

One object, created once per job and passed explicitly to everything that
communicates — no module-level process groups. The rank math comes from
:class:`MeshLayout`; :meth:`ProcessMesh.check` verifies that DeviceMesh built exactly
the groups the layout predicts, so the pure tests of the layout cover the real groups.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from paracube.comm.ledger import CommLedger
from paracube.config import AXES, ParallelConfig
from paracube.mesh.layout import MeshLayout


def device_for_rank() -> torch.device:
    """``cuda:LOCAL_RANK`` when GPUs are present (NCCL), else the CPU (gloo)."""
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def init_distributed(timeout_s: float = 300.0) -> torch.device:
    """Join the job that the launcher (torchrun or ``paracube train``) started.

    Reads the usual ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` environment.
    The timeout bounds every collective: a stalled peer turns into an error, not a hang.
    """
    global _JOINED
    device = device_for_rank()
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = timedelta(seconds=timeout_s)
        store = _attempt_store(timeout)
        if store is None:
            dist.init_process_group(backend=backend, timeout=timeout)
        else:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            dist.init_process_group(
                backend, store=store, rank=rank, world_size=world, timeout=timeout
            )
    _JOINED = True
    return device


def _attempt_store(timeout: timedelta):
    """After the launcher restarted the job (``TORCHELASTIC_RESTART_COUNT`` > 0), the
    job's store under a prefix of its own: the previous attempt's keys — every group's
    peer addresses — are still in the launcher's store, and a restarted rank reading them
    would try to connect to ranks that are gone. None on a first attempt (plain env://)."""
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if not restart:
        return None
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=not agent_hosts and os.environ.get("RANK") == "0",
        timeout=timeout,
    )
    return dist.PrefixStore(f"paracube/attempt-{restart}", store)


_JOINED = False  # this process joined a job through init_distributed (see shutdown)


def _timeout_override(device: torch.device, timeout_s: float | None) -> dict | None:
    """Give every axis group the job's collective timeout.

    DeviceMesh creates its sub-groups with the backend's default timeout (30 min for gloo),
    not the default group's; without this a stalled peer would hang an axis for that long.
    """
    if timeout_s is None:
        return None
    if device.type == "cuda":
        backend, options = "nccl", dist.ProcessGroupNCCL.Options()
    else:
        backend, options = "gloo", dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = timedelta(seconds=timeout_s)
    return {axis: (backend, options) for axis in AXES}


class ProcessMesh:
    """The job's process groups along ``pp``, ``dp`` and ``tp``.

    >>> mesh = ProcessMesh(ParallelConfig(dp=2, tp=2))   # inside a 4-rank job
    >>> mesh.rank("tp"), mesh.size("dp"), mesh.group("dp")
    """

    def __init__(
        self,
        parallel: ParallelConfig,
        device: torch.device | None = None,
        timeout_s: float | None = None,
    ):
        self.layout = MeshLayout(pp=parallel.pp, dp=parallel.dp, tp=parallel.tp)
        self.device = device if device is not None else torch.device("cpu")
        self.global_rank = dist.get_rank()
        self.device_mesh: DeviceMesh = init_device_mesh(
            self.device.type,
            self.layout.shape,
            mesh_dim_names=AXES,
            backend_override=_timeout_override(self.device, timeout_s),
        )
        self.ledger = CommLedger()
        self._coords = self.layout.coords(self.global_rank)
        self._twins: dict[str, object] = {}  # axis → its twin group (twin_group)

    def group(self, axis: str):
        """The process group of this rank along ``axis``."""
        return self.device_mesh.get_group(axis)

    def rank(self, axis: str) -> int:
        """This rank's index along ``axis`` (0 ≤ index < size(axis))."""
        return self._coords[axis]

    def size(self, axis: str) -> int:
        return self.layout.size(axis)

    def twin_group(self, axis: str):
        """A second group with the ranks of this rank's ``axis`` group, for collectives
        left in flight across steps (``--dp-mode stale:S``) so that they do not queue
        ahead of each step's own. Collective: every rank creates every such group."""
        if axis not in self._twins:
            mine = None
            for ranks in self.layout.groups(axis):
                group = dist.new_group(ranks)
                if self.global_rank in ranks:
                    mine = group
            self._twins[axis] = mine
        return self._twins[axis]

    def group_ranks(self, axis: str) -> list[int]:
        return dist.get_process_group_ranks(self.group(axis))

    def stage_neighbours(self) -> tuple[int | None, int | None]:
        """Global ranks of the previous and next pipeline stage (None at the ends)."""
        return self.layout.stage_neighbours(self.global_rank)

    def first_last_stage_group(self):
        """The group of this rank's first- and last-stage counterparts (same dp, tp), for
        weights shared between them (tied embedding and head). Collective: every rank
        creates every such group, in the same order."""
        if getattr(self, "_first_last", None) is None:
            mine = None
            for dp in range(self.layout.dp):
                for tp in range(self.layout.tp):
                    ranks = [
                        self.layout.rank(pp=0, dp=dp, tp=tp),
                        self.layout.rank(pp=self.layout.pp - 1, dp=dp, tp=tp),
                    ]
                    group = dist.new_group(ranks)
                    if self.global_rank in ranks:
                        mine = group
            self._first_last = mine
        return self._first_last

    def check(self) -> None:
        """Assert that DeviceMesh's groups are those predicted by the pure rank math."""
        for axis in AXES:
            expected = self.layout.group_of(self.global_rank, axis)
            actual = self.group_ranks(axis)
            if actual != expected:
                raise RuntimeError(
                    f"{axis} group of rank {self.global_rank} is {actual}, layout says {expected}"
                )
            if self.device_mesh.get_local_rank(axis) != self._coords[axis]:
                raise RuntimeError(
                    f"{axis} coordinate of rank {self.global_rank} disagrees with DeviceMesh"
                )

    def __repr__(self) -> str:
        return (
            f"ProcessMesh({self.layout.describe()}, rank={self.global_rank}, coords={self._coords})"
        )


def shutdown(code: int = 0) -> int:
    """Leave the job: destroy the process groups, flush, and end the process *now* (if it
    joined one through :func:`init_distributed`; otherwise just return ``code``).

    torch 2.13 on gloo can abort a finished process at interpreter exit ("terminate called
    without an active exception", SIGABRT) once an all-gather has run on a DeviceMesh
    subgroup — 6 of 16 two-rank runs of a ten-line script (init_device_mesh, one
    all_gather_single on the tp group, destroy_process_group) did. Ending with ``os._exit``
    after the groups are destroyed skips the static destructors where that happens, so a
    run that succeeded reports success. Use it as the last line of a script run by torchrun.
    """
    import os
    import sys

    if not _JOINED:
        return code
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
