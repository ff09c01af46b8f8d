"""paracube's own GPT, built from a Hugging Face config's shape (``hf_model_config``), computes
what ``transformers``' model of that family computes, given the same weights — the rotary
base, the per-head q and k norms before the rotary positions, grouped-query attention, the
decoupled head size, SwiGLU's gate and up, the norms' epsilon and a tied embedding are the
family's, not look-alikes. So a preset written from a model card (``llama3-8b``,
``qwen3-8b``) trains that model's function, not only its parameter count.

The one difference is the layout of the rotary pairs: paracube rotates (x[2i], x[2i+1]) as
RoFormer writes it (Su et al. 2021, eq. 34), Hugging Face rotates (x[i], x[i + d/2])
("rotate_half"). Both turn pair i by position·θ_i, so the same function is the q and k
projections' rows (and the q/k norms' weights) permuted within each head:
paracube's dim 2i is HF's dim i, its dim 2i + 1 is HF's dim i + d/2.
"""

from __future__ import annotations

import pytest
import torch

from paracube.models.gpt import GPT
from paracube.models.sources import hf_model_config, read_hf_config
from tests.test_hf_models import model_dir

pytest.importorskip("transformers")

SEQ = 32


def rotary_pairs(head_dim: int) -> torch.Tensor:
    """For each of paracube's dims within a head, the HF dim it holds: 0, d/2, 1, d/2 + 1, …"""
    half = torch.arange(head_dim // 2)
    return torch.stack((half, half + head_dim // 2), dim=1).flatten()


def per_head(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """A projection's rows (n·d, …) with each head's d rows put in paracube's rotary order."""
    order = rotary_pairs(head_dim)
    heads = rows.shape[0] // head_dim
    return rows.view(heads, head_dim, *rows.shape[1:])[:, order].reshape(rows.shape)


def gpt_weights_from_hf(hf_state: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """A Llama-family HF state dict as paracube's GPT's: q|k|v and gate|up fused, the q and k
    rows (and their norms) in paracube's rotary order."""
    d = cfg.head_dim
    out = {
        "embed.tok.weight": hf_state["model.embed_tokens.weight"],
        "norm.weight": hf_state["model.norm.weight"],
        "head.weight": hf_state.get("lm_head.weight", hf_state["model.embed_tokens.weight"]),
    }
    for i in range(cfg.n_layers):
        hf, me = f"model.layers.{i}.", f"blocks.{i}."
        attn = hf + "self_attn."
        q, k = (per_head(hf_state[attn + f"{p}_proj.weight"], d) for p in "qk")
        out[me + "attn.qkv_proj.weight"] = torch.cat((q, k, hf_state[attn + "v_proj.weight"]))
        if cfg.bias:
            qb, kb = (per_head(hf_state[attn + f"{p}_proj.bias"], d) for p in "qk")
            out[me + "attn.qkv_proj.bias"] = torch.cat((qb, kb, hf_state[attn + "v_proj.bias"]))
        if cfg.qk_norm:
            for p in "qk":
                out[me + f"attn.{p}_norm.weight"] = hf_state[attn + f"{p}_norm.weight"][
                    rotary_pairs(d)
                ]
        out[me + "attn.o_proj.weight"] = hf_state[attn + "o_proj.weight"]
        out[me + "attn_norm.weight"] = hf_state[hf + "input_layernorm.weight"]
        out[me + "mlp_norm.weight"] = hf_state[hf + "post_attention_layernorm.weight"]
        mlp = hf + "mlp."
        out[me + "mlp.up_proj.weight"] = torch.cat(
            (hf_state[mlp + "gate_proj.weight"], hf_state[mlp + "up_proj.weight"])
        )
        out[me + "mlp.down_proj.weight"] = hf_state[mlp + "down_proj.weight"]
    return out


# Qwen2 biases its q, k and v projections only; paracube's GPT has one bias switch, so as
# Qwen2 it also carries o, gate|up and down biases — zero here, where Qwen2 has none
ZERO_BIASES = ("attn.o_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias")


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_paracubes_gpt_computes_the_hf_models_function(family):
    """Same weights, same tokens, float64: the logits agree to 1e-6 — the rounding of HF's
    RMSNorm, which computes in float32 whatever the model's dtype (HF's rotary order kept
    moves them by 6e-3 to 0.3, below; a rotary base 3× off by 2e-3 to 8e-2) — and the converted state fills every
    parameter of paracube's GPT but Qwen2's extra biases."""
    from transformers import AutoModelForCausalLM

    from paracube.models.hf import hf_config_object

    directory = model_dir(family)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(hf_config_object(directory), dtype=torch.float64)
    cfg = hf_model_config(read_hf_config(directory), SEQ)
    gpt = GPT(cfg).to(torch.float64)
    missing, unexpected = gpt.load_state_dict(
        gpt_weights_from_hf(hf.state_dict(), cfg), strict=False
    )
    assert not unexpected
    assert all(name.endswith(ZERO_BIASES) for name in missing) and (bool(missing) == cfg.bias)
    with torch.no_grad():
        for name in missing:
            gpt.get_parameter(name).zero_()
    tokens = torch.randint(0, cfg.vocab_size, (2, SEQ))
    with torch.no_grad():
        want = hf(input_ids=tokens).logits
        got = gpt(tokens)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_rotary_order_matters():
    """The check can fail: Qwen3's weights loaded without the per-head permutation give
    other logits."""
    from transformers import AutoModelForCausalLM

    from paracube.models.hf import hf_config_object

    directory = model_dir("qwen3")
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(hf_config_object(directory), dtype=torch.float64)
    cfg = hf_model_config(read_hf_config(directory), SEQ)
    state = gpt_weights_from_hf(hf.state_dict(), cfg)
    for i in range(cfg.n_layers):  # HF's own row order back
        attn = hf.model.layers[i].self_attn
        state[f"blocks.{i}.attn.qkv_proj.weight"] = torch.cat(
            (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
        ).detach()
    gpt = GPT(cfg).to(torch.float64)
    gpt.load_state_dict(state)
    tokens = torch.randint(0, cfg.vocab_size, (2, SEQ))
    with torch.no_grad():
        gap = (gpt(tokens) - hf(input_ids=tokens).logits).abs().max()
    assert gap > 1e-3
