"""Consolidated weights in and out: ``paracube export`` and ``--init-from``.

Export reads a checkpoint in one process — DCP reshards every saved piece into one
full-size tensor per serial name — and writes the fp32 weights as safetensors, with the
model config as JSON in the file's metadata, so that the plain
:class:`paracube.models.gpt.GPT` loads them (:func:`load_into`). ``--init-from`` starts a
parallel run from such a file: each rank copies its own rectangles (the same pieces a
checkpoint load fills) from the full tensors and leaves the optimizer fresh. Nothing is
unpickled: safetensors holds only tensors and strings.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from paracube.checkpoint.store import read_meta
from paracube.config import ModelConfig, TrainConfig
from paracube.errors import ConfigError

MODEL_KEY = "paracube.model"  # the model config, JSON, in the safetensors metadata


def export(checkpoint: Path, out: str) -> tuple[ModelConfig, int]:
    """Write ``checkpoint``'s weights to ``out`` (safetensors); returns (model, step)."""
    from safetensors.torch import save_file

    meta, tensors = consolidated(checkpoint)
    save_file(
        tensors, out, metadata={MODEL_KEY: json.dumps(meta["model"]), "step": str(meta["step"])}
    )
    return ModelConfig(**meta["model"]), meta["step"]


def export_hf(checkpoint: Path, out: str) -> tuple[ModelConfig, int]:
    """Write a checkpoint as a folder ``from_pretrained`` loads: its config.json and
    model.safetensors, in HF's layout. A Hugging Face model's: its own config, GPT-2's
    Conv1D weights (in, out) again, a tied head once, as the embedding. paracube's GPT's:
    the Hugging Face architecture of its shape, Llama, Qwen3 or GPT-2
    (:func:`paracube.models.hf_convert.hf_family`; refused in one line for another shape),
    its weights unfused and in HF's rotary order."""
    from safetensors.torch import save_file

    data = read_meta(checkpoint).get("hf_config")
    if data is None:
        from paracube.models.hf_convert import hf_config_of, hf_family, hf_weights

        fields = read_meta(checkpoint).get("model")
        if fields is None:
            raise ConfigError(f"{checkpoint}: its paracube.json names no model: not a checkpoint")
        model = ModelConfig(**fields)
        try:
            hf_family(model)
        except ConfigError as e:
            raise ConfigError(f"--out {out} is a folder, for a Hugging Face model: {e}") from None
        meta, tensors = consolidated(checkpoint)
        data, tensors = hf_config_of(model), hf_weights(tensors, model)
    else:
        from paracube.models.hf import conv1d_weight_names

        meta, tensors = consolidated(checkpoint)
        transposed = conv1d_weight_names(data)
        tensors = {k: (t.t() if k in transposed else t).contiguous() for k, t in tensors.items()}
    Path(out).mkdir(parents=True)
    with open(Path(out) / "config.json", "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    save_file(tensors, str(Path(out) / "model.safetensors"), metadata={"format": "pt"})
    return ModelConfig(**meta["model"]), meta["step"]


def consolidated(checkpoint: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The checkpoint's facts and its full fp32 weights by serial name (one process: DCP
    reshards every saved piece into one tensor per name)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = read_meta(checkpoint)
    reader = FileSystemReader(str(checkpoint))
    saved = reader.read_metadata().state_dict_metadata
    state = {
        key: torch.empty(tuple(md.size), dtype=md.properties.dtype)
        for key, md in saved.items()
        if key.startswith("model/") and isinstance(md, TensorStorageMetadata)
    }
    with warnings.catch_warnings():  # "no process group: a single process" — yes
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=reader, no_dist=True)
    return meta, {key.removeprefix("model/"): t.contiguous() for key, t in state.items()}


def read_exported(path: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """The model config and the full tensors of an exported file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, safe_open

    try:
        with safe_open(path, framework="pt") as f:
            header = f.metadata() or {}
        tensors = load_file(path)
    except (OSError, SafetensorError) as e:
        raise ConfigError(f"--init-from {path}: not a safetensors file ({e})") from None
    if MODEL_KEY not in header:
        raise ConfigError(
            f"--init-from {path}: no paracube model config in it (export it with paracube export)"
        )
    return ModelConfig(**json.loads(header[MODEL_KEY])), tensors


def _header(path: str) -> tuple[dict[str, str], dict[str, tuple[int, ...]]]:
    """An export's metadata and its tensors' shapes, from the file's header (no tensor is
    loaded); refused if it is not one."""
    from safetensors import SafetensorError, safe_open

    where = f"--init-from {path}"
    if not Path(path).is_file():
        raise ConfigError(f"{where}: no such file")
    try:
        with safe_open(path, framework="pt") as f:
            header = f.metadata() or {}
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (OSError, SafetensorError) as e:
        raise ConfigError(f"{where}: not a safetensors file ({e})") from None
    if MODEL_KEY not in header:
        raise ConfigError(
            f"{where}: no paracube model config in it (write it with paracube export or "
            "paracube import)"
        )
    return header, shapes


def exported_model(path: str) -> ModelConfig:
    """The model an export (or an import) holds — ``paracube train --init-from FILE``'s
    model where ``--model`` is not given."""
    return ModelConfig(**json.loads(_header(path)[0][MODEL_KEY]))


def check_init_from(path: str, cfg: TrainConfig) -> None:
    """Before any rank starts: ``path`` is an export whose every tensor fits ``cfg``'s
    model (read from the file's header: no tensor is loaded)."""
    from paracube.checkpoint.check import check_shapes

    shapes = _header(path)[1]
    hint = "start from weights of this model"
    check_shapes(shapes, cfg, f"--init-from {path}", "there", hint, "weights")


def load_into(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Load exported weights into a serial GPT (a tied head takes the embedding's)."""
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    cfg = getattr(model, "cfg", None)
    tied = {"head.weight"} if getattr(cfg, "tie_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ConfigError(
            f"weights do not fit the model: missing {missing}, unexpected {unexpected}"
        )


@torch.no_grad()
def init_from(trainer, tensors: dict[str, torch.Tensor]) -> None:
    """Start ``trainer`` from full weights: every rank copies its rectangles, then the
    model's compute-dtype copy (and ZeRO-1/2's full parameters) is rebuilt."""
    from paracube.checkpoint.state import trainer_pieces

    for piece in trainer_pieces(trainer):
        if not piece.key.startswith("model/"):
            continue
        full = tensors[piece.key.removeprefix("model/")]
        region = full[tuple(slice(o, o + n) for o, n in zip(piece.offsets, piece.tensor.shape))]
        piece.tensor.copy_(region)
    trainer.optimizer.publish()
