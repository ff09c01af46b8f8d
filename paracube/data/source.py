"""Where training text comes from, checked without reading it: the embedded default (the
Python standard library's own sources) or the user's ``--data`` file or folder.

Torch-free and cheap — a stat per file and an 8 KiB sniff for binaries — so the launcher
can refuse a bad ``--data`` before any process starts (:func:`paracube.validate.validate`);
:mod:`paracube.data.corpus` then reads the bytes in each rank.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

from paracube.errors import DataError

BYTE_VOCABULARY = 256  # tokens are bytes
DEFAULT_MAX_BYTES = 4 << 20  # 4 MiB of stdlib source is plenty for CPU demos
SNIFF_BYTES = 8192  # a NUL byte in the first 8 KiB marks a binary file
_SKIP_DIRS = {"site-packages", "test", "tests", "idlelib", "__pycache__", "lib2to3"}


def stdlib_files(root: str | None = None) -> list[Path]:
    """The standard library's ``.py`` files in sorted order (tests and vendored packages skipped)."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        found.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return sorted(found)


def _kind(head: bytes) -> str:
    """ "text", "utf-16" (a byte-order mark, or NULs in every other byte) or "binary"."""
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return "utf-16"
    if b"\0" not in head:
        return "text"
    # UTF-16 of mostly ASCII text: one byte of each pair is NUL, the other is not.
    even, odd = head[0::2].count(0) / len(head[0::2]), head[1::2].count(0) / max(1, len(head[1::2]))
    if len(head) >= 4 and ((even > 0.9 and odd < 0.1) or (odd > 0.9 and even < 0.1)):
        return "utf-16"
    return "binary"


def text_files(path: str) -> list[Path]:
    """The text file ``path``, or every non-binary file under the folder ``path`` (sorted)."""
    if not path.strip():
        raise DataError(
            "--data is empty: give a text file or folder (or leave --data out for the embedded corpus)"
        )
    p = Path(path)
    if not p.exists():
        raise DataError(
            f"--data {path}: no such file or folder; give an existing text file or folder"
        )
    if not (p.is_file() or p.is_dir()):
        raise DataError(f"--data {path}: not a regular file or folder; give a text file or folder")
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    if not files:
        raise DataError(f"--data {path}: the folder holds no files; add text files or point at one")
    text, skipped = [], {"binary": 0, "utf-16": 0}
    for f in files:
        try:
            with f.open("rb") as fh:
                head = fh.read(SNIFF_BYTES)
        except OSError as e:
            raise DataError(
                f"--data {path}: cannot read {f} ({e.strerror}); fix its permissions or remove it"
            ) from None
        kind = _kind(head)
        if kind == "text":
            text.append(f)
        elif p.is_file():
            raise DataError(f"--data {path}: {_NOT_TEXT[kind]}")
        else:
            skipped[kind] += 1  # a non-text file inside a folder is skipped, not trained on
    if not text:
        counts = ", ".join(f"{n} {kind}" for kind, n in skipped.items() if n)
        raise DataError(
            f"--data {path}: the folder holds no text files ({counts} skipped); add UTF-8 text files"
        )
    return text


_NOT_TEXT = {
    "binary": "looks binary (NUL bytes), not text; give a text file",
    "utf-16": "is UTF-16 text; convert it to UTF-8 (iconv -f UTF-16 -t UTF-8) — tokens are UTF-8 bytes",
}


def check_length(n_bytes: int, data: str | None, seq_len: int, val_fraction: float) -> None:
    """Both splits must hold at least one training window of ``seq_len + 1`` bytes."""
    n_val = int(n_bytes * val_fraction)
    need = seq_len + 1
    if n_bytes == 0 and data is not None:
        raise DataError(f"--data {data}: no text in it (empty); give a non-empty text file")
    if n_val < need or n_bytes - n_val < need:
        raise DataError(
            f"{data or 'default corpus'}: {n_bytes:,} bytes is too short for sequence length {seq_len} "
            f"(each split needs ≥ {need} bytes after a {val_fraction:.0%} validation split); "
            "use more text or a shorter --seq-len"
        )


def check_source(
    data: str | None, seq_len: int, val_fraction: float, max_bytes: int = DEFAULT_MAX_BYTES
) -> None:
    """Refuse a missing, unreadable, binary, empty or too short source, from file sizes
    (a tokenized dataset: from its index and file sizes)."""
    from paracube.data.tokenized import check_tokenized, is_tokenized

    if is_tokenized(data):
        check_tokenized(data, seq_len, None)  # type: ignore[arg-type]
        return
    if data is None:
        files = stdlib_files()
        if not files:
            raise DataError(
                "found no Python standard-library sources for the default corpus: pass --data PATH"
            )
        total = 0
        for f in files:
            total += f.stat().st_size
            if total >= max_bytes:
                break
        check_length(min(total, max_bytes), None, seq_len, val_fraction)
        return
    check_length(sum(f.stat().st_size for f in text_files(data)), data, seq_len, val_fraction)
