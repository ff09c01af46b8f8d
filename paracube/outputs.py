"""Output files: checked before any work starts, written so that nothing is lost silently.

:func:`check_output` is run by the validator (and by ``paracube schedule`` before it
simulates) and proves, without leaving anything behind, that the file can be created
where asked: the path is not a folder or a device, its folder exists or can be made, and
a probe file of :data:`PROBE_BYTES` can be written and synced there (a read-only or full
file system, ``/proc``, a missing permission all fail here, as one line).

:class:`MetricsWriter` then writes one JSON line per step with the policy of
``--metrics-mode``: ``new`` creates the file exclusively (an existing file is refused up
front, so a previous run's record is never overwritten by accident), ``overwrite``
replaces it, ``append`` adds to it. Each line is written whole and flushed; a failed write
or a file deleted during the run raises :class:`~paracube.errors.WriteFailed` — the run
stops rather than carry on without its record.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from paracube.errors import OutputError, WriteFailed

PROBE_BYTES = 64 * 1024


def check_output(
    path: str,
    flag: str,
    mode: str = "overwrite",
    exists_hint: str = "pass --metrics-mode append (add to it) or overwrite (replace it)",
) -> None:
    """Refuse ``path`` (given as ``flag``) unless a file can be written there under ``mode``
    (new: must not exist; append/overwrite: may exist, as a regular writable file)."""
    if not path.strip():
        raise OutputError(f"{flag} is empty: give a file path")
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{flag} {path} is a folder: give a file path inside it")
    if p.exists() or p.is_symlink():
        if not p.is_file():
            raise OutputError(f"{flag} {path} is not a regular file: give a file path")
        if mode == "new":
            raise OutputError(f"{flag} {path} exists: choose another path, or {exists_hint}")
        if not os.access(p, os.W_OK):
            raise OutputError(f"{flag} {path} is not writable: choose another path")
    _probe(_nearest_existing(p.parent), flag, path)


def _probe(folder: Path, flag: str, path: str) -> None:
    """Write and sync a probe file in ``folder`` (what the run will do), then remove it."""
    if not folder.is_dir():
        raise OutputError(f"{flag} {path}: {folder} is not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".paracube-probe-") as probe:
            probe.write(b"\0" * PROBE_BYTES)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as e:
        raise OutputError(
            f"{flag} {path}: cannot write in {folder} ({e.strerror or e}): choose another path"
        ) from None


def check_folder(path: str, flag: str) -> None:
    """Refuse a folder (given as ``flag``) that cannot be created or written into."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{flag} {path} is not a folder: give a folder path")
    _probe(_nearest_existing(p), flag, path)


def _nearest_existing(folder: Path) -> Path:
    folder = folder if str(folder) else Path(".")
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


class MetricsWriter:
    """Appends step records as JSON lines to ``path`` under ``mode``; a no-op without a path."""

    def __init__(self, path: str | None, mode: str = "new"):
        self.path, self._file = path, None
        if not path:
            return
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(
                path, {"new": "x", "overwrite": "w", "append": "a"}[mode], encoding="utf-8"
            )
        except OSError as e:
            raise WriteFailed(f"--metrics {path}: cannot create it ({e.strerror or e})") from None

    def write_line(self, line: str, step: int) -> None:
        if self._file is None:
            return
        try:
            self._file.write(line + "\n")
            self._file.flush()
            deleted = os.fstat(self._file.fileno()).st_nlink == 0
        except OSError as e:
            raise WriteFailed(
                f"--metrics {self.path}: cannot write step {step} ({e.strerror or e}); stopped "
                "so that the run's record is not lost: free space or choose another path"
            ) from None
        if deleted:
            raise WriteFailed(
                f"--metrics {self.path} was deleted during the run (step {step}); stopped so that "
                "the run's record is not lost"
            )

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass  # the write that failed has already been reported
            self._file = None
