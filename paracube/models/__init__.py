"""Models: the parallel-agnostic reference GPT, its arithmetic, and named presets."""

from paracube.models.presets import PRESETS, preset
from paracube.models.shapes import parameter_count

__all__ = ["PRESETS", "parameter_count", "preset"]
