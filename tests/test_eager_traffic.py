"""The planner's count of the bytes an eager block's element-wise ops move
(``shapes.eager_elementwise_bytes``) against the ops torch's dispatcher runs for paracube's
own block on this machine: every op but the matmuls, the attention kernel and views, each
reading its inputs and writing its outputs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.models.gpt import Block

MATMULS = {"mm", "addmm", "bmm"}
# a reshape's new header over the same storage, which autograd does not flag as a view
UNFLAGGED_VIEWS = {"_unsafe_view"}


class ElementwiseBytes(TorchDispatchMode):
    """Bytes read and written by every op that is neither a matmul, the attention kernel nor
    a view — nor a clone in forward: the CPU attention kernel's head-major output copied back
    to token-major, where CUDA's kernels write it token-major."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.is_view or name in MATMULS | UNFLAGGED_VIEWS or "scaled_dot_product" in name:
            return out
        if name == "clone" and torch.is_grad_enabled() and not self.in_backward:
            return out
        tensors = [a for a in tree_leaves((args, kwargs, out)) if isinstance(a, torch.Tensor)]
        self.bytes += sum(a.numel() * a.element_size() for a in tensors)
        return out

    in_backward = False


def measured(cfg: ModelConfig, batch: int, dtype: torch.dtype) -> tuple[int, int]:
    torch.manual_seed(0)
    block = Block(cfg).to(dtype)
    x = torch.randn(batch, cfg.seq_len, cfg.hidden, dtype=dtype, requires_grad=True)
    grad = torch.randn(batch, cfg.seq_len, cfg.hidden, dtype=dtype)
    counter = ElementwiseBytes()
    with counter:
        y = block(x)
    forward = counter.bytes
    counter.in_backward = True
    with counter:
        y.backward(grad)
    return forward, counter.bytes - forward


BASE = ModelConfig(n_layers=1, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=96, seq_len=16,
                   vocab_size=32, norm="rmsnorm", activation="swiglu", position="rope",
                   bias=False)  # fmt: skip
VARIANTS = {
    "llama": BASE,
    "gpt2": replace(
        BASE, norm="layernorm", activation="gelu", position="learned", bias=True, n_kv_heads=4
    ),  # fmt: skip
    "qwen3": replace(BASE, qk_norm=True),
    "qwen2": replace(BASE, qkv_bias=True),  # q, k and v biased, no other linear
    "mha-rope-gelu": replace(BASE, n_kv_heads=4, activation="gelu"),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_eager_bytes_match_the_dispatched_ops(name, dtype):
    cfg = VARIANTS[name]
    elem = torch.empty((), dtype=dtype).element_size()
    got = measured(cfg, 2, dtype)
    want = shapes.eager_elementwise_bytes(cfg, 2 * cfg.seq_len, elem=elem)
    print(name, dtype, got, want)
    assert want == pytest.approx(got, rel=0.0)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_tensor_parallel_shard_moves_its_share(name):
    """Under tensor parallelism (no sequence parallelism) a rank runs the block's element-wise
    ops on its heads' and its MLP columns' share, the norms and residual adds whole: the
    count at tp=2 is what a block of half the heads and half the MLP moves, measured."""
    cfg = VARIANTS[name]
    shard = replace(cfg, n_heads=cfg.n_heads // 2, n_kv_heads=cfg.n_kv_heads // 2,
                    head_size=cfg.head_dim, ffn_hidden=cfg.ffn_hidden // 2)  # fmt: skip
    n = 2 * cfg.seq_len
    got = measured(shard, 2, torch.bfloat16)
    # the row-parallel biases (o_proj, down_proj) are whole on every rank: the shard's block
    # holds them whole too, so nothing differs there
    assert shapes.eager_elementwise_bytes(cfg, n, tp=2) == got


def test_eager_blocks_cost_more_than_fused_and_mixtures_are_refused():
    """The time model charges an eager block's element-wise work op by op (more than a fused
    block's, which reads and writes what it keeps), refuses eager with compiled blocks, and
    refuses to count a mixture of experts' eager routing, in one line each."""
    from paracube.models.presets import preset
    from paracube.planner import hardware as hw
    from paracube.planner.layout import Layout
    from paracube.planner.time_model import elementwise_times

    cfg = preset("llama3-8b")
    g = hw.gpu("h100")
    fused = Layout(dp=8, tp=1, pp=1, micro_batch=2)
    eager = fused.replace(elementwise="eager")
    (ff, fb), (ef, eb) = elementwise_times(cfg, fused, g), elementwise_times(cfg, eager, g)
    assert ef > ff and eb > fb
    forward, backward = shapes.eager_elementwise_bytes(cfg, 2 * cfg.seq_len)
    assert (ef, eb) == (forward / g.memory_rate, backward / g.memory_rate)
    with pytest.raises(ConfigError, match="torch.compile fuses"):
        fused.replace(elementwise="eager", activations="compiled")
    with pytest.raises(ConfigError, match="dense blocks"):
        shapes.eager_elementwise_bytes(preset("qwen3-30b-a3b"), 16)


def test_the_torchtitan_stack_plans_eager_blocks_unless_compiled(capsys):
    """``--stack torchtitan`` plans its blocks eager (its configs' compile = false): slower
    than the same layout compiled, which ``--activations compiled`` plans with fused kernels
    — not refused for the stack's eager default."""
    import json

    from paracube.cli import main

    def step(*extra: str) -> float:
        argv = ["plan", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100",
                "--global-batch", "16", "--layout", "dp=8,tp=1,pp=1", "--micro-batch", "2",
                "--recompute", "full", "--stack", "torchtitan", "--json", *extra]  # fmt: skip
        assert main(argv) == 0
        return json.loads(capsys.readouterr().out)["candidates"][0]["time"]["step_time"]

    eager, compiled = step(), step("--activations", "compiled")
    assert step("--elementwise", "eager") == eager
    assert compiled < eager
    argv = ["plan", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100", "--global-batch",
            "16", "--stack", "torchtitan", "--explain"]  # fmt: skip
    assert main(argv) == 0
    assert "element-wise work (as eager PyTorch ops" in capsys.readouterr().out
