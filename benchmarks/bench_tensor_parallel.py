"""paracube tensor parallel vs PyTorch DTensor TP and megatron-core layers, side by side.

2 ranks × 1 thread, tp=2, GPT preset ``small`` (4 layers, hidden 256, 8 heads, seq 128,
vocabulary 256), 8 sequences per step, AdamW (fused), gradient clipping at 1.0.
Each library shards the same model its own canonical way:

- paracube: its engine step (``Trainer.train_step``) with the declarative GPT plan —
  heads split across ranks, MLP column → row, vocabulary-parallel embedding, head and loss;
- torch DTensor: ``parallelize_module`` with ColwiseParallel / RowwiseParallel on the same
  linears, RowwiseParallel embedding, ColwiseParallel head under ``loss_parallel`` (the
  torchtitan recipe);
- megatron-core 0.16 (if installed): ColumnParallelLinear / RowParallelLinear /
  VocabParallelEmbedding / vocab_parallel_cross_entropy, with the fused QKV projection of
  Megatron's own GPT (one input copy per attention, as Megatron intends the layers used).

    python benchmarks/bench_tensor_parallel.py --out benchmarks/results/tensor_parallel.json
"""

from __future__ import annotations

import math
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from common import interleaved, parse_and_spawn, print_table, ratio_rows, write_json
from paracube.config import ParallelConfig, TrainConfig
from paracube.data.corpus import build_corpus
from paracube.engine import Trainer, make_adamw
from paracube.mesh.mesh import ProcessMesh
from paracube.models.gpt import GPT, apply_rotary, make_norm, rotary_tables
from paracube.models.presets import preset


def batches(trainer: Trainer):
    step = 0
    while True:
        yield trainer.batches.micro_batch(step, 0)
        step += 1


def adamw_for(params: list, cfg: TrainConfig):
    return make_adamw([p for p in params if p.dim() >= 2], [p for p in params if p.dim() < 2], cfg)


# -- torch DTensor tensor parallel ----------------------------------------------------------


class SeparateQKVAttention(nn.Module):
    """The same attention with separate q/k/v projections, as torchtitan's Llama writes it,
    so that ColwiseParallel splits each by heads; rotary positions and grouped key/value
    heads where the model has them."""

    def __init__(self, cfg):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.gqa = cfg.n_kv_heads != cfg.n_heads
        self.q_proj = nn.Linear(cfg.hidden, cfg.q_dim, bias=cfg.bias)
        self.k_proj = nn.Linear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim, bias=cfg.bias)
        self.v_proj = nn.Linear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim, bias=cfg.bias)
        self.o_proj = nn.Linear(cfg.q_dim, cfg.hidden, bias=cfg.bias)
        self.rotary = cfg.position == "rope"
        if self.rotary:
            cos, sin = rotary_tables(cfg)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (
            p(x).view(B, T, -1, self.head_dim).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        if self.rotary:
            q, k = (apply_rotary(t, self.cos[:T], self.sin[:T]) for t in (q, k))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.gqa)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class SeparateGateUpMLP(nn.Module):
    """SwiGLU with separate gate and up projections (torchtitan's w1, w3), so that
    ColwiseParallel splits each by columns."""

    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=cfg.bias)
        self.up_proj = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=cfg.bias)
        self.down_proj = nn.Linear(cfg.ffn_hidden, cfg.hidden, bias=cfg.bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def dtensor_step(cfg: TrainConfig, stream, compile_blocks: bool = False):
    """torchtitan's recipe on the same model; ``compile_blocks``: each block then
    ``torch.compile``d by inductor, as torchtitan compiles its blocks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        loss_parallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model)
    swiglu = cfg.model.activation == "swiglu"
    for block in model.blocks:
        block.attn = SeparateQKVAttention(cfg.model)
        if swiglu:
            block.mlp = SeparateGateUpMLP(cfg.model)
    colwise = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.up_proj")
    # Under compiled blocks the vocabulary-parallel embedding fails in backward (torch 2.13,
    # CPU: its Partial → Replicate redistribution is handed a plain gradient, "'Tensor' object
    # has no attribute '_local_tensor'"), so the peer then keeps it replicated: one all-reduce
    # a step fewer than paracube's vocabulary-parallel embedding.
    embedding = {} if compile_blocks else {"embed.tok": RowwiseParallel(input_layouts=Replicate())}
    plan = {
        **embedding,
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    }
    for i in range(cfg.model.n_layers):
        for name in colwise + (("mlp.gate_proj",) if swiglu else ()):
            plan[f"blocks.{i}.{name}"] = ColwiseParallel()
        for name in ("attn.o_proj", "mlp.down_proj"):
            plan[f"blocks.{i}.{name}"] = RowwiseParallel()
    parallelize_module(model, mesh, plan)
    if compile_blocks:
        for block in model.blocks:
            block.compile(fullgraph=True)
    # Fused AdamW refuses a mix of DTensor and plain tensors: one optimizer for each kind.
    dparams = [p for p in model.parameters() if isinstance(p, DTensor)]
    opts = [
        adamw_for(dparams, cfg),
        adamw_for([p for p in model.parameters() if not isinstance(p, DTensor)], cfg),
    ]

    def clip():
        norms = [p.grad.norm() for p in model.parameters()]
        total = math.sqrt(
            sum(float((n.full_tensor() if isinstance(n, DTensor) else n) ** 2) for n in norms)
        )
        if total > cfg.grad_clip:
            for p in model.parameters():
                p.grad.mul_(cfg.grad_clip / (total + 1e-6))

    def step():
        x, y = next(stream)
        model.zero_grad(set_to_none=True)
        with loss_parallel():
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
        clip()
        for opt in opts:
            opt.step()

    return step


# -- megatron-core layers -----------------------------------------------------------------------


class MegatronBlock(nn.Module):
    def __init__(self, cfg, mcfg, group, mc):
        super().__init__()
        init = lambda w: nn.init.normal_(w, 0.0, cfg.init_std)  # noqa: E731
        tp = dist.get_world_size(group)
        self.heads, self.head_dim = cfg.n_heads // tp, cfg.head_dim
        self.attn_norm, self.mlp_norm = make_norm(cfg), make_norm(cfg)
        kw = dict(config=mcfg, init_method=init, bias=cfg.bias, tp_group=group)
        self.qkv = mc.ColumnParallelLinear(cfg.hidden, 3 * cfg.hidden, gather_output=False, **kw)
        self.proj = mc.RowParallelLinear(
            cfg.hidden, cfg.hidden, input_is_parallel=True, skip_bias_add=False, **kw
        )
        self.fc1 = mc.ColumnParallelLinear(cfg.hidden, cfg.ffn_hidden, gather_output=False, **kw)
        self.fc2 = mc.RowParallelLinear(
            cfg.ffn_hidden, cfg.hidden, input_is_parallel=True, skip_bias_add=False, **kw
        )

    def forward(self, x):  # (B, T, H)
        B, T, _ = x.shape
        qkv, _ = self.qkv(self.attn_norm(x))  # (B, T, 3H/tp)
        q, k, v = qkv.view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = (
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
            .transpose(1, 2)
            .reshape(B, T, -1)
        )
        x = x + self.proj(y)[0]
        h, _ = self.fc1(self.mlp_norm(x))
        return x + self.fc2(F.gelu(h, approximate="tanh"))[0]


class MegatronGPT(nn.Module):
    def __init__(self, cfg, group):
        super().__init__()
        from megatron.core import tensor_parallel as mc
        from megatron.core.model_parallel_config import ModelParallelConfig

        self.mc = mc
        tp = dist.get_world_size(group)
        mcfg = ModelParallelConfig(
            tensor_model_parallel_size=tp,
            use_cpu_initialization=True,
            gradient_accumulation_fusion=False,
            params_dtype=torch.float32,
            perform_initialization=True,
        )
        init = lambda w: nn.init.normal_(w, 0.0, cfg.init_std)  # noqa: E731
        self.tok = mc.VocabParallelEmbedding(
            cfg.vocab_size, cfg.hidden, init_method=init, config=mcfg, tp_group=group
        )
        self.pos = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(
            MegatronBlock(cfg, mcfg, group, mc) for _ in range(cfg.n_layers)
        )
        self.norm = make_norm(cfg)
        self.head = mc.ColumnParallelLinear(
            cfg.hidden,
            cfg.vocab_size,
            config=mcfg,
            init_method=init,
            bias=False,
            gather_output=False,
            tp_group=group,
        )

    def forward(self, tokens, targets):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits, _ = self.head(self.norm(x))  # (B, T, V/tp)
        # megatron's loss wants (T, B, V/tp) / (T, B)
        return self.mc.vocab_parallel_cross_entropy(
            logits.transpose(0, 1).contiguous(), targets.t().contiguous()
        ).mean()


def megatron_step(cfg: TrainConfig, stream):
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=dist.get_world_size())
    torch.manual_seed(cfg.seed)
    model = MegatronGPT(cfg.model, parallel_state.get_tensor_model_parallel_group())
    opt = adamw_for(list(model.parameters()), cfg)
    sharded = [p for p in model.parameters() if getattr(p, "tensor_model_parallel", False)]
    replicated = [p for p in model.parameters() if not getattr(p, "tensor_model_parallel", False)]

    def step():
        x, y = next(stream)
        opt.zero_grad(set_to_none=True)
        model(x, y).backward()
        sq = torch.stack([p.grad.norm() ** 2 for p in sharded]).sum()
        dist.all_reduce(sq)
        total = math.sqrt(float(sq + torch.stack([p.grad.norm() ** 2 for p in replicated]).sum()))
        if total > cfg.grad_clip:
            torch._foreach_mul_(
                [p.grad for p in model.parameters()], cfg.grad_clip / (total + 1e-6)
            )
        opt.step()

    return step


def worker(rank: int, world: int, args, out: str) -> None:
    cfg = TrainConfig(
        model=preset(args.model),
        parallel=ParallelConfig(tp=world),
        micro_batch=args.batch,
        steps=10_000,
        progress=False,
    )
    ours = Trainer(cfg, ProcessMesh(cfg.parallel), build_corpus(None, cfg.model.seq_len))
    variants = {"paracube": ours.train_step, "torch DTensor TP": dtensor_step(cfg, batches(ours))}
    skipped = {}
    try:
        variants["megatron-core layers"] = megatron_step(cfg, batches(ours))
    except ImportError as e:
        skipped["megatron-core layers"] = f"not installed ({e.name}); see docs/peers.md"
    times = interleaved(variants, reps=args.reps, steps=args.steps)
    if rank != 0:
        return
    rows = ratio_rows(times)
    payload = {
        "benchmark": "tensor_parallel",
        "model": args.model,
        "tp": world,
        "threads_per_rank": 1,
        "batch": args.batch,
        "reps": args.reps,
        "steps_per_rep": args.steps,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "rows": rows,
        "skipped": skipped,
    }
    write_json(out, payload)
    print(
        f"\nmodel {args.model}, tp={world}, 2 ranks × 1 thread, batch {args.batch}, "
        f"{args.reps}×{args.steps} interleaved steps per variant\n"
    )
    print_table(rows, skipped)


def main() -> None:
    parse_and_spawn(
        __doc__, worker, "benchmarks/results/tensor_parallel.json", reps=6, steps=5, batch=8
    )


if __name__ == "__main__":
    main()
