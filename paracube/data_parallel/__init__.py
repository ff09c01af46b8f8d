"""Data parallelism: bucketed, overlapped gradient reduction for any module; ZeRO 1/2/3."""

from paracube.data_parallel.buckets import GradBucket, build_buckets
from paracube.data_parallel.ddp import DataParallel
from paracube.data_parallel.hooks import AllReduceHook, GradReduceHook, ReduceScatterHook
from paracube.data_parallel.optimizer import MainParamOptimizer
from paracube.data_parallel.shards import FlatShard
from paracube.data_parallel.zero3 import ShardedDataParallel

__all__ = [
    "AllReduceHook", "DataParallel", "FlatShard", "GradBucket", "GradReduceHook", "MainParamOptimizer",
    "ReduceScatterHook", "ShardedDataParallel", "build_buckets",
]
