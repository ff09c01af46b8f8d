"""torchtitan's op-level selective checkpointing as the planner describes it (``recompute="op"``):
which matmuls it redoes, measured by running its policy on torch's own ops (CPU), and what
the planner charges for it in memory, time and FLOPs."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from paracube.models import shapes
from paracube.models.presets import preset
from paracube.planner import hardware as hw
from paracube.planner.flops import hardware_flops_per_token, model_flops_per_token
from paracube.planner.layout import Layout
from paracube.planner.time_model import (
    attention_core,
    elementwise_forward,
    layer_time,
    op_recompute_time,
    recompute_time,
)

aten = torch.ops.aten
# torchtitan's _save_list: the matmul, the fused attention kernels (the CPU twin of the flash
# one here), the reduce-scatter of tensor parallelism
SAVE = {
    aten.mm.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention.default,
}


def op_policy(contexts: list | None = None):
    """torchtitan's ``_apply_op_sac`` policy: every op of the save list kept, except every
    second matmul, counted per pass (forward, recompute) of the block; ``contexts`` collects
    the (caching, cached) dispatch modes made, whose storage holds what the forward kept."""
    meta: dict[str, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
        if func == aten.mm.default:
            meta[key] += 1
        keep = func in SAVE and not (func == aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    made = create_selective_checkpoint_contexts(policy)
    if contexts is not None:
        contexts.append(made)
    return made


class Block(nn.Module):
    """A Llama block as torchtitan writes it: RMSNorm, separate q/k/v projections, grouped
    keys and values repeated for SDPA, the output projection; SwiGLU (w1, w3, w2) or GELU."""

    def __init__(self, h: int, heads: int, kv_heads: int, ffn: int, swiglu: bool):
        super().__init__()
        d = h // heads
        self.heads, self.kv_heads, self.d = heads, kv_heads, d
        self.wq, self.wk = nn.Linear(h, h, bias=False), nn.Linear(h, kv_heads * d, bias=False)
        self.wv, self.wo = nn.Linear(h, kv_heads * d, bias=False), nn.Linear(h, h, bias=False)
        self.swiglu = swiglu
        if swiglu:
            self.w1, self.w3 = nn.Linear(h, ffn, bias=False), nn.Linear(h, ffn, bias=False)
            self.w2 = nn.Linear(ffn, h, bias=False)
        else:
            self.fc1, self.fc2 = nn.Linear(h, ffn, bias=False), nn.Linear(ffn, h, bias=False)
        self.norm1, self.norm2 = nn.RMSNorm(h), nn.RMSNorm(h)

    def forward(self, x):
        b, s, h = x.shape
        y = self.norm1(x)
        q = self.wq(y).view(b, s, self.heads, self.d).transpose(1, 2)
        k = self.wk(y).view(b, s, self.kv_heads, self.d).transpose(1, 2)
        v = self.wv(y).view(b, s, self.kv_heads, self.d).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, h))
        z = self.norm2(x)
        if self.swiglu:
            return x + self.w2(F.silu(self.w1(z)) * self.w3(z))
        return x + self.fc2(F.gelu(self.fc1(z)))


class RecomputedMatmuls(TorchDispatchMode):
    """Names the block's linears whose forward matmul runs during backward (the recompute):
    a forward matmul takes the weight transposed, a backward one the weight itself or
    another operand."""

    def __init__(self, weights: dict[int, str]):
        super().__init__()
        self.weights, self.names, self.attention = weights, [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func == aten.mm.default and not args[1].is_contiguous():
            name = self.weights.get(args[1].data_ptr())
            if name is not None:
                self.names.append(name)
        if func == aten._scaled_dot_product_flash_attention_for_cpu.default:
            self.attention += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("swiglu", [True, False])
def test_torchtitans_policy_redoes_the_matmuls_the_planner_says(swiglu):
    """Run torchtitan's op-level policy on a Llama block (CPU, fp32) and watch its backward:
    the matmuls recomputed are exactly those ``op_checkpoint_linears`` marks redone — k,
    the output projection and SwiGLU's up (w3); a GELU MLP's second, not kept either, is not
    needed by backward and never redone — and the attention kernel is not recomputed."""
    torch.manual_seed(0)
    block = Block(64, 8, 2, 96, swiglu)
    weights = {
        m.weight.data_ptr(): name.split(".")[-1]
        for name, m in block.named_modules()
        if isinstance(m, nn.Linear)
    }
    x = torch.randn(2, 16, 64, requires_grad=True)
    out = checkpoint(block, x, use_reentrant=False, context_fn=op_policy)
    watch = RecomputedMatmuls(weights)
    with watch:
        out.square().sum().backward()
    cfg = replace(preset("llama3-8b"), activation="swiglu" if swiglu else "gelu")
    planned = [
        lin.name.split(".")[-1] for lin, _, redone in shapes.op_checkpoint_linears(cfg) if redone
    ]
    assert sorted(watch.names) == sorted(planned)
    assert planned == (["wk", "wo", "w3"] if swiglu else ["wk", "wo"])
    assert watch.attention == 0  # the kernel's output is kept, not recomputed


@pytest.mark.parametrize("swiglu", [True, False])
def test_what_torchtitans_policy_keeps_is_the_planners_count(swiglu):
    """The outputs torchtitan's policy keeps through a block's forward (the checkpoint's
    storage, read after the forward: the kept matmuls' outputs, the attention kernel's output
    and fp32 log-sum-exp) are, byte for byte, what the planner counts for a block under
    ``recompute="op"`` less the block's input, which the checkpoint keeps on its own."""
    h, heads, kv_heads, ffn, b, s = 64, 8, 2, 96, 2, 16
    block = Block(h, heads, kv_heads, ffn, swiglu)
    contexts: list = []
    x = torch.randn(b, s, h, requires_grad=True)
    checkpoint(block, x, use_reentrant=False, context_fn=lambda: op_policy(contexts))
    ((caching, _),) = contexts
    kept = 0
    for outputs in caching.storage.values():
        for out in outputs.values():
            for leaf in torch.utils._pytree.tree_leaves(out):
                tensor = getattr(leaf, "val", leaf)  # the storage wraps each tensor
                if isinstance(tensor, torch.Tensor):
                    kept += tensor.numel() * tensor.element_size()
    cfg = replace(
        preset("llama3-8b"), n_layers=1, hidden=h, n_heads=heads, n_kv_heads=kv_heads,
        ffn_hidden=ffn, seq_len=s, activation="swiglu" if swiglu else "gelu",
    )  # fmt: skip
    planned = shapes.block_saved_bytes(cfg, b, elem=4, recompute="op")
    assert kept > 0 and kept == planned - b * s * h * 4


def test_op_checkpointing_costs_between_selective_and_full():
    """What the planner charges for op-level checkpointing, derived: a block keeps its input,
    the kept matmuls' outputs and the attention kernel's output and log-sum-exp — less than
    without recomputation, more than full; it redoes the redone matmuls' forward and the
    element-wise forward — less than the whole forward; and its executed FLOPs add two per
    token and weight of the redone matmuls."""
    cfg, b = preset("llama3-8b"), 1
    n, h, kv, f, a = b * cfg.seq_len, cfg.hidden, shapes.kv_dim(cfg), cfg.ffn_hidden, cfg.n_heads
    kept = n * h * 2 + (n * h + n * kv + n * f + n * h) * 2 + n * h * 2 + 4 * n * a
    assert shapes.block_saved_bytes(cfg, b, elem=2, recompute="op") == kept
    saved = {r: shapes.block_saved_bytes(cfg, b, elem=2, recompute=r) for r in ("none", "full")}
    assert saved["full"] < kept < saved["none"]

    g = hw.gpu("h100")
    layout = Layout(dp=8, zero=3, micro_batch=b, recompute="op")
    forward = layer_time(cfg, layout, g)[0]
    redo = op_recompute_time(cfg, layout, g)
    assert recompute_time(cfg, layout, g, 2, False, forward) == redo
    matmuls = redo - elementwise_forward(cfg, layout, g)
    core = attention_core(cfg, layout, g)[0]
    assert 0 < matmuls and redo < forward - core  # no attention kernel among the redone work
    # the redone matmuls are k (h·kv), the output projection (h·h) and w3 (h·f) of the
    # block's h·(2h + 2kv + 3f) matmul weights
    share = (h * kv + h * h + h * f) / (h * (2 * h + 2 * kv + 3 * f))
    assert hardware_flops_per_token(cfg, "op") - model_flops_per_token(cfg) == pytest.approx(
        cfg.n_layers * 2 * share * shapes.block_matrix_params(cfg)
    )


def test_only_a_stack_that_runs_it_is_planned_with_it():
    """The search proposes op-level checkpointing for torchtitan (which runs it) and never for
    paracube's own plans unless asked; asked, every candidate is one."""
    from paracube.planner.search import search
    from paracube.planner.stacks import stack, stack_choices
    from paracube.planner.time_model import Cluster

    cfg = preset("llama3-8b")
    cluster = Cluster(hw.gpu("a100-80gb"), 8, hw.interconnect("nvlink3"), hw.interconnect("ib-hdr"))

    def modes(**kwargs) -> set[str]:
        ranked = search(cfg, cluster, 8, 16, top=10_000, **kwargs).ranked
        return {c.layout.recompute for c in ranked}

    titan = modes(fixed=stack("torchtitan"), allowed=stack_choices("torchtitan"), op_recompute=True)
    assert "op" in titan and "selective" not in titan
    assert "op" not in modes()
    assert modes(fixed={"recompute": "op"}) == {"op"}
