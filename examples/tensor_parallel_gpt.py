"""Tensor parallelism (with sequence parallelism) for the reference GPT.

    torchrun --standalone --nproc-per-node 2 examples/tensor_parallel_gpt.py

Every rank builds the full model from the seed; the plan keeps each rank's shards. The
loss is computed from vocabulary-sharded logits and equals the serial model's.
"""

import torch
import torch.distributed as dist

from paracube.config import ParallelConfig
from paracube.mesh.mesh import ProcessMesh, init_distributed, shutdown
from paracube.models.gpt import GPT, lm_loss
from paracube.models.presets import preset
from paracube.tensor_parallel import (
    TPContext,
    full_parameters,
    parallelize_gpt,
    vocab_parallel_cross_entropy,
)

torch.set_num_threads(1)
device = init_distributed()
mesh = ProcessMesh(ParallelConfig(tp=dist.get_world_size()), device)
tp = mesh.group("tp")

torch.manual_seed(0)
serial = GPT(preset("nano"))  # the reference, kept whole for comparison
torch.manual_seed(0)
model = parallelize_gpt(GPT(preset("nano")), TPContext(tp, mesh.ledger, sequence_parallel=True))

tokens = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(1))
logits = model(tokens)  # (B, T, V/tp)
loss = vocab_parallel_cross_entropy(logits, tokens.roll(-1, dims=1), tp)
loss.backward()
want = lm_loss(serial(tokens), tokens.roll(-1, dims=1))

full = full_parameters(model, tp)  # shards reassembled, named like the serial model
if dist.get_rank() == 0:
    print(f"logits shard {tuple(logits.shape)}; loss {loss.item():.6f} (serial {want.item():.6f})")
    print(
        f"{len(full)} parameters reassembled; qkv_proj shard {tuple(model.blocks[0].attn.qkv_proj.weight.shape)}"
        f" of {tuple(full['blocks.0.attn.qkv_proj.weight'].shape)}"
    )
    print("collectives:", {k: v["calls"] for k, v in mesh.ledger.snapshot().items()})
shutdown()  # destroy the groups and exit (see its docstring: a torch teardown race)
