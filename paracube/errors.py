"""Errors that reach the user as one line and a documented exit status.

A bad configuration must be rejected before any collective, on every rank, with a
message that names the bad value and says how to fix it (docs/ARCHITECTURE.md,
"Conventions"). Exit statuses: 2 a rejected input, 3 training diverged, 1 a rank failed
(a collective timed out, a peer died, an output could not be written), 128 + N a signal.
"""


class ParacubeError(Exception):
    """Base class: the CLI prints ``paracube: error: <message>`` and exits ``exit_code``.

    ``symmetric``: every rank of a job raises it at the same point (it depends only on the
    configuration or on values all ranks share), so rank 0 alone prints it."""

    exit_code = 2
    symmetric = True


class ConfigError(ParacubeError, ValueError):
    """An invalid configuration value (sizes that don't divide, unknown preset ...)."""


class DataError(ParacubeError):
    """Training data that is missing, unreadable, empty or too short."""


class OutputError(ParacubeError):
    """An output path (metrics, picture, calibration) that cannot be written."""


class Diverged(ParacubeError):
    """Training produced a non-finite loss or gradient norm (``--on-nan stop``), or fp16
    overflowed on too many consecutive steps. The values are global, so every rank stops
    at the same step."""

    exit_code = 3


class CollectiveTimeout(ParacubeError):
    """A collective waited longer than the configured timeout, or a peer failed: names the
    rank that noticed, the peer that stopped answering where known, the step and phase."""

    exit_code = 1
    symmetric = False


class WriteFailed(ParacubeError):
    """An output that was checked at start could not be written during the run (a full
    disk, its folder deleted): rank 0 stops the job rather than lose the record."""

    exit_code = 1
    symmetric = False
