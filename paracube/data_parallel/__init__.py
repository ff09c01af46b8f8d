"""Data parallelism: bucketed, overlapped gradient reduction for any module; ZeRO 1/2/3.

All wrappers are :class:`FlatDataParallel` s over :class:`FlatUnit` s with an injected
reducer (see :mod:`paracube.data_parallel.base` for the contract).
"""

from paracube.data_parallel.base import FlatDataParallel
from paracube.data_parallel.buckets import build_buckets
from paracube.data_parallel.ddp import DataParallel
from paracube.data_parallel.flat import FlatUnit
from paracube.data_parallel.optimizer import MainParamOptimizer
from paracube.data_parallel.reducers import AllReduce, Reducer, ReduceScatter
from paracube.data_parallel.shards import FlatShard, Segment
from paracube.data_parallel.zero3 import ShardedDataParallel

__all__ = [
    "AllReduce",
    "DataParallel",
    "FlatDataParallel",
    "FlatShard",
    "FlatUnit",
    "MainParamOptimizer",
    "ReduceScatter",
    "Reducer",
    "Segment",
    "ShardedDataParallel",
    "build_buckets",
]
