"""paracube: distributed deep-learning training on PyTorch.

Importing the package is cheap (no torch import); the engine modules import torch.
"""

from paracube.config import ModelConfig, ParallelConfig, TrainConfig
from paracube.errors import ConfigError, DataError, ParacubeError

__all__ = [
    "ModelConfig",
    "ParallelConfig",
    "TrainConfig",
    "ConfigError",
    "DataError",
    "ParacubeError",
]
__version__ = "0.1.0"
