"""Data parallelism for your own module, with paracube's process mesh.

    torchrun --standalone --nproc-per-node 2 examples/data_parallel_any_module.py

Each rank trains a small MLP on its own half of every batch; gradients are all-reduced
in buckets during backward; the printed losses equal a single process on the full batch.
"""

import torch
import torch.distributed as dist
from torch import nn

from paracube.config import ParallelConfig
from paracube.data_parallel import DataParallel
from paracube.mesh.mesh import ProcessMesh, init_distributed, shutdown

torch.set_num_threads(1)
device = init_distributed()
mesh = ProcessMesh(ParallelConfig(dp=dist.get_world_size()), device)

torch.manual_seed(0)
model = DataParallel(
    nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 1)),
    mesh.group("dp"),
    mesh.ledger,  # counts every all-reduce: calls, bytes, seconds
    bucket_mb=1.0,
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

g = torch.Generator().manual_seed(1)
for step in range(5):
    x = torch.randn(32, 16, generator=g)  # the global batch, identical on every rank
    y = x.sum(dim=1, keepdim=True)
    shard = slice(16 * mesh.rank("dp"), 16 * (mesh.rank("dp") + 1))  # this rank's half
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x[shard]), y[shard])
    loss.backward()  # buckets are all-reduced (averaged) while backward runs
    optimizer.step()
    dist.all_reduce(loss.detach().div_(mesh.size("dp")))
    if dist.get_rank() == 0:
        print(f"step {step}: loss {loss.item():.5f}")

if dist.get_rank() == 0:
    print("all-reduce:", mesh.ledger.snapshot()["all_reduce/grad"])
shutdown()  # destroy the groups and exit (see its docstring: a torch teardown race)
