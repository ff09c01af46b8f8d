"""Hugging Face checkpoints and paracube's own GPT, both ways: ``paracube import hf:DIR
--out FILE`` and ``paracube export CKPT --out FOLDER``.

``--model hf:DIR`` trains ``transformers``' module itself. Importing instead writes its
weights in paracube's GPT's layout, as ``paracube export`` writes a checkpoint (the model
config in the safetensors metadata), so that ``paracube train --init-from FILE`` starts
paracube's own GPT — its fused projections, its tensor-parallel plan, its counted memory —
from them, under any layout. The GPT built from the config's shape computes the HF model's
function given these weights (``tests/test_model_vs_hf.py``).

What changes on the way (shapes: n heads of d, H hidden, F the MLP's width):

- Llama, Mistral, Qwen2, Qwen3: q, k, v (n·d, H), (n_kv·d, H) ×2 → one q|k|v (… , H), and
  their biases (Qwen2's, the only biases it has: ``ModelConfig.qkv_bias``) likewise; gate
  and up (F, H) ×2 → one gate|up (2F, H). The rotary pairs: paracube turns (x[2i], x[2i+1]) as
  RoFormer writes it (Su et al. 2021, eq. 34), Hugging Face (x[i], x[i + d/2])
  ("rotate_half"); both turn pair i by position·θ_i, so the q and k rows (and Qwen3's q/k
  norm weights) are put in paracube's order within each head: its dim 2i is HF's dim i,
  its dim 2i + 1 HF's dim i + d/2.
- GPT-2: its Conv1D weights (in, out) transposed to Linear's (out, in); c_attn is already
  q|k|v, learned positions carry over; a tied head is the embedding.

Not imported: the mixtures (paracube's GPT is dense), Gemma (GeGLU, norms by 1 + w, the
embedding by √h), any Llama whose attention and MLP are not biased alike (paracube's GPT
biases every linear or q, k and v alone), rotary stretches other than linear and Llama
3.1's — all train as ``--model hf:DIR``.

Exported (:func:`hf_config_of`, :func:`hf_weights`: the same steps undone): a GPT of
RMSNorm, SwiGLU and rotary positions as a Llama (a Qwen3 with per-head q/k norms, a Qwen2
with q, k and v alone biased), one of
LayerNorm, GELU, learned positions and biases as a GPT-2 — written as ``transformers``' own
config class writes its config, so ``from_pretrained`` loads the folder and computes the
GPT's function (``tests/test_model_vs_hf.py``).
"""

from __future__ import annotations

import dataclasses
import json

import torch

from paracube.choices import ROPE_SCALINGS
from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models.sources import (
    HF_FAMILIES,
    WEIGHTS_FILE,
    WEIGHTS_INDEX,
    hf_context,
    hf_model_config,
    hf_weight_files,
    read_hf_config,
    rope_stretch,
)

# families paracube's GPT cannot be, and what to do instead
NOT_IMPORTED = {
    "mixtral": "it is a mixture of experts, and paracube's GPT is dense",
    "qwen3_moe": "it is a mixture of experts, and paracube's GPT is dense",
    "qwen2_moe": "it is a mixture of experts, and paracube's GPT is dense",
    "glm4_moe": "it is a mixture of experts, and paracube's GPT is dense",
    "deepseek_v2": "it is a mixture of experts, and paracube's GPT is dense",
    "deepseek_v3": "it is a mixture of experts, and paracube's GPT is dense",
    "kimi_k2": "it is a mixture of experts, and paracube's GPT is dense",
    "gpt_oss": "it is a mixture of experts, and paracube's GPT is dense",
    "llama4_text": "it is a mixture of experts, and paracube's GPT is dense",
    "llama4": "it is a mixture of experts, and paracube's GPT is dense",
    # transformers' GemmaMLP, GemmaRMSNorm and GemmaModel: gate_proj through tanh GELU,
    # x · (1 + w), the embedding × √h; Gemma 2 and 3 add a norm after each sublayer
    **dict.fromkeys(
        ("gemma", "gemma2", "gemma3_text", "gemma3"),
        "its MLP gates with tanh GELU (GeGLU), its norms scale by 1 + w and its embedding by "
        "√hidden, none of which paracube's GPT builds",
    ),
}


def imported_config(data: dict) -> ModelConfig:
    """The GPT shape of a Hugging Face config, at the model's whole context (the rotary or
    position tables' length; train shorter with ``--seq-len``)."""
    kind = data["model_type"]
    if kind in NOT_IMPORTED:
        raise ConfigError(
            f"paracube import: {kind} cannot be paracube's GPT: {NOT_IMPORTED[kind]}; train it "
            "as --model hf:DIR"
        )
    attention_bias, mlp_bias = bool(data.get("attention_bias")), bool(data.get("mlp_bias"))
    if HF_FAMILIES[kind] == "llama" and attention_bias != mlp_bias:
        raise ConfigError(
            f"paracube import: this {kind} biases its attention's projections but not its "
            "MLP's, or the other way round, and paracube's GPT biases every linear or q, k "
            "and v alone; train it as --model hf:DIR"
        )
    stretch = rope_stretch(data)[0]
    if stretch not in ("default", *ROPE_SCALINGS):
        raise ConfigError(
            f"paracube import: its rotary positions are stretched by {stretch!r}, which "
            f"paracube's GPT does not build ({', '.join(ROPE_SCALINGS[1:])} it does); train it "
            "as --model hf:DIR"
        )
    cfg = hf_model_config(data, hf_context(data))
    if cfg.moe or cfg.planned_parts:  # what paracube's GPT cannot build, whatever the kind
        raise ConfigError(
            f"paracube import: this {kind} cannot be paracube's GPT: "
            f"{'a mixture of experts' if cfg.moe else cfg.planned_parts}, planned but not "
            "built; train it as --model hf:DIR"
        )
    return cfg


def rotary_pairs(head_dim: int) -> torch.Tensor:
    """For each of paracube's dims within a head, the HF dim it holds: 0, d/2, 1, d/2 + 1, …"""
    half = torch.arange(head_dim // 2)
    return torch.stack((half, half + head_dim // 2), dim=1).flatten()


def _per_head(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """A projection's rows (heads·d, …) with each head's d rows in paracube's rotary order."""
    heads = rows.shape[0] // head_dim
    return rows.view(heads, head_dim, *rows.shape[1:])[:, rotary_pairs(head_dim)].reshape(
        rows.shape
    )


def _biased(cfg: ModelConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The tensors a Llama-family block's q, k and v carry, and those its other linears
    carry: weights, and biases under ``bias`` (every linear) or ``qkv_bias`` (those three)."""
    weights, biased = ("weight",), ("weight", "bias")
    return (biased if cfg.attention_biased else weights), (biased if cfg.bias else weights)


# a GPT-2 block's modules → paracube's: its Conv1D linears and its LayerNorms
GPT2_LINEARS = {"attn.c_attn": "attn.qkv_proj", "attn.c_proj": "attn.o_proj",
                "mlp.c_fc": "mlp.up_proj", "mlp.c_proj": "mlp.down_proj"}  # fmt: skip
GPT2_NORMS = {"ln_1": "attn_norm", "ln_2": "mlp_norm"}


def gpt_weights(
    state: dict[str, torch.Tensor], cfg: ModelConfig, kind: str
) -> dict[str, torch.Tensor]:
    """A Hugging Face state dict (as its file holds it) as paracube's GPT's, by name."""
    if HF_FAMILIES[kind] == "gpt2":
        return _gpt2_weights(state, cfg)
    return _llama_weights(state, cfg)


def _llama_weights(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    d, get = cfg.head_dim, state.__getitem__
    out = {
        "embed.tok.weight": get("model.embed_tokens.weight"),
        "norm.weight": get("model.norm.weight"),
    }
    if not cfg.tie_embeddings:
        out["head.weight"] = get("lm_head.weight")
    qkv_params, params = _biased(cfg)
    for i in range(cfg.n_layers):
        hf, me = f"model.layers.{i}.", f"blocks.{i}."
        attn, mlp = hf + "self_attn.", hf + "mlp."
        for p in qkv_params:  # a bias (n·d + 2·n_kv·d,) in the weight's row order
            q, k = (_per_head(get(f"{attn}{n}_proj.{p}"), d) for n in "qk")
            out[f"{me}attn.qkv_proj.{p}"] = torch.cat((q, k, get(f"{attn}v_proj.{p}")))
        for p in params:
            out[f"{me}attn.o_proj.{p}"] = get(f"{attn}o_proj.{p}")
            out[f"{me}mlp.up_proj.{p}"] = torch.cat(
                (get(f"{mlp}gate_proj.{p}"), get(f"{mlp}up_proj.{p}"))
            )
            out[f"{me}mlp.down_proj.{p}"] = get(f"{mlp}down_proj.{p}")
        if cfg.qk_norm:
            for n in "qk":
                out[f"{me}attn.{n}_norm.weight"] = get(f"{attn}{n}_norm.weight")[rotary_pairs(d)]
        out[me + "attn_norm.weight"] = get(hf + "input_layernorm.weight")
        out[me + "mlp_norm.weight"] = get(hf + "post_attention_layernorm.weight")
    return out


def _gpt2_weights(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    # a saved GPT2LMHeadModel's names start with "transformer."; a GPT2Model's do not
    prefix = "transformer." if "transformer.wte.weight" in state else ""

    def get(name: str) -> torch.Tensor:
        return state[prefix + name]

    out = {
        "embed.tok.weight": get("wte.weight"),
        "embed.pos.weight": get("wpe.weight"),
        "norm.weight": get("ln_f.weight"),
        "norm.bias": get("ln_f.bias"),
    }
    if not cfg.tie_embeddings:
        out["head.weight"] = state["lm_head.weight"]
    for i in range(cfg.n_layers):
        hf, me = f"h.{i}.", f"blocks.{i}."
        for theirs, ours in GPT2_LINEARS.items():
            out[me + ours + ".weight"] = get(hf + theirs + ".weight").t().contiguous()  # (in, out)ᵀ
            out[me + ours + ".bias"] = get(hf + theirs + ".bias")
        for theirs, ours in GPT2_NORMS.items():
            for p in ("weight", "bias"):
                out[f"{me}{ours}.{p}"] = get(f"{hf}{theirs}.{p}")
    return out


def import_hf(directory: str, out: str) -> ModelConfig:
    """Write ``directory``'s weights (model.safetensors or its shards) as paracube's GPT
    weights to ``out``: every parameter of the GPT the config describes, at its shape, fp32."""
    from safetensors.torch import load_file, save_file

    from paracube.checkpoint.export import MODEL_KEY
    from paracube.models.gpt import parameter_shapes
    from paracube.models.hf import check_weights

    data = read_hf_config(directory)
    cfg = imported_config(data)
    files = hf_weight_files(directory)
    if not files:
        raise ConfigError(
            f"paracube import: no {WEIGHTS_FILE} (or {WEIGHTS_INDEX} and its shards) in "
            f"{directory}: the weights to import"
        )
    check_weights(directory)  # every tensor the config's HF model has, at its shape
    state = {name: t for path in files for name, t in load_file(path).items()}
    weights = gpt_weights(state, cfg, data["model_type"])
    want = parameter_shapes(cfg)
    tied = {"head.weight"} if cfg.tie_embeddings else set()
    for name, shape in want.items():
        if name in tied:
            continue
        if tuple(weights[name].shape) != tuple(shape):
            raise ConfigError(
                f"paracube import: {name} would be {tuple(weights[name].shape)} from {directory}, "
                f"but the config's model has {tuple(shape)}: the weights are not this config's"
            )
    tensors = {name: t.to(torch.float32).contiguous() for name, t in weights.items()}
    save_file(
        tensors,
        out,
        metadata={MODEL_KEY: json.dumps(dataclasses.asdict(cfg)), "step": "0", "source": directory},
    )
    return cfg


# -- paracube's GPT as a Hugging Face model (paracube export CKPT --out FOLDER) ----------


def hf_family(cfg: ModelConfig) -> str:
    """The ``model_type`` a GPT of this shape is in ``transformers``: llama (RMSNorm, SwiGLU,
    rotary positions; qwen3 with per-head q/k norms, qwen2 with q, k and v alone biased) or
    gpt2 (LayerNorm, GELU, learned positions, biased, one key head a query head); refused,
    with the reason, otherwise."""
    if cfg.moe:
        raise ConfigError("a mixture of experts is planned, not built: nothing to export")
    if (cfg.norm, cfg.activation, cfg.position) == ("rmsnorm", "swiglu", "rope"):
        if cfg.qk_norm and cfg.attention_biased:
            raise ConfigError(
                "per-head q/k norms with biases: Qwen3's projections have none, so no "
                "Hugging Face architecture holds this GPT; export a .safetensors file"
            )
        if cfg.qkv_bias:
            return "qwen2"
        return "qwen3" if cfg.qk_norm else "llama"
    gpt2 = (cfg.norm, cfg.activation, cfg.position, cfg.bias) == (
        "layernorm",
        "gelu",
        "learned",
        True,
    )
    if gpt2 and cfg.n_kv_heads == cfg.n_heads and cfg.head_size is None:
        return "gpt2"
    raise ConfigError(
        f"paracube's GPT with {cfg.norm}, {cfg.activation}, {cfg.position} positions"
        f"{', biases' if cfg.bias else ''} and {cfg.n_kv_heads} of {cfg.n_heads} key heads "
        "is no Hugging Face architecture (Llama's: RMSNorm, SwiGLU, rotary; GPT-2's: "
        "LayerNorm, GELU, learned, biased, a key head a query head); export a .safetensors file"
    )


def hf_config_of(cfg: ModelConfig) -> dict:
    """The config.json of the Hugging Face model that is this GPT (:func:`hf_family`), as
    ``transformers``' own config class writes it; no dropout, as paracube trained it."""
    from transformers import AutoConfig

    kind = hf_family(cfg)
    if kind == "gpt2":
        fields: dict = dict(
            n_embd=cfg.hidden, n_layer=cfg.n_layers, n_head=cfg.n_heads,
            n_inner=cfg.ffn_hidden, n_positions=cfg.seq_len, vocab_size=cfg.vocab_size,
            layer_norm_epsilon=cfg.norm_eps, activation_function="gelu_new",
            initializer_range=cfg.init_std, tie_word_embeddings=cfg.tie_embeddings,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
    else:
        rope: dict = {"rope_type": "default", "rope_theta": cfg.rope_theta}
        if cfg.rope_scaling != "none":
            rope.update(rope_type=cfg.rope_scaling, factor=cfg.rope_factor)
        if cfg.rope_scaling == "llama3":
            rope.update(
                low_freq_factor=cfg.rope_low_freq_factor,
                high_freq_factor=cfg.rope_high_freq_factor,
                original_max_position_embeddings=cfg.rope_original_context,
            )
        fields = dict(
            hidden_size=cfg.hidden, num_hidden_layers=cfg.n_layers,
            num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
            head_dim=cfg.head_dim, intermediate_size=cfg.ffn_hidden, hidden_act="silu",
            max_position_embeddings=cfg.seq_len, vocab_size=cfg.vocab_size,
            rms_norm_eps=cfg.norm_eps, initializer_range=cfg.init_std,
            tie_word_embeddings=cfg.tie_embeddings, rope_parameters=rope, attention_dropout=0.0,
        )  # fmt: skip
        if kind == "llama":
            fields.update(attention_bias=cfg.bias, mlp_bias=cfg.bias)
        elif kind == "qwen3":
            fields["attention_bias"] = False
    architecture = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM",
                    "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[kind]  # fmt: skip
    data = AutoConfig.for_model(kind, **fields).to_dict()
    data["architectures"] = [architecture]
    return data


def hf_weights(weights: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """paracube's GPT weights (by serial name) as the Hugging Face model's state dict —
    :func:`gpt_weights` undone; a tied head is left to the embedding, as save_pretrained
    leaves it."""
    kind = hf_family(cfg)
    back = _gpt2_back(weights, cfg) if kind == "gpt2" else _llama_back(weights, cfg)
    return {name: t.contiguous() for name, t in back.items()}


def _to_hf_order(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """:func:`_per_head` undone: each head's rows back in Hugging Face's rotary order."""
    heads = rows.shape[0] // head_dim
    undo = torch.argsort(rotary_pairs(head_dim))
    return rows.view(heads, head_dim, *rows.shape[1:])[:, undo].reshape(rows.shape)


def _llama_back(w: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    d, kv = cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    out = {
        "model.embed_tokens.weight": w["embed.tok.weight"],
        "model.norm.weight": w["norm.weight"],
    }
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = w["head.weight"]
    qkv_params, params = _biased(cfg)
    for i in range(cfg.n_layers):
        me, hf = f"blocks.{i}.", f"model.layers.{i}."
        attn, mlp = hf + "self_attn.", hf + "mlp."
        for p in qkv_params:
            q, k, v = w[f"{me}attn.qkv_proj.{p}"].split([cfg.q_dim, kv, kv])
            out[f"{attn}q_proj.{p}"], out[f"{attn}k_proj.{p}"] = (
                _to_hf_order(q, d),
                _to_hf_order(k, d),
            )
            out[f"{attn}v_proj.{p}"] = v
        for p in params:
            out[f"{attn}o_proj.{p}"] = w[f"{me}attn.o_proj.{p}"]
            gate, up = w[f"{me}mlp.up_proj.{p}"].chunk(2)
            out[f"{mlp}gate_proj.{p}"], out[f"{mlp}up_proj.{p}"] = gate, up
            out[f"{mlp}down_proj.{p}"] = w[f"{me}mlp.down_proj.{p}"]
        if cfg.qk_norm:
            for n in "qk":
                out[f"{attn}{n}_norm.weight"] = _to_hf_order(w[f"{me}attn.{n}_norm.weight"], d)
        out[hf + "input_layernorm.weight"] = w[me + "attn_norm.weight"]
        out[hf + "post_attention_layernorm.weight"] = w[me + "mlp_norm.weight"]
    return out


def _gpt2_back(w: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    out = {
        "transformer.wte.weight": w["embed.tok.weight"],
        "transformer.wpe.weight": w["embed.pos.weight"],
        "transformer.ln_f.weight": w["norm.weight"],
        "transformer.ln_f.bias": w["norm.bias"],
    }
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = w["head.weight"]
    for i in range(cfg.n_layers):
        me, hf = f"blocks.{i}.", f"transformer.h.{i}."
        for theirs, ours in GPT2_LINEARS.items():
            out[f"{hf}{theirs}.weight"] = w[f"{me}{ours}.weight"].t()  # Conv1D: (in, out)
            out[f"{hf}{theirs}.bias"] = w[f"{me}{ours}.bias"]
        for theirs, ours in GPT2_NORMS.items():
            for p in ("weight", "bias"):
                out[f"{hf}{theirs}.{p}"] = w[f"{me}{ours}.{p}"]
    return out
