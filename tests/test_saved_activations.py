"""Counted activation bytes (saved-tensor hooks) against the op-by-op formula for
paracube's model (:mod:`paracube.models.shapes`)."""

from __future__ import annotations

import pytest
import torch

from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.memory.activations import ActivationCounter
from paracube.models.gpt import GPT, Block, apply_recompute, lm_loss
from paracube.models.shapes import block_saved_bytes, model_saved_bytes

BASE = dict(n_layers=2, hidden=64, n_heads=4, vocab_size=256, seq_len=32)
LLAMA_MHA = dict(norm="rmsnorm", activation="swiglu", position="rope", ffn_hidden=96, bias=False)
VARIANTS = {
    "gpt": {},
    "llama-mha": LLAMA_MHA,
    "llama-gqa": {**LLAMA_MHA, "n_kv_heads": 2},
    # four query heads a key head (Llama 3 8B's): what two cannot tell apart — the kernel
    # keeps no expanded keys and values
    "llama-gqa-4": {**LLAMA_MHA, "n_kv_heads": 1},
    "gqa-4-learned-positions": {**LLAMA_MHA, "n_kv_heads": 1, "position": "learned"},
    # heads of 32 over a hidden size of 64 (4 heads): queries 128 wide, as Qwen3-32B's
    "llama-gqa-wide-heads": {**LLAMA_MHA, "n_kv_heads": 2, "head_size": 32},
    # Qwen3's block: wide heads and per-head q and k norms
    "qwen3": {**LLAMA_MHA, "n_kv_heads": 2, "head_size": 32, "qk_norm": True},
    # q and k norms without rotary positions: the kernel keeps the norms' outputs
    "qk-norm-learned-positions": {
        **LLAMA_MHA,
        "n_kv_heads": 2,
        "qk_norm": True,
        "position": "learned",
    },
}
B = 2


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_block_and_model_saved_bytes_equal_formula(variant, dtype, recompute):
    torch.manual_seed(0)
    cfg = ModelConfig(**BASE, **VARIANTS[variant])
    elem = torch.finfo(dtype).bits // 8
    block = Block(cfg).to(dtype)
    apply_recompute(torch.nn.Sequential(block), recompute)
    x = torch.randn(B, cfg.seq_len, cfg.hidden, dtype=dtype, requires_grad=True) * 1.0  # not a leaf
    with ActivationCounter() as counter:
        y = block(x)
    assert counter.live == block_saved_bytes(cfg, B, elem=elem, recompute=recompute)
    y.float().sum().backward()
    assert counter.live == 0  # everything released once backward consumed it

    model = GPT(cfg).to(dtype)
    apply_recompute(model, recompute)
    tokens = torch.randint(0, cfg.vocab_size, (B, cfg.seq_len))
    targets = torch.randint(0, cfg.vocab_size, (B, cfg.seq_len))
    with ActivationCounter() as counter:
        loss = lm_loss(model(tokens), targets)
    assert counter.live == model_saved_bytes(cfg, B, elem=elem, recompute=recompute)
    del loss


def test_full_recompute_of_some_blocks():
    cfg = ModelConfig(**{**BASE, "n_layers": 4})
    model = GPT(cfg)
    assert apply_recompute(model, "full", 3) == 3
    tokens = torch.randint(0, 256, (B, cfg.seq_len))
    with ActivationCounter() as counter:
        loss = lm_loss(model(tokens), tokens.clone())
    assert counter.live == model_saved_bytes(cfg, B, recompute="full", recompute_blocks=3)
    del loss


def test_peak_counts_storages_once_and_tracks_release():
    a = torch.randn(100, requires_grad=True) * 1.0
    with ActivationCounter() as counter:
        y = a.sin() * a.cos()  # sin and cos both keep ``a``: one storage
    assert counter.live == 400 + 400 + 400  # a, sin(a), cos(a)
    y.sum().backward()
    assert counter.live == 0 and counter.peak == 1200


# torch.compile with inductor's decompositions and its min-cut partitioner, without
# inductor's code generation (torch/_dynamo/backends/debugging.py): what a compiled block
# keeps for backward is the partitioner's choice, counted here on this machine
INDUCTOR_PARTITION = "aot_eager_decomp_partition"
COMPILED = {
    **VARIANTS,
    # learned positions with grouped-query attention: no rotated copy to keep
    "gqa-learned-positions": {**LLAMA_MHA, "n_kv_heads": 2, "position": "learned"},
}


@pytest.mark.parametrize("variant", list(COMPILED))
def test_compiled_block_keeps_what_the_formula_counts(variant):
    torch.manual_seed(0)
    # b·s (2 × 24 = 48 tokens) unlike any width, so no two terms can stand in for each other
    cfg = ModelConfig(**{**BASE, "seq_len": 24}, **COMPILED[variant])
    dtype = torch.float32 if variant == "gpt" else torch.bfloat16
    elem = torch.finfo(dtype).bits // 8
    compiled = torch.compile(Block(cfg).to(dtype), backend=INDUCTOR_PARTITION, fullgraph=True)
    x = torch.randn(B, cfg.seq_len, cfg.hidden, dtype=dtype, requires_grad=True) * 1.0
    with ActivationCounter() as counter:
        y = compiled(x)
    kept = counter.live
    y.float().sum().backward()
    torch._dynamo.reset()
    assert kept == block_saved_bytes(cfg, B, elem=elem, compiled=True)
    if COMPILED[variant].get("norm") == "rmsnorm":  # what compiling saves: never more
        assert kept < block_saved_bytes(cfg, B, elem=elem)
    assert counter.live == 0


def test_compiled_full_recomputation_keeps_the_input_and_constants():
    """A compiled, fully recomputed block keeps its input — the formula's — and beside it
    the rotary tables and the CPU random-number state its checkpoint restores, bytes that
    do not grow with the tokens."""
    torch.manual_seed(0)
    kept = {}
    for b in (2, 4):
        cfg = ModelConfig(**BASE, **VARIANTS["llama-gqa"])
        block = Block(cfg).to(torch.bfloat16)
        apply_recompute(torch.nn.Sequential(block), "full")
        compiled = torch.compile(block, backend=INDUCTOR_PARTITION)
        x = torch.randn(b, cfg.seq_len, cfg.hidden, dtype=torch.bfloat16, requires_grad=True)
        with ActivationCounter() as counter:
            y = compiled(x * 1.0)
        kept[b] = counter.live - block_saved_bytes(cfg, b, elem=2, recompute="full", compiled=True)
        y.float().sum().backward()
        torch._dynamo.reset()
    tables = 2 * cfg.seq_len * (cfg.head_dim // 2) * 2  # cos and sin, bf16
    assert kept[2] == kept[4] == tables + torch.get_rng_state().numel()


def test_compiled_counting_refuses_what_it_did_not_count():
    cfg = ModelConfig(**BASE, **LLAMA_MHA)
    with pytest.raises(ConfigError, match="recompute='selective' under torch.compile"):
        block_saved_bytes(cfg, B, recompute="selective", compiled=True)
