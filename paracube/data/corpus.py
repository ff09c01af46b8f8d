"""Training text: byte-level corpora (the embedded default, the user's own files) and
tokenized datasets (:mod:`paracube.data.tokenized`).

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
from paracube.data.tokenized import is_tokenized, load_split, read_index
from paracube.errors import DataError

__all__ = [
    "TokenCorpus",
    "VOCAB_SIZE",
    "build_corpus",
    "read_user_tokens",
    "stdlib_files",
    "stdlib_text",
]

VOCAB_SIZE = BYTE_VOCABULARY


@dataclass(frozen=True)
class TokenCorpus:
    """Train and validation token streams, each a 1-D tensor: uint8 bytes, or the uint16 /
    uint32 ids of a tokenized dataset."""

    train: torch.Tensor
    val: torch.Tensor
    source: str

    def describe(self) -> str:
        unit = "bytes" if self.train.dtype == torch.uint8 else "tokens"
        return (
            f"{self.source}: {self.train.numel():,} train / {self.val.numel():,} validation {unit}"
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


def read_user_tokens(path: str) -> torch.Tensor:
    """A text file, or every text file under a folder in sorted path order, as uint8 tokens.

    A single file is memory-mapped (private, read-only use): its pages are the page
    cache's, shared by every rank on the machine instead of copied into each. A folder's
    files are read once into one buffer."""
    files = text_files(path)
    try:
        if len(files) == 1:
            size = files[0].stat().st_size
            if size == 0:
                return torch.empty(0, dtype=torch.uint8)
            return torch.from_file(str(files[0]), shared=False, size=size, dtype=torch.uint8)
        buffer = bytearray(sum(f.stat().st_size for f in files))
        view, at = memoryview(buffer), 0
        for f in files:
            with f.open("rb") as fh:
                at += fh.readinto(view[at:])
        return (
            torch.frombuffer(buffer, dtype=torch.uint8)[:at]
            if at
            else torch.empty(0, dtype=torch.uint8)
        )
    except OSError as e:
        raise DataError(
            f"--data {path}: cannot read it ({e.strerror}); fix its permissions or remove it"
        ) from None


def build_corpus(
    data: str | None, seq_len: int, val_fraction: float = 0.05, max_bytes: int = DEFAULT_MAX_BYTES
) -> TokenCorpus:
    """Load ``data`` (or the embedded stdlib corpus) and split off the last ``val_fraction``
    — or, for a tokenized dataset folder (:mod:`paracube.data.tokenized`), its two splits.

    Both splits must hold at least one training window of ``seq_len + 1`` tokens.
    """
    if is_tokenized(data):  # a prepared dataset: its own splits, memory-mapped
        index = read_index(data)  # type: ignore[arg-type]
        return TokenCorpus(
            train=load_split(index, "train"),
            val=load_split(index, "val"),
            source=f"{data} (vocabulary {index.vocab_size:,})",
        )
    if data is None:
        tokens = torch.frombuffer(bytearray(stdlib_text(max_bytes)), dtype=torch.uint8)
    else:
        tokens = read_user_tokens(data)
    check_length(len(tokens), data, seq_len, val_fraction)
    n_val = int(len(tokens) * val_fraction)
    source = "stdlib sources" if data is None else str(data)
    return TokenCorpus(
        train=tokens[: len(tokens) - n_val], val=tokens[len(tokens) - n_val :], source=source
    )
