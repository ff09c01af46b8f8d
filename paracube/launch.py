"""Starting the ranks, and ending the job as one: one line, one exit status, nothing left.

``paracube train --dp 4`` outside torchrun starts 4 local worker processes through
``torch.distributed.launcher.api.elastic_launch`` — the machinery behind ``torchrun
--standalone`` (c10d rendezvous on a free loopback port). With ``--nnodes N
--rdzv-endpoint HOST:PORT`` the same command on each of N machines starts that machine's
share of the ranks and meets the others there (torchrun's multi-node rendezvous), so a
refused job is still one line. Under ``torchrun`` the command runs as one rank of the job
it finds in the environment (torchrun then prints its own summary of a failed job).

How a job ends (exit statuses in :mod:`paracube.errors`):

- a refused configuration: every rank refuses it identically, rank 0 prints the line, the
  ranks return 2 and the job exits 2;
- a rank that fails (a collective timed out, a peer died, training diverged, the record
  could not be written): it prints its line and *ends its process* with the status —
  returning would leave the launcher waiting for the peers it can no longer reach — then
  the launcher stops the others (:data:`SHUTDOWN_GRACE` s, then SIGKILL);
- a signal (Ctrl-C, SIGTERM, SIGHUP) to the launcher: it stops the ranks, prints one line
  and exits 128 + the signal; the ranks themselves exit quietly on it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from paracube.errors import ParacubeError

EXPLAINED_ENV = "PARACUBE_EXPLAINED"  # where a rank that explains the job's end says so
SHUTDOWN_GRACE = 2  # seconds the launcher gives a rank to exit on SIGTERM before SIGKILL
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def inside_torchrun() -> bool:
    """True when a launcher already set this process's rank (torchrun, srun wrappers …)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launched_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


@dataclass(frozen=True)
class Nodes:
    """The machines of a job: ``count`` nodes meeting at ``endpoint`` (HOST:PORT of one of
    them, as torchrun's ``--rdzv-endpoint``); one node: this machine, a free loopback port.
    ``join_timeout_s``: how long a node waits for the others to arrive."""

    count: int = 1
    endpoint: str | None = None
    join_timeout_s: float = 300.0

    def rendezvous(self) -> dict:
        if self.count == 1:
            # as torchrun --standalone: a free port on loopback — a local job needs no other
            return dict(rdzv_endpoint="127.0.0.1:0", run_id=f"paracube-{uuid.uuid4().hex[:8]}")
        return dict(
            rdzv_endpoint=self.endpoint,
            run_id=f"paracube-{self.endpoint}",  # the same on every node
            rdzv_configs={"join_timeout": int(self.join_timeout_s)},
        )


# What every rank imports, imported once by the server the ranks are forked from:
# ``import torch`` is ~1.6 s of CPU and torch._dynamo (which every torch.optim optimizer's
# constructor imports) ~1.3 s more — per rank, when each rank is a fresh interpreter.
RANK_MODULES = ("torch", "torch.distributed", "torch._dynamo", "torch.optim", "paracube.train")


def rank_start_method() -> str:
    """How the ranks start: forked from a rank server that imported :data:`RANK_MODULES`
    once ("forkserver") on a machine without a GPU driver — a one-step 4-rank job 4.8 s
    where torchrun takes 8.5, an 8-rank Hugging Face one 6.8 s against 21.1, on 2 cores
    (benchmarks/bench_startup.py). With an NVIDIA or AMD driver loaded each rank is a
    fresh interpreter ("spawn"): a process forked from one that initialised the driver
    cannot use it, and that no preloaded module does has not been checked on a GPU. Asked
    of the system, not of torch, so that the server starts before this process imports
    torch."""
    drivers = ("/proc/driver/nvidia", "/dev/kfd")
    return "spawn" if any(os.path.exists(p) for p in drivers) else "forkserver"


def start_rank_server(extra: tuple[str, ...] = ()) -> None:
    """Start the process the ranks are forked from (multiprocessing's forkserver; one per
    launching process), which imports :data:`RANK_MODULES` and ``extra`` once. A rank
    starts with the server's environment — this process's when the server started — plus
    the launcher's per-rank variables."""
    import multiprocessing
    import multiprocessing.forkserver

    multiprocessing.set_forkserver_preload(["__main__", *RANK_MODULES, *extra])
    multiprocessing.forkserver.ensure_running()


def launch_local(
    nprocs: int,
    entrypoint: Callable[..., int],
    *args,
    nodes: Nodes = Nodes(),
    max_restarts: int = 0,
    preload: tuple[str, ...] = (),
) -> int:
    """Run ``entrypoint(*args)`` on ``nprocs`` ranks of this machine, one node of ``nodes``;
    return the job's exit status. ``preload``: modules the ranks will import, imported once
    for all of them where they are forked (:func:`rank_start_method`)."""
    start_method = rank_start_method()
    if start_method == "forkserver":  # first: it imports torch while this process does
        start_rank_server(preload)
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    _quiet_torch_elastic()
    logs = tempfile.mkdtemp(prefix="paracube-")  # the agent's per-run files; removed below
    explained = os.path.join(logs, "explained")  # a rank that prints the job's end writes it
    # the grace a stopped group gets before SIGKILL is LaunchConfig's from torch 2.13 (an
    # older torch — a GPU image's — has its own fixed grace)
    known = {f.name for f in fields(LaunchConfig)}
    grace: dict[str, Any] = (
        {"shutdown_timeout": SHUTDOWN_GRACE} if "shutdown_timeout" in known else {}
    )
    config = LaunchConfig(
        min_nodes=nodes.count,
        max_nodes=nodes.count,
        nproc_per_node=nprocs,
        rdzv_backend="c10d",
        **nodes.rendezvous(),
        max_restarts=max_restarts,  # the agent restarts the whole group (train resumes)
        monitor_interval=0.1,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=logs),
        **grace,
    )
    try:
        codes = elastic_launch(config, _ranks_entry)(explained, entrypoint, *args)
    except ChildFailedError as e:
        return _failed(e, explained)
    except SignalException as e:
        return _interrupted(e.sigval, nprocs)
    except KeyboardInterrupt:
        return _interrupted(signal.SIGINT, nprocs)
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    return max((c or 0) for c in codes.values())


def _ranks_entry(explained: str, entrypoint: Callable[..., int], *args) -> int:
    """A rank launched by :func:`launch_local`: told where to say it explains the job's end
    (an argument, not the environment — the rank server's environment is the one it
    started with, for every job this process launches)."""
    os.environ[EXPLAINED_ENV] = explained
    return entrypoint(*args)


def _quiet_torch_elastic() -> None:
    """The agent's own log lines (its warnings on a signal or a failed worker) would come
    before paracube's one line; every elastic logger sets its own level, so set each."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.multiprocessing")):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def _failed(error, explained: str) -> int:
    """The job's status after a rank failed. A rank that printed the line explaining the
    job's end (naming any peer it found dead or stopped) left its status in ``explained``;
    only when none did — every failure a signal from outside — is it said here."""
    try:
        with open(explained) as f:
            return int(f.read())
    except (OSError, ValueError):
        pass
    failures = sorted(error.failures.items(), key=lambda kv: kv[1].timestamp)
    own = [f.exitcode for _, f in failures if 0 < f.exitcode < 128]  # paracube's statuses
    if own:
        return own[0]
    killed = [(r, f) for r, f in failures if f.exitcode < 0]
    if not killed:
        return failures[0][1].exitcode
    rank, failure = killed[0]
    name = signal.Signals(-failure.exitcode).name
    print(
        f"paracube: error: rank {rank} was killed by {name}; the job was stopped",
        file=sys.stderr,
        flush=True,
    )
    return 1


def _interrupted(sig, nprocs: int) -> int:
    sig = signal.Signals(sig)
    print(
        f"paracube: interrupted by {sig.name}: the {nprocs} ranks were stopped",
        file=sys.stderr,
        flush=True,
    )
    return 128 + sig.value


def run_rank(fn: Callable[..., None], *args) -> int:
    """Run one rank's work under the rules of the module docstring: returns 0 or 2; any
    other ending leaves the process with its status."""
    for sig in STOP_SIGNALS:  # the launcher is stopping the job: leave without a traceback
        signal.signal(sig, _exit_quietly)
    try:
        fn(*args)
        return 0
    except ParacubeError as e:
        from paracube.failures import end_stalled_peers, first_to_fail

        lead = os.environ.get("RANK", "0") == "0"
        if (lead and e.symmetric) or (not e.symmetric and first_to_fail()):
            if e.exit_code != 2 or not e.symmetric:
                _say_explained(e.exit_code)
            print(f"paracube: error: {e}", file=sys.stderr, flush=True)
        if e.exit_code == 2 and e.symmetric:  # refused before any collective, on every rank
            return 2
        end_stalled_peers(e)
        _leave(e.exit_code)
    except KeyboardInterrupt:
        _leave(128 + signal.SIGINT)
    except Exception:  # noqa: BLE001 - a bug: its traceback is the report, then the job ends
        import traceback

        from paracube.failures import first_to_fail

        if first_to_fail():
            _say_explained(1)
            traceback.print_exc()
        _leave(1)
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    return 1  # unreachable: _leave does not return


def _say_explained(code: int) -> None:
    """Tell the launcher this rank explains the job's end (written before the line is
    printed, so the launcher never adds a second one)."""
    path = os.environ.get(EXPLAINED_ENV)
    if path:
        try:
            with open(path, "x") as f:
                f.write(str(code))
        except OSError:
            pass  # another rank explained first


def _exit_quietly(signum, frame) -> None:
    _leave(128 + signum)


def _leave(code: int) -> None:
    """End this process now: a failed job's collectives cannot be torn down politely (the
    peers they would wait for are gone or stalled)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
