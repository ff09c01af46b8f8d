"""Byte-level text corpora: the embedded default and the user's own files.

The default needs no download: it is built at run time from the Python standard
library's own source files on this machine (``sysconfig``'s ``stdlib`` path), read in
sorted path order, so every rank and every run of one machine sees the same bytes.
Tokens are bytes (vocabulary 256).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paracube.data.source import (
    BYTE_VOCABULARY,
    DEFAULT_MAX_BYTES,
    check_length,
    stdlib_files,
    text_files,
)
from paracube.errors import DataError

__all__ = [
    "TokenCorpus",
    "VOCAB_SIZE",
    "build_corpus",
    "read_user_text",
    "stdlib_files",
    "stdlib_text",
]

VOCAB_SIZE = BYTE_VOCABULARY


@dataclass(frozen=True)
class TokenCorpus:
    """Train and validation token streams, each a 1-D uint8 tensor."""

    train: torch.Tensor
    val: torch.Tensor
    source: str

    def describe(self) -> str:
        return (
            f"{self.source}: {self.train.numel():,} train / {self.val.numel():,} validation bytes"
        )


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
        raise DataError(
            "found no Python standard-library sources for the default corpus: pass --data PATH"
        )
    return b"".join(chunks)[:max_bytes]


def read_user_text(path: str) -> bytes:
    """A text file, or every non-binary file under a folder in sorted path order."""
    chunks = []
    for f in text_files(path):
        try:
            chunks.append(f.read_bytes())
        except OSError as e:
            raise DataError(
                f"--data {path}: cannot read {f} ({e.strerror}); fix its permissions or remove it"
            ) from None
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
    check_length(len(tokens), data, seq_len, val_fraction)
    n_val = int(len(tokens) * val_fraction)
    source = "stdlib sources" if data is None else str(data)
    return TokenCorpus(
        train=tokens[: len(tokens) - n_val], val=tokens[len(tokens) - n_val :], source=source
    )
