"""ZeRO-3 for your own module: parameters, gradients and Adam states sharded over the ranks.

    torchrun --standalone --nproc-per-node 2 examples/zero3_any_module.py

The model is cut into units (here: each residual block); a unit's parameters are
all-gathered just before its forward and backward and freed right after. Each rank keeps
1/dp of every unit. The printed losses equal a plain single-process run (also printed).
"""

import copy

import torch
import torch.distributed as dist
from torch import nn

from paracube.config import ParallelConfig
from paracube.data_parallel import MainParamOptimizer, ShardedDataParallel
from paracube.mesh.mesh import ProcessMesh, init_distributed, shutdown


class Residual(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x):  # (B, width) -> (B, width)
        return x + torch.tanh(self.fc(self.norm(x)))


torch.set_num_threads(1)
device = init_distributed()
mesh = ProcessMesh(ParallelConfig(dp=dist.get_world_size()), device)

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 64), *[Residual(64) for _ in range(4)], nn.Linear(64, 1))
serial = copy.deepcopy(net)  # the reference: the whole batch in one process
units = [
    m for m in net if isinstance(m, Residual)
]  # gathered one at a time; the rest is the root unit
model = ShardedDataParallel(net, units, mesh.group("dp"), mesh.ledger)
optimizer = MainParamOptimizer(  # any torch optimizer, over this rank's shards
    model.shards(),
    lambda groups: torch.optim.AdamW([p for ps in groups.values() for p in ps], lr=1e-2),
)
serial_opt = torch.optim.AdamW(serial.parameters(), lr=1e-2)

g = torch.Generator().manual_seed(1)
dp, rank = mesh.size("dp"), mesh.rank("dp")
for step in range(5):
    x = torch.randn(32, 16, generator=g)  # the global batch, identical on every rank
    y = x.sum(dim=1, keepdim=True)
    shard = slice(32 // dp * rank, 32 // dp * (rank + 1))  # this rank's part
    model.zero_grad()
    loss = nn.functional.mse_loss(model(x[shard]), y[shard])  # this rank's mean, as with DDP
    loss.backward()  # each unit's gradients are reduce-scattered (averaged) as its backward ends
    optimizer.clip_grad_norm_(1.0, mesh.group("dp"))  # the whole model's norm, from the slices
    optimizer.step()  # steps this rank's slices; the next forward gathers the new values
    dist.all_reduce(loss.detach())
    loss /= dp

    serial_opt.zero_grad()
    want = nn.functional.mse_loss(serial(x), y)
    want.backward()
    torch.nn.utils.clip_grad_norm_(serial.parameters(), 1.0)
    serial_opt.step()
    if dist.get_rank() == 0:
        print(f"step {step}: loss {loss.item():.6f} (serial {want.item():.6f})")

if dist.get_rank() == 0:
    snap = mesh.ledger.snapshot()
    print("all-gather:", snap["all_gather/param"], "reduce-scatter:", snap["reduce_scatter/grad"])
    print(
        f"parameter bytes held per rank: {model.memory_bytes()['weights']} "
        f"of {sum(p.numel() * 4 for p in serial.parameters())}"
    )
shutdown()  # destroy the groups and exit (see its docstring: a torch teardown race)
