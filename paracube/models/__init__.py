"""Models: the parallel-agnostic reference GPT and named presets."""

from paracube.models.presets import PRESETS, parameter_count, preset

__all__ = ["PRESETS", "parameter_count", "preset"]
