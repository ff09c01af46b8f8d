"""A Hugging Face checkpoint as paracube's own GPT: ``paracube import hf:DIR --out FILE``.

``--model hf:DIR`` trains ``transformers``' module itself. Importing instead writes its
weights in paracube's GPT's layout, as ``paracube export`` writes a checkpoint (the model
config in the safetensors metadata), so that ``paracube train --init-from FILE`` starts
paracube's own GPT — its fused projections, its tensor-parallel plan, its counted memory —
from them, under any layout. The GPT built from the config's shape computes the HF model's
function given these weights (``tests/test_model_vs_hf.py``).

What changes on the way (shapes: n heads of d, H hidden, F the MLP's width):

- Llama, Mistral, Qwen3: q, k, v (n·d, H), (n_kv·d, H) ×2 → one q|k|v (… , H); gate and up
  (F, H) ×2 → one gate|up (2F, H). The rotary pairs: paracube turns (x[2i], x[2i+1]) as
  RoFormer writes it (Su et al. 2021, eq. 34), Hugging Face (x[i], x[i + d/2])
  ("rotate_half"); both turn pair i by position·θ_i, so the q and k rows (and Qwen3's q/k
  norm weights) are put in paracube's order within each head: its dim 2i is HF's dim i,
  its dim 2i + 1 HF's dim i + d/2.
- GPT-2: its Conv1D weights (in, out) transposed to Linear's (out, in); c_attn is already
  q|k|v, learned positions carry over; a tied head is the embedding.

Not imported: Mixtral (paracube's GPT is dense) and Qwen2 (it biases q, k and v only, where
paracube's GPT has one switch for every bias) — both train as ``--model hf:DIR``.
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
    "qwen2": "its q, k and v projections are biased but not its others, and paracube's GPT "
    "has one switch for every bias",
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
    stretch = rope_stretch(data)[0]
    if stretch not in ("default", *ROPE_SCALINGS):
        raise ConfigError(
            f"paracube import: its rotary positions are stretched by {stretch!r}, which "
            f"paracube's GPT does not build ({', '.join(ROPE_SCALINGS[1:])} it does); train it "
            "as --model hf:DIR"
        )
    return hf_model_config(data, hf_context(data))


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
    for i in range(cfg.n_layers):
        hf, me = f"model.layers.{i}.", f"blocks.{i}."
        attn, mlp = hf + "self_attn.", hf + "mlp."
        q, k = (_per_head(get(attn + f"{p}_proj.weight"), d) for p in "qk")
        out[me + "attn.qkv_proj.weight"] = torch.cat((q, k, get(attn + "v_proj.weight")))
        if cfg.qk_norm:
            for p in "qk":
                out[me + f"attn.{p}_norm.weight"] = get(attn + f"{p}_norm.weight")[rotary_pairs(d)]
        out[me + "attn.o_proj.weight"] = get(attn + "o_proj.weight")
        out[me + "attn_norm.weight"] = get(hf + "input_layernorm.weight")
        out[me + "mlp_norm.weight"] = get(hf + "post_attention_layernorm.weight")
        out[me + "mlp.up_proj.weight"] = torch.cat(
            (get(mlp + "gate_proj.weight"), get(mlp + "up_proj.weight"))
        )
        out[me + "mlp.down_proj.weight"] = get(mlp + "down_proj.weight")
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
    linears = {"attn.c_attn": "attn.qkv_proj", "attn.c_proj": "attn.o_proj",
               "mlp.c_fc": "mlp.up_proj", "mlp.c_proj": "mlp.down_proj"}  # fmt: skip
    norms = {"ln_1": "attn_norm", "ln_2": "mlp_norm"}
    for i in range(cfg.n_layers):
        hf, me = f"h.{i}.", f"blocks.{i}."
        for theirs, ours in linears.items():
            out[me + ours + ".weight"] = get(hf + theirs + ".weight").t().contiguous()  # (in, out)ᵀ
            out[me + ours + ".bias"] = get(hf + theirs + ".bias")
        for theirs, ours in norms.items():
            for p in ("weight", "bias"):
                out[f"{me}{ours}.{p}"] = get(f"{hf}{theirs}.{p}")
    return out


def import_hf(directory: str, out: str) -> ModelConfig:
    """Write ``directory``'s weights (model.safetensors or its shards) as paracube's GPT weights to ``out``
    (every parameter of the GPT the config describes, each at its shape, in fp32)."""
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
