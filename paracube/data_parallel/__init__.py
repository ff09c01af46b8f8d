"""Data parallelism: bucketed, overlapped gradient all-reduce for any module."""

from paracube.data_parallel.buckets import GradBucket, build_buckets
from paracube.data_parallel.ddp import DataParallel
from paracube.data_parallel.hooks import AllReduceHook, GradReduceHook

__all__ = ["AllReduceHook", "DataParallel", "GradBucket", "GradReduceHook", "build_buckets"]
