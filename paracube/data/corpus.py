"""Byte-level text corpora: the embedded default and the user's own files.

The default needs no download: it is built at run time from the Python standard
library's own source files on this machine (``sysconfig``'s ``stdlib`` path), read in
sorted path order, so every rank and every run of one machine sees the same bytes.
Tokens are bytes (vocabulary 256).
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from paracube.errors import DataError

VOCAB_SIZE = 256
DEFAULT_MAX_BYTES = 4 << 20  # 4 MiB of stdlib source is plenty for CPU demos
_SKIP_DIRS = {"site-packages", "test", "tests", "idlelib", "__pycache__", "lib2to3"}


@dataclass(frozen=True)
class TokenCorpus:
    """Train and validation token streams, each a 1-D uint8 tensor."""

    train: torch.Tensor
    val: torch.Tensor
    source: str

    def describe(self) -> str:
        return f"{self.source}: {self.train.numel():,} train / {self.val.numel():,} validation bytes"


def stdlib_files(root: str | None = None) -> list[Path]:
    """The standard library's ``.py`` files in sorted order (tests and vendored packages skipped)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        found.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return sorted(found)


def stdlib_text(max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The first ``max_bytes`` of the concatenated standard-library sources."""
    chunks, total = [], 0
    for path in stdlib_files():
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    if not chunks:
        raise DataError("found no Python standard-library sources for the default corpus: pass --data PATH")
    return b"".join(chunks)[:max_bytes]


def read_user_text(path: str) -> bytes:
    """A text file, or every non-binary file under a folder in sorted path order."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"--data {path}: no such file or folder; give an existing text file or folder")
    if not (p.is_file() or p.is_dir()):
        raise DataError(f"--data {path}: not a regular file or folder; give a text file or folder")
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    if not files:
        raise DataError(f"--data {path}: the folder holds no files; add text files or point at one")
    chunks = []
    for f in files:
        try:
            data = f.read_bytes()
        except OSError as e:
            raise DataError(f"--data {path}: cannot read {f} ({e.strerror}); fix its permissions or remove it") from None
        if b"\0" in data[:8192]:
            if p.is_file():
                raise DataError(f"--data {path}: looks binary (NUL bytes), not text; give a text file")
            continue  # a binary file inside a folder is skipped, not trained on
        chunks.append(data)
    text = b"".join(chunks)
    if not text:
        raise DataError(f"--data {path}: no text in it (empty); give a non-empty text file")
    return text


def build_corpus(
    data: str | None, seq_len: int, val_fraction: float = 0.05, max_bytes: int = DEFAULT_MAX_BYTES
) -> TokenCorpus:
    """Load ``data`` (or the embedded stdlib corpus) and split off the last ``val_fraction``.

    Both splits must hold at least one training window of ``seq_len + 1`` bytes.
    """
    text = stdlib_text(max_bytes) if data is None else read_user_text(data)
    tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    n_val = int(len(tokens) * val_fraction)
    need = seq_len + 1
    if n_val < need or len(tokens) - n_val < need:
        raise DataError(
            f"{data or 'default corpus'}: {len(tokens):,} bytes is too short for sequence length {seq_len} "
            f"(each split needs ≥ {need} bytes after a {val_fraction:.0%} validation split); "
            "use more text or a shorter --seq-len"
        )
    source = "stdlib sources" if data is None else str(data)
    return TokenCorpus(train=tokens[: len(tokens) - n_val], val=tokens[len(tokens) - n_val :], source=source)
