"""Checking a ``--resume`` checkpoint before any rank starts: it exists, it is complete,
and every tensor of this run's model is in it with the same global shape."""

from __future__ import annotations

from pathlib import Path

from paracube.checkpoint.store import read_meta, resolve
from paracube.config import TrainConfig
from paracube.errors import ConfigError


def check_resume(cfg: TrainConfig) -> Path:
    """The checkpoint ``cfg`` resumes from, or one line naming what is wrong with it."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    ck = cfg.checkpoint
    assert ck.resume is not None
    path = resolve(ck.resume, ck.save_dir)
    meta = read_meta(path)
    try:
        saved = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except Exception as e:  # noqa: BLE001 - a damaged metadata file fails in many ways
        raise ConfigError(
            f"--resume {path}: its tensor metadata is unreadable ({type(e).__name__})"
        ) from None
    shapes = {
        key.removeprefix("model/"): tuple(md.size)
        for key, md in saved.items()
        if key.startswith("model/") and isinstance(md, TensorStorageMetadata)
    }
    hint = "resume with the model it saved"
    check_shapes(shapes, cfg, f"--resume {path}", "in the checkpoint", hint, "a checkpoint")
    if meta["step"] >= cfg.steps:
        raise ConfigError(
            f"--resume {path}: the checkpoint is at step {meta['step']}, which --steps {cfg.steps} "
            "has already reached: raise --steps to train further"
        )
    return path


def check_shapes(
    shapes: dict, cfg: TrainConfig, where: str, place: str, hint: str, what: str
) -> None:
    """Every parameter of ``cfg``'s model is in ``shapes`` (name → global shape) with its
    shape, or one line naming the first that is not and both shapes."""
    from paracube.models.spec import serial_shapes

    for name, shape in serial_shapes(cfg).items():
        if name not in shapes:
            raise ConfigError(f"{where}: holds no {name}: {what} of another model")
        if shapes[name] != shape:
            raise ConfigError(
                f"{where}: {name} is {shapes[name]} {place} but {shape} in this model "
                f"(--model {cfg.model.name}): {hint}"
            )
