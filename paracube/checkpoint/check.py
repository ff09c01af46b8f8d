"""Checking a ``--resume`` checkpoint before any rank starts: it exists, it is complete,
and every tensor of this run's model is in it with the same global shape."""

from __future__ import annotations

from pathlib import Path

from paracube.checkpoint.store import read_meta, resolve
from paracube.config import TrainConfig
from paracube.errors import ConfigError


def check_resume(cfg: TrainConfig) -> Path:
    """The checkpoint ``cfg`` resumes from, or one line naming what is wrong with it."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from paracube.models.gpt import GPT

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
    with torch.device("meta"):  # shapes only: nothing is allocated
        model = GPT(cfg.model)
    for name, p in model.named_parameters():
        md = saved.get(f"model/{name}")
        if not isinstance(md, TensorStorageMetadata):
            raise ConfigError(f"--resume {path}: holds no {name}: a checkpoint of another model")
        if tuple(md.size) != tuple(p.shape):
            raise ConfigError(
                f"--resume {path}: {name} is {tuple(md.size)} in the checkpoint but "
                f"{tuple(p.shape)} in this model (--model {cfg.model.name}): resume with the model it saved"
            )
    if meta["step"] >= cfg.steps:
        raise ConfigError(
            f"--resume {path}: the checkpoint is at step {meta['step']}, which --steps {cfg.steps} "
            "has already reached: raise --steps to train further"
        )
    return path
