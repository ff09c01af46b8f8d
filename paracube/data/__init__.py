"""Data: embedded byte corpus, user text, and the data-parallel sharded sampler.

The names below are loaded on first use: the command line reads a tokenized set's index
(:mod:`paracube.data.tokenized`) while checking a job, before anything imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paracube.data.corpus import VOCAB_SIZE, TokenCorpus, build_corpus
    from paracube.data.sampler import ShardedBatchSampler

__all__ = ["VOCAB_SIZE", "TokenCorpus", "build_corpus", "ShardedBatchSampler"]
_HOMES = {
    "VOCAB_SIZE": "corpus",
    "TokenCorpus": "corpus",
    "build_corpus": "corpus",
    "ShardedBatchSampler": "sampler",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'paracube.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"paracube.data.{_HOMES[name]}"), name)
