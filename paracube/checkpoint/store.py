"""Checkpoint folders: written atomically, found by step, loaded under any layout.

A checkpoint of step N is the folder ``step-0000000N`` in the save directory: a
torch.distributed.checkpoint (DCP) directory that every rank wrote its own pieces into in
parallel, plus ``paracube.json`` (the facts of :mod:`paracube.checkpoint.state`, the model
config, the layout, versions, time), and every rank's random-number generator states
(:mod:`paracube.checkpoint.rng`). It is written as ``.step-0000000N.partial`` and
renamed by rank 0 only after every rank has finished and the JSON is on disk, so a crash
mid-save leaves the previous checkpoint intact and the partial one ignored (and removed
by the next save of that step).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from paracube.checkpoint import rng
from paracube.checkpoint.planners import PieceLoadPlanner, PieceSavePlanner
from paracube.checkpoint.state import restore_facts, trainer_facts, trainer_pieces
from paracube.errors import ConfigError

META = "paracube.json"
PREFIX = "step-"


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{PREFIX}{step:08d}"


def complete_checkpoints(root: str | Path) -> list[Path]:
    """The complete checkpoints under ``root``, oldest first (partial ones are skipped)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / META).is_file()]
    return sorted(found, key=lambda p: p.name)


def save(trainer, root: str | Path, keep_last: int | None = None) -> Path:
    """Every rank writes its pieces of the trainer's state; returns the checkpoint folder."""
    partial, final = _begin(trainer, root)
    rng.save(partial)
    try:
        dcp.save({}, checkpoint_id=str(partial), planner=PieceSavePlanner(trainer_pieces(trainer)))
    except CheckpointException as e:  # a peer failed mid-save: a collective failure, as any
        raise RuntimeError(_first_failure(e)) from None
    _commit(partial, final, _meta(trainer), root, keep_last)
    dist.barrier()
    return final


class AsyncSaver:
    """``--async-save``: the state is copied (this rank's owned pieces, in memory), then
    written by DCP's background thread over a process group of its own while training
    goes on; one checkpoint is in flight at a time, committed (JSON, rename) when the
    next save or the end of the run waits for it."""

    def __init__(self) -> None:
        self.group = dist.new_group(backend="gloo")  # the writer's collectives, off the step's
        self.pending: tuple | None = None

    def save(self, trainer, root: str | Path, keep_last: int | None = None) -> Path:
        self.wait()
        partial, final = _begin(trainer, root)
        rng.save(partial)
        staged = [
            dataclasses.replace(p, tensor=p.tensor.clone())
            for p in trainer_pieces(trainer)
            if p.owner
        ]
        future = dcp.async_save(
            {},
            checkpoint_id=str(partial),
            planner=PieceSavePlanner(staged),
            process_group=self.group,
        )
        self.pending = (future, partial, final, _meta(trainer), root, keep_last)
        return final

    def wait(self) -> None:
        """Finish the checkpoint in flight (every rank calls it at the same point)."""
        if self.pending is None:
            return
        future, partial, final, meta, root, keep_last = self.pending
        self.pending = None
        try:
            future.result()
        except CheckpointException as e:
            raise RuntimeError(_first_failure(e)) from None
        _commit(partial, final, meta, root, keep_last)
        dist.barrier(group=self.group)


def _begin(trainer, root: str | Path) -> tuple[Path, Path]:
    """An empty ``.step-N.partial`` folder, made by rank 0, seen by every rank."""
    final = step_dir(root, trainer.step)
    partial = final.with_name(f".{final.name}.partial")
    if dist.get_rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dist.barrier()
    return partial, final


def _meta(trainer) -> dict:
    source = trainer.cfg.model_source
    hf = {}
    if source is not None and source.startswith("hf:"):  # for an export to a HF folder
        from paracube.models.sources import read_hf_config

        hf = {"hf_config": read_hf_config(source[3:])}
    return {
        **trainer_facts(trainer),
        **hf,
        "model_source": source,
        "model": dataclasses.asdict(trainer.cfg.model),
        "layout": dataclasses.asdict(trainer.cfg.parallel),
        "zero": trainer.cfg.zero,
        "precision": trainer.cfg.precision,
        "world_size": dist.get_world_size(),
        "versions": {"paracube": _version(), "torch": torch.__version__},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _commit(partial: Path, final: Path, meta: dict, root, keep_last: int | None) -> None:
    """Rank 0, after every rank has written: the JSON, the rename, the pruning."""
    if dist.get_rank() != 0:
        return
    (partial / META).write_text(json.dumps(meta, indent=1, sort_keys=True))
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)
    if keep_last:
        for old in complete_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def resolve(resume: str, save_dir: str | None, flag: str = "--resume") -> Path:
    """The checkpoint ``--resume`` names: a folder, or ``auto`` (the newest complete one
    in ``save_dir``); one line naming what is wrong otherwise."""
    if resume == "auto":
        if not save_dir:
            raise ConfigError(
                "--resume auto needs --save-dir: it takes the newest checkpoint there"
            )
        found = complete_checkpoints(save_dir)
        if not found:
            raise ConfigError(f"--resume auto: no complete checkpoint in {save_dir}")
        return found[-1]
    path = Path(resume)
    if not path.exists():
        raise ConfigError(f"{flag} {resume}: no such folder")
    if not path.is_dir():
        raise ConfigError(f"{flag} {resume}: not a checkpoint folder")
    if not (path / META).is_file():
        inside = complete_checkpoints(path)
        if inside:
            return inside[-1]
        why = (
            "a partial checkpoint (never completed)"
            if path.name.endswith(".partial")
            else "no checkpoint"
        )
        raise ConfigError(f"{flag} {resume}: {why}: no {META} in it")
    return path


def read_meta(path: Path) -> dict:
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--resume {path}: its {META} is unreadable ({e})") from None
    if not isinstance(meta, dict) or "step" not in meta:
        raise ConfigError(f"--resume {path}: its {META} holds no step")
    return meta


def load(trainer, path: str | Path) -> dict:
    """Load ``path`` into the trainer (any layout), in place; returns its metadata."""
    path = Path(path)
    meta = read_meta(path)
    trainer.optimizer.init_state()
    planner = PieceLoadPlanner(trainer_pieces(trainer), f"--resume {path}")
    try:
        dcp.load({}, checkpoint_id=str(path), planner=planner)
    except CheckpointException as e:  # every rank gets every rank's failure: all say the same
        cause = _cause(e)
        if isinstance(cause, ConfigError):
            raise ConfigError(str(cause)) from None
        raise ConfigError(
            f"--resume {path}: unreadable checkpoint ({_first_line(cause)})"
        ) from None
    restore_facts(trainer, meta)
    layout = {axis: meta["layout"].get(axis) for axis in ("dp", "tp", "pp")}
    same = meta.get("world_size") == dist.get_world_size() and layout == {
        axis: getattr(trainer.cfg.parallel, axis) for axis in ("dp", "tp", "pp")
    }
    meta["rng_restored"] = rng.restore(path, same)
    trainer.optimizer.publish()  # the main values into the model (and ZeRO-1/2's full copy)
    return meta


def _cause(e: CheckpointException) -> BaseException:
    """The lowest rank's exception (DCP gives every rank every rank's)."""
    first = next(iter(sorted(e.failures.items())))[1]
    return first[0] if isinstance(first, tuple) else first


def _first_failure(e: CheckpointException) -> str:
    return _first_line(_cause(e))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[-1][:200] if text else type(e).__name__


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("paracube")
    except PackageNotFoundError:
        return "unknown"
