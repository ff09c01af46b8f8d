"""Named model shapes, from CPU-sized demos to the published GPT-3 and LLaMA families.

Torch-free: the planner reads these shapes as pure math. Sources:
- GPT-3: Brown et al. 2020, Table 2.1 (layers, d_model, heads); context 2048, GPT-2 BPE
  vocabulary 50257. The 1.3B row lists 24 heads of 128, which does not divide 2048; we use
  16 heads of 128, as Megatron-LM's GPT-3 1.3B configuration does.
- LLaMA-2: Touvron et al. 2023 and the released configs (vocab 32000, context 4096,
  70B uses grouped-query attention with 8 key/value heads).
- LLaMA-3 / 3.1: Dubey et al. 2024, Table 3 (vocab 128256; 8 key/value heads).
- Mixtures of experts (planned by ``paracube plan``; paracube's GPT is dense): Mixtral 8x7B
  (Jiang et al. 2024, Table 1: 8 experts, 2 per token, context 32768), Mixtral 8x22B
  (mistralai/Mixtral-8x22B-v0.1's config.json), Grok-1 (xai-org/grok-1 ``run.py``: 48
  query heads of 128, 8 key/value heads, 64 layers, 8 experts, 2 per token, vocabulary
  128 × 1024, sequence 8192; its gated MLP's width ``ffn_size(6144, 8)`` = 32768 in
  ``model.py``, gated GELU — the same three matrices as SwiGLU — and the output tied to
  the embedding).
- Qwen3 (planned by ``paracube plan`` and trained as paracube's GPT, or from its Hugging
  Face config, ``--model hf:DIR``): the Qwen/Qwen3-{4B,8B,14B,32B}
  config.json files — vocabulary 151,936, 8 key/value heads, heads of 128 (wider than
  hidden ÷ heads in 4B and 32B), per-head q/k norms, the 4B's embedding tied — at the 4,096
  tokens of the Qwen3 technical report's general pre-training stage (Yang et al. 2025,
  §3.2); their parameters are the model cards' (4.0B, 8.2B, 14.8B, 32.8B: tested).
The byte-level presets (``nano``, ``tiny``, ``small``) have a 256-symbol vocabulary so
they train on the embedded byte corpus.
"""

from __future__ import annotations

from paracube.config import ModelConfig
from paracube.errors import ConfigError


def _llama(
    n_layers: int,
    hidden: int,
    n_heads: int,
    n_kv_heads: int,
    ffn_hidden: int,
    vocab_size: int,
    seq_len: int,
) -> dict:
    """A LLaMA-style shape: RMSNorm, SwiGLU, rotary positions, no biases, separate head."""
    return dict(
        n_layers=n_layers,
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        ffn_hidden=ffn_hidden,
        vocab_size=vocab_size,
        seq_len=seq_len,
        norm="rmsnorm",
        activation="swiglu",
        position="rope",
        bias=False,
        tie_embeddings=False,
    )


_MOE_8_2 = dict(experts=8, experts_per_token=2)
_MOE_128_8 = dict(experts=128, experts_per_token=8)


def _qwen3(n_layers: int, hidden: int, n_heads: int, ffn_hidden: int, tied: bool = False) -> dict:
    """A Qwen3 shape: Llama's block with heads of 128 and per-head q/k norms."""
    return {
        **_llama(n_layers, hidden, n_heads, 8, ffn_hidden, 151936, 4096),
        "head_size": None if hidden == 128 * n_heads else 128,
        "qk_norm": True,
        "tie_embeddings": tied,
        "rope_theta": 1000000.0,  # the config.json files' rope_theta
        "norm_eps": 1e-6,  # and their rms_norm_eps
    }


def _qwen25(n_layers: int, hidden: int, n_heads: int, n_kv_heads: int, ffn_hidden: int) -> dict:
    """A Qwen2.5 shape (Qwen/Qwen2.5-*'s config.json): Llama's block with q, k and v
    biased (their only biases), rotary base 1,000,000 and ε 1e-6; the sizes below 7B tie
    their 151,936-row head to the embedding, 7B and up keep a 152,064-row one."""
    tied = hidden < 3584
    return {
        **_llama(
            n_layers, hidden, n_heads, n_kv_heads, ffn_hidden, 151936 if tied else 152064, 4096
        ),
        "bias": False,
        "qkv_bias": True,
        "tie_embeddings": tied,
        "rope_theta": 1000000.0,
        "norm_eps": 1e-6,
    }


def _gpt_oss(n_layers: int, experts: int) -> dict:
    """A GPT-OSS shape (its config.json's): Llama's block with biases, heads of 64, a
    mixture of 4 experts a token, a 128-token window in alternate blocks."""
    return {
        **_llama(n_layers, 2880, 64, 8, 2880, 201088, 4096),
        "head_size": 64,
        "bias": True,
        "experts": experts,
        "experts_per_token": 4,
        "attention_window": 128,
        "full_attention_every": 2,
        "rope_theta": 150000.0,
    }


def _gemma2(n_layers: int, hidden: int, n_heads: int, head_size: int, ffn_hidden: int) -> dict:
    """A Gemma 2 shape (google/gemma-2-*'s config.json): Llama's block with four norms, a
    GeGLU MLP (planned as the gated MLP's three matrices), query heads of ``head_size`` over
    half as many key/value heads, a 4,096-token window in every other block from the first,
    logit soft-capping at 50 (scores) and 30 (logits), a tied 256,000-token head."""
    return {
        **_llama(n_layers, hidden, n_heads, n_heads // 2, ffn_hidden, 256000, 8192),
        "head_size": head_size,
        "tie_embeddings": True,
        "post_norms": True,
        "attention_window": 4096,
        "full_attention_every": 2,
        "attention_softcap": 50.0,
        "logit_softcap": 30.0,
        "norm_eps": 1e-6,
    }


def _gemma3(
    n_layers: int, hidden: int, n_heads: int, n_kv_heads: int, head_size: int, ffn_hidden: int
) -> dict:
    """A Gemma 3 shape (google/gemma-3-*'s text_config): Gemma 2's block with per-head q/k
    norms and no soft caps, a sliding window in five blocks of six (512 tokens in the 1B,
    1,024 in the others), a tied head over 262,144 tokens (262,208 beside the vision
    encoder's), the full blocks' rotary base 1,000,000; 32,768 tokens, its pre-training
    length before the 128K extension (Gemma 3 report, §2)."""
    vocab = 262144 if hidden < 2048 else 262208
    return {
        **_llama(n_layers, hidden, n_heads, n_kv_heads, ffn_hidden, vocab, 32768),
        "rope_theta": 1000000.0,
        "head_size": head_size,
        "tie_embeddings": True,
        "post_norms": True,
        "qk_norm": True,
        "attention_window": 512 if hidden < 2048 else 1024,
        "full_attention_every": 6,
        "norm_eps": 1e-6,
    }


def _llama4(experts: int, moe_every: int) -> dict:
    """A Llama 4 shape (its config.json's text_config): Llama's block with per-head q/k
    norms, a mixture of 1 expert a token and a shared one in every ``moe_every``-th block,
    the others dense, chunked attention in three blocks of four."""
    dense = tuple(i for i in range(48) if (i + 1) % moe_every)
    return {
        **_llama(48, 5120, 40, 8, 8192, 202048, 8192),
        "qk_norm": True,
        "experts": experts,
        "experts_per_token": 1,
        "shared_expert_ffn": 8192,
        "dense_layers": dense,
        "dense_ffn": 16384 if dense else 0,
        "attention_chunk": 8192,
        "full_attention_every": 4,
        "rope_theta": 500000.0,
        "router_score": "sigmoid",  # of the chosen expert's logit, not renormalised
        "router_renorm": False,
    }


PRESETS: dict[str, dict] = {
    # Byte-level models for this machine (2 CPU cores).
    "nano": dict(n_layers=2, hidden=64, n_heads=4, vocab_size=256, seq_len=64),
    "tiny": dict(n_layers=4, hidden=128, n_heads=4, vocab_size=256, seq_len=128),
    # The peers' benchmark model (docs/peers.md): 4 layers, hidden 256, seq 128.
    "small": dict(n_layers=4, hidden=256, n_heads=8, vocab_size=256, seq_len=128),
    # GPT-3 family (Brown et al. 2020, Table 2.1).
    "gpt3-125m": dict(n_layers=12, hidden=768, n_heads=12, vocab_size=50257, seq_len=2048),
    "gpt3-350m": dict(n_layers=24, hidden=1024, n_heads=16, vocab_size=50257, seq_len=2048),
    "gpt3-760m": dict(n_layers=24, hidden=1536, n_heads=16, vocab_size=50257, seq_len=2048),
    "gpt3-1.3b": dict(n_layers=24, hidden=2048, n_heads=16, vocab_size=50257, seq_len=2048),
    "gpt3-2.7b": dict(n_layers=32, hidden=2560, n_heads=32, vocab_size=50257, seq_len=2048),
    "gpt3-6.7b": dict(n_layers=32, hidden=4096, n_heads=32, vocab_size=50257, seq_len=2048),
    "gpt3-13b": dict(n_layers=40, hidden=5120, n_heads=40, vocab_size=50257, seq_len=2048),
    "gpt3-175b": dict(n_layers=96, hidden=12288, n_heads=96, vocab_size=50257, seq_len=2048),
    # LLaMA-2 (Touvron et al. 2023):  layers, hidden, heads, kv heads, ffn, vocab, context
    "llama2-7b": _llama(32, 4096, 32, 32, 11008, 32000, 4096),
    "llama2-13b": _llama(40, 5120, 40, 40, 13824, 32000, 4096),
    "llama2-70b": _llama(80, 8192, 64, 8, 28672, 32000, 4096),
    # LLaMA-3 / 3.1 (Dubey et al. 2024, Table 3: RoPE θ 500,000)
    "llama3-8b": {**_llama(32, 4096, 32, 8, 14336, 128256, 8192), "rope_theta": 500000.0},
    "llama3-70b": {**_llama(80, 8192, 64, 8, 28672, 128256, 8192), "rope_theta": 500000.0},
    "llama3-405b": {**_llama(126, 16384, 128, 8, 53248, 128256, 8192), "rope_theta": 500000.0},
    # Mixtures of experts: 8 experts, 2 per token
    "mixtral-8x7b": {**_llama(32, 4096, 32, 8, 14336, 32000, 32768), **_MOE_8_2},
    "mixtral-8x22b": {**_llama(56, 6144, 48, 8, 16384, 32768, 65536), **_MOE_8_2},
    "grok-1": {**_llama(64, 6144, 48, 8, 32768, 131072, 8192), **_MOE_8_2, "tie_embeddings": True},
    # Qwen3 (planned; trained from the Hugging Face config): layers, hidden, heads, MLP width
    "qwen3-4b": _qwen3(36, 2560, 32, 9728, tied=True),
    "qwen3-8b": _qwen3(36, 4096, 32, 12288),
    "qwen3-14b": _qwen3(40, 5120, 40, 17408),
    "qwen3-32b": _qwen3(64, 5120, 64, 25600),
    # Qwen2.5 (paracube's GPT: planned and trained): layers, hidden, heads, key/value heads
    # and MLP width as their config.json files give them (the model cards' counts: a test)
    "qwen2.5-0.5b": _qwen25(24, 896, 14, 2, 4864),
    "qwen2.5-1.5b": _qwen25(28, 1536, 12, 2, 8960),
    "qwen2.5-3b": _qwen25(36, 2048, 16, 2, 11008),
    "qwen2.5-7b": _qwen25(28, 3584, 28, 4, 18944),
    "qwen2.5-72b": _qwen25(80, 8192, 64, 8, 29568),
    # Qwen3's mixtures (planned only): 128 experts, 8 per token, each expert's SwiGLU of the
    # width given, 4 key/value heads (the Hugging Face configs' moe_intermediate_size,
    # num_experts, num_experts_per_tok, num_key_value_heads)
    "qwen3-30b-a3b": {**_qwen3(48, 2048, 32, 768), **_MOE_128_8, "n_kv_heads": 4},
    "qwen3-235b-a22b": {**_qwen3(94, 4096, 64, 1536), **_MOE_128_8, "n_kv_heads": 4},
    # Qwen2-57B-A14B (planned only): 64 experts of 2,560, 8 per token, and a shared expert
    # of 20,480 every token passes (its config.json's num_experts, num_experts_per_tok,
    # moe_intermediate_size, shared_expert_intermediate_size), its q, k and v biased (its
    # qkv_bias); the shared expert's gate is left out
    "qwen2-57b-a14b": {
        **_llama(28, 3584, 28, 4, 2560, 151936, 4096),
        "qkv_bias": True,
        "experts": 64,
        "experts_per_token": 8,
        "shared_expert_ffn": 20480,
        "rope_theta": 1000000.0,
        "norm_eps": 1e-6,
        "router_renorm": False,  # its norm_topk_prob: the softmax over all experts, kept
    },
    # DeepSeek-V3 (planned only; deepseek-ai/DeepSeek-V3's config.json): 61 blocks of 7,168,
    # the first 3 dense (SwiGLU of 18,432), the others 256 routed experts of 2,048 (8 a
    # token, from 4 of 8 groups: n_group, topk_group) and one shared; multi-head latent
    # attention (128 heads, query latent 1,536, key-value latent 512, heads of 128 + 64
    # rotary, values of 128); one multi-token prediction module; 129,280-token vocabulary,
    # untied head; 4,096 tokens as trained
    "deepseek-v3": {
        **_llama(61, 7168, 128, 128, 2048, 129280, 4096),
        "experts": 256,
        "experts_per_token": 8,
        "route_groups": 8,
        "route_group_topk": 4,
        "shared_expert_ffn": 2048,
        "dense_layers": (0, 1, 2),
        "dense_ffn": 18432,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "head_size": 128,
        "rope_head_dim": 64,
        "v_head_dim": 128,
        "mtp_layers": 1,
        "norm_eps": 1e-6,
        # its router: sigmoid scores, an expert bias that only chooses (auxiliary-loss-free
        # balancing), the k weights renormalised and scaled by 2.5
        "router_score": "sigmoid",
        "router_expert_bias": True,
        "router_scale": 2.5,
    },
    # GPT-OSS (planned only; openai/gpt-oss-120b's and -20b's config.json): blocks of 2,880,
    # 64 query heads of 64 over 8 key/value heads, biased linears, 128 (20b: 32) experts of
    # 2,880, 4 a token; every odd block (0-based) over a 128-token sliding window, the even
    # ones fully (layer_types: Megatron-Core's --window-attn-skip-freq 2); a 201,088-token
    # vocabulary, untied head; 4,096 tokens, its initial context before YaRN's stretch
    "gpt-oss-120b": {**_gpt_oss(36, experts=128)},
    "gpt-oss-20b": {**_gpt_oss(24, experts=32)},
    # Llama 4 (planned only; meta-llama/Llama-4-Scout-17B-16E's and -Maverick-17B-128E's
    # text_config): 48 blocks of 5,120, 40 query heads of 128 over 8 key/value heads, per-head
    # q/k norms; 16 (Maverick: 128) experts of 8,192, 1 a token, beside a shared one of 8,192
    # — in every block (Maverick: every 2nd, the others dense at 16,384) —; attention within
    # chunks of 8,192 tokens but in every 4th block; a 202,048-token vocabulary, untied; 8,192
    # tokens, one chunk, as Megatron-Bridge's recipes train them
    "llama4-scout": _llama4(experts=16, moe_every=1),
    "llama4-maverick": _llama4(experts=128, moe_every=2),
    # Gemma 2 (planned only): layers, hidden, query heads, head size, MLP width; 8,192 tokens
    "gemma2-2b": _gemma2(26, 2304, 8, 256, 9216),
    "gemma2-9b": _gemma2(42, 3584, 16, 256, 14336),
    "gemma2-27b": _gemma2(46, 4608, 32, 128, 36864),
    # Gemma 3 (planned only): layers, hidden, query heads, key/value heads, head size, MLP
    "gemma3-1b": _gemma3(26, 1152, 4, 1, 256, 6912),
    "gemma3-4b": _gemma3(34, 2560, 8, 4, 256, 10240),
    "gemma3-12b": _gemma3(48, 3840, 16, 8, 256, 15360),
    "gemma3-27b": _gemma3(62, 5376, 32, 16, 128, 21504),
}


def preset(name: str, **overrides) -> ModelConfig:
    """The :class:`ModelConfig` of a named preset, with optional field overrides."""
    if name not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}: choose one of {', '.join(PRESETS)}")
    return ModelConfig(name=name, **{**PRESETS[name], **overrides})
