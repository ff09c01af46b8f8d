"""Errors that reach the user as one line and exit status 2.

A bad configuration must be rejected before any collective, on every rank, with a
message that names the bad value and says how to fix it (docs/ARCHITECTURE.md, "Conventions").
"""


class ParacubeError(Exception):
    """Base class: the CLI prints ``paracube: error: <message>`` and exits 2."""

    exit_code = 2


class ConfigError(ParacubeError, ValueError):
    """An invalid configuration value (sizes that don't divide, unknown preset ...)."""


class DataError(ParacubeError):
    """Training data that is missing, unreadable, empty or too short."""


class CollectiveTimeout(ParacubeError):
    """A collective waited longer than the configured timeout (names rank and step)."""

    exit_code = 1
