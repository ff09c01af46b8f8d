"""Every rank's random-number generators, saved beside the tensors and restored on resume.

paracube's own GPT draws nothing after initialisation (no dropout; a step's batch is a
pure function of seed and step), but a user's model may (dropout, stochastic depth), and a
resumed run continues exactly only if each rank's generators continue where they stopped.
Each rank writes ``rng/rank-NNNNN.json`` (torch's CPU generator state and, on a GPU, the
current device's, as base64 of their byte tensors — JSON, never a pickle) into the
partial folder before DCP writes the tensors, so the folder is renamed only once every
rank's file is there.

A checkpoint resumed under the same world size and layout gives each rank its own states
back. Under another layout a rank's streams have no counterpart (which old rank's stream
would a new rank continue?): the generators stay as seeded at the start of the run, and
:func:`restore` says so in its return value.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import torch
import torch.distributed as dist

FOLDER = "rng"


def _file(root: Path, rank: int) -> Path:
    return root / FOLDER / f"rank-{rank:05d}.json"


def _encode(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def save(partial: Path) -> None:
    """This rank's generator states into ``partial`` (every rank, before DCP's save)."""
    states = {"cpu": _encode(torch.get_rng_state())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = _encode(torch.cuda.get_rng_state())
    path = _file(partial, dist.get_rank())
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(states))


def restore(path: Path, same_layout: bool) -> bool:
    """This rank's saved generator states, when the checkpoint's layout is this run's;
    returns whether they were restored."""
    file = _file(path, dist.get_rank())
    if not same_layout or not file.is_file():
        return False
    states = json.loads(file.read_text())
    torch.set_rng_state(_decode(states["cpu"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(_decode(states["cuda"]))
    return True
