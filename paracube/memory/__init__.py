"""Memory accounting: activation bytes saved for backward (counted) and model states."""

from paracube.memory.activations import ActivationCounter, note_saved

__all__ = ["ActivationCounter", "note_saved"]
