"""Data: embedded byte corpus, user text, and the data-parallel sharded sampler."""

from paracube.data.corpus import VOCAB_SIZE, TokenCorpus, build_corpus
from paracube.data.sampler import ShardedBatchSampler

__all__ = ["VOCAB_SIZE", "TokenCorpus", "build_corpus", "ShardedBatchSampler"]
