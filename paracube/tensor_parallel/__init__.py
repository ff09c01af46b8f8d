"""Tensor parallelism (Megatron-style) with optional sequence parallelism."""

from paracube.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from paracube.tensor_parallel.loss import vocab_parallel_cross_entropy
from paracube.tensor_parallel.plan import (
    TPContext,
    apply_plan,
    full_parameters,
    full_tensor,
    gpt_plan,
    parallelize_gpt,
    sequence_parallel_params,
    sync_sequence_parallel_grads,
)

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "TPContext",
    "apply_plan",
    "full_parameters",
    "full_tensor",
    "gpt_plan",
    "parallelize_gpt",
    "sequence_parallel_params",
    "sync_sequence_parallel_grads",
    "vocab_parallel_cross_entropy",
]
