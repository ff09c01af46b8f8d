"""Hugging Face ``transformers`` causal LMs under every engine — the HF code unchanged.

A model is built from its local ``config.json`` (``AutoModelForCausalLM.from_config``, the
seed's initial values, or the weights of ``model.safetensors`` beside it) and described
to the engines as a :class:`~paracube.models.spec.ModelSpec`:

- **chain** (pipelines): ``embedding → decoder layers … → final norm → lm_head``, the
  module paths of the HF model so every parameter keeps its HF name. A decoder layer is
  called with the hidden states only: its ``forward`` is wrapped (on the instance) to
  supply what ``LlamaModel.forward`` would — the rotary tables for positions 0…T−1 — and
  causal attention comes from SDPA's ``is_causal`` (no mask tensor);
- **tensor-parallel plans** by module name (Shoeybi et al. 2019, §3): q/k/v and gate/up
  column-parallel behind one ``PrepareInput`` on their parent (one collective at the
  entry of attention and of the MLP), o/down row-parallel (one at the exit), embedding
  and head vocabulary-parallel, norms sequence-sharded under SP (Korthikanti et al. 2022);
  GQA's key/value heads split like the query heads (``tp`` must divide both);
- GPT-2's ``Conv1D`` (weight stored (in, out)) is converted to ``nn.Linear`` (out, in) at
  build time, for every layout, so the same plans apply; its weights are transposed when
  written back in HF's layout — :func:`conv1d_weight_names` names them.

Writing a plan for another model: a dict from module-path patterns to styles
(``Colwise``, ``Rowwise``, ``VocabEmbedding``, ``PrepareInput``, ``SequenceSharded``,
``HeadShared``, ``ScatterOutputSP``, ``DivideAttrs``), the chain's module paths in forward order, and the
repeated blocks — see :func:`llama_plan` and the README's "Train your own model".
"""

from __future__ import annotations

import os
import types

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models.gpt import Head, check_tokens
from paracube.models.sources import HF_DROPOUTS, HF_FAMILIES, hf_weight_files, read_hf_config
from paracube.models.spec import Borrowed, ModelSpec, tied_groups
from paracube.tensor_parallel.plan import (
    Colwise,
    DivideAttrs,
    HeadShared,
    PrepareInput,
    Rowwise,
    ScatterOutputSP,
    SequenceSharded,
    VocabEmbedding,
)


def llama_plan(*, qk_norm: bool) -> dict:
    """Llama / Mistral / Qwen2 / Qwen3 (``LlamaDecoderLayer`` names); q, k and v are
    separate projections, so nothing is split section by section. ``qk_norm``: Qwen3's
    per-head q and k norms, which run on this rank's heads (:class:`HeadShared`) — stated,
    not defaulted: a Qwen3 planned without them would sum only its own heads' share of their
    gradients and train wrongly."""
    attn, mlp = "model.layers.*.self_attn", "model.layers.*.mlp"
    norms: dict = (
        {f"{attn}.q_norm": HeadShared(), f"{attn}.k_norm": HeadShared()} if qk_norm else {}
    )
    return {
        **norms,
        "model.embed_tokens": (VocabEmbedding(), ScatterOutputSP()),
        "model.layers.*.input_layernorm": SequenceSharded(),
        attn: PrepareInput(),  # f (or the SP all-gather) once for q, k and v
        f"{attn}.q_proj": Colwise(prepare_input=False),
        f"{attn}.k_proj": Colwise(prepare_input=False),
        f"{attn}.v_proj": Colwise(prepare_input=False),
        f"{attn}.o_proj": Rowwise(),
        "model.layers.*.post_attention_layernorm": SequenceSharded(),
        mlp: PrepareInput(),  # once for gate and up
        f"{mlp}.gate_proj": Colwise(prepare_input=False),
        f"{mlp}.up_proj": Colwise(prepare_input=False),
        f"{mlp}.down_proj": Rowwise(),
        "model.norm": SequenceSharded(),
        "lm_head": Colwise(vocab=True),  # vocabulary-parallel logits (B, T, V_padded/tp)
    }


def gpt2_plan(hidden: int) -> dict:
    """GPT-2 (its ``Conv1D`` converted to ``nn.Linear``): the fused q|k|v split by heads
    section by section; ``split_size`` (the width of each of q, k, v) divided by tp."""
    return {
        "transformer.wte": (VocabEmbedding(), ScatterOutputSP()),
        "transformer.wpe": ScatterOutputSP(),  # (1, T, H) → (1, T/tp, H), added to the tokens'
        "transformer.h.*.ln_1": SequenceSharded(),
        "transformer.h.*.attn": DivideAttrs(("split_size",)),
        "transformer.h.*.attn.c_attn": Colwise(sections=(hidden, hidden, hidden)),
        "transformer.h.*.attn.c_proj": Rowwise(),
        "transformer.h.*.ln_2": SequenceSharded(),
        "transformer.h.*.mlp.c_fc": Colwise(),
        "transformer.h.*.mlp.c_proj": Rowwise(),
        "transformer.ln_f": SequenceSharded(),
        "lm_head": Colwise(vocab=True),
    }


class CausalLM(nn.Module):
    """An HF causal LM run as its chain: tokens (B, T) → logits (B, T, V). Its children
    are the HF model's own (``model``/``transformer`` and ``lm_head``), so parameter names
    are HF's; the chain is a plain list (its modules are registered through them)."""

    def __init__(self, hf: nn.Module, chain: list[nn.Module]):
        super().__init__()
        for name, child in hf.named_children():
            self.add_module(name, child)
        self.chain = chain

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = tokens
        for layer in self.chain:
            x = layer(x)
        return x


class TokenEmbedding(Borrowed):
    """Llama's ``embed_tokens`` with the token check paracube's GPT makes."""

    embed_tokens: nn.Module

    def __init__(self, root: nn.Module, vocab_size: int, seq_len: int):
        super().__init__(root, {"embed_tokens": "model.embed_tokens"})
        self.vocab_size, self.seq_len = vocab_size, seq_len

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) → (B, T, H)
        check_tokens(tokens, self.vocab_size, self.seq_len)
        return self.embed_tokens(tokens)


class PositionalEmbedding(Borrowed):
    """GPT-2's ``wte(tokens) + wpe(positions)`` (``GPT2Model.forward``'s first lines)."""

    wte: nn.Module
    wpe: nn.Module

    def __init__(self, root: nn.Module, vocab_size: int, seq_len: int):
        super().__init__(root, {"wte": "transformer.wte", "wpe": "transformer.wpe"})
        self.vocab_size, self.seq_len = vocab_size, seq_len

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) → (B, T, H)
        check_tokens(tokens, self.vocab_size, self.seq_len)
        positions = torch.arange(tokens.shape[1], device=tokens.device)[None]  # (1, T)
        return self.wte(tokens) + self.wpe(positions)


class RotaryTables:
    """cos/sin for positions 0…T−1 from the model's own rotary module (any RoPE scaling),
    computed once per length and shared by every layer of the rank. Under sequence
    parallelism a layer sees T/tp tokens while attention sees all T: ``shards`` = tp."""

    def __init__(self, rotary: nn.Module):
        self.rotary, self.shards = rotary, 1
        self._cache: dict = {}

    def set_shards(self, shards: int) -> None:
        self.shards = shards

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seq = x.shape[1] * self.shards
        key = (seq, x.device, x.dtype)
        if key not in self._cache:
            self.rotary.to(x.device)
            positions = torch.arange(seq, device=x.device)[None]  # (1, T)
            with torch.no_grad():
                self._cache = {key: self.rotary(x, positions)}  # ((1, T, d), (1, T, d))
        return self._cache[key]


def _wrap_layer(layer: nn.Module, rotary: RotaryTables | None) -> None:
    """Let ``layer(hidden)`` run the HF decoder layer as its model would, returning the
    hidden states; ``layer.paracube_recompute`` recomputes it in backward (full
    recomputation, Chen et al. 2016) inside the call, so ZeRO-3's gather hook runs once."""
    original = layer.forward

    def run(x: torch.Tensor) -> torch.Tensor:
        kw = {"position_embeddings": rotary(x)} if rotary is not None else {}
        out = original(x, **kw)
        return out[0] if isinstance(out, tuple) else out

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) → (B, T, H)
        if self.paracube_recompute and torch.is_grad_enabled():
            return checkpoint(run, x, use_reentrant=False)
        return run(x)

    setattr(layer, "paracube_recompute", False)  # noqa: B010  (an attribute of a foreign class)
    layer.forward = types.MethodType(forward, layer)


def _recompute(unit: nn.Module) -> None:
    setattr(unit, "paracube_recompute", True)  # noqa: B010


def _to_linear(conv) -> nn.Linear:
    """GPT-2's Conv1D (y = x·W + b, W (in, out)) as the nn.Linear it is (W (out, in))."""
    linear = nn.Linear(conv.nx, conv.nf, device=conv.weight.device, dtype=conv.weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.t())
        linear.bias.copy_(conv.bias)
    return linear


def _convert_conv1d(model: nn.Module) -> None:
    from transformers.pytorch_utils import Conv1D

    names = [n for n, m in model.named_modules() if isinstance(m, Conv1D)]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, _to_linear(getattr(parent, child)))


def conv1d_weight_names(data: dict) -> frozenset[str]:
    """The weights GPT-2 stores as Conv1D (in, out) — held here as nn.Linear (out, in)."""
    if HF_FAMILIES.get(data.get("model_type", "")) != "gpt2":
        return frozenset()
    return frozenset(
        f"transformer.h.{i}.{m}.weight"
        for i in range(data.get("n_layer", 12))
        for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    )


def hf_config_object(directory: str):
    """The ``transformers`` config, made ready for training in paracube: SDPA attention,
    no dropout (paracube trains without it, as Megatron's large-model recipes do; the
    same model on every layout), no KV cache."""
    from transformers import AutoConfig

    data = read_hf_config(directory)
    config = AutoConfig.for_model(**data)
    for name in HF_DROPOUTS:
        if hasattr(config, name):
            setattr(config, name, 0.0)
    config.use_cache = False
    config._attn_implementation = "sdpa"
    return config


def build_hf(directory: str, shape: ModelConfig) -> ModelSpec:
    """The model in ``directory`` (config.json, optional model.safetensors) as a spec.
    Every rank builds it whole, from the seed torch was given, then keeps its shards."""
    if shape.moe:  # Mixtral: its config is read for plans; its experts are not sharded here
        raise ConfigError(
            f"--model hf:{directory}: a mixture of experts ({shape.experts} experts) is "
            "planned (paracube plan), not trained: paracube train builds dense models"
        )
    from transformers import AutoModelForCausalLM

    config = hf_config_object(directory)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.get_default_dtype())
    files = hf_weight_files(directory)
    if files and not next(hf.parameters()).is_meta:
        load_weights(hf, files)
    hf.train()
    v, t = shape.vocab_size, shape.seq_len
    if HF_FAMILIES[config.model_type] == "gpt2":
        _convert_conv1d(hf)
        body = hf.transformer
        embed: nn.Module = PositionalEmbedding(hf, v, t)
        layers, final = list(body.h), body.ln_f
        names = [
            "transformer",
            *(f"transformer.h.{i}" for i in range(len(layers))),
            "transformer.ln_f",
        ]
        plan = gpt2_plan(shape.hidden)
        rotary = None
    else:
        body = hf.model
        embed = TokenEmbedding(hf, v, t)
        layers, final = list(body.layers), body.norm
        names = ["model", *(f"model.layers.{i}" for i in range(len(layers))), "model.norm"]
        plan = llama_plan(qk_norm=shape.qk_norm)
        rotary = RotaryTables(body.rotary_emb)
    for layer in layers:
        _wrap_layer(layer, rotary)
    hf.lm_head = Head.padding(hf.lm_head)  # GPT-2's 50,257 rows: padded products on a GPU
    chain = [embed, *layers, final, hf.lm_head]
    return ModelSpec(
        CausalLM(hf, chain), shape, chain, [*names, "lm_head"], layers, plan,
        sequence_parallel=True, recompute_unit=_recompute,
        on_sequence_shards=rotary.set_shards if rotary is not None else None,
    )  # fmt: skip


def check_weights(directory: str) -> None:
    """Before any rank starts: the weights (model.safetensors, or every shard its index
    names) fit the config — shapes from a meta build and the files' headers, no tensor
    read."""
    from transformers import AutoModelForCausalLM

    files = hf_weight_files(directory)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(hf_config_object(directory))
    shapes = {name: shape for path in files for name, shape in _header_shapes(path).items()}
    _check_fits(hf, shapes, _weights_label(files))  # HF's layout (GPT-2's Conv1D unconverted)


def _weights_label(files: list[str]) -> str:
    """How an error names the weights: the one file, or the folder of the shards."""
    return files[0] if len(files) == 1 else f"{os.path.dirname(files[0])} (its {len(files)} shards)"


def _header_shapes(path: str) -> dict[str, tuple[int, ...]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (OSError, SafetensorError) as e:
        raise ConfigError(f"{path}: not a safetensors file ({e})") from None


def _check_fits(hf: nn.Module, shapes: dict[str, tuple[int, ...]], path: str) -> None:
    """Every parameter of ``hf`` in ``shapes`` with its shape (a tied one may be absent),
    and no tensor that is not a parameter; else one line naming the first mismatch."""
    params = dict(hf.named_parameters(remove_duplicate=False))
    tied = {n for group in tied_groups(hf) for n in group[1:]}
    for name, p in params.items():
        if name not in shapes and name not in tied:
            raise ConfigError(
                f"{path}: no tensor {name!r} (shape {tuple(p.shape)}) for this config"
            )
        if name in shapes and shapes[name] != tuple(p.shape):
            raise ConfigError(
                f"{path}: tensor {name!r} has shape {shapes[name]} but the config gives "
                f"{tuple(p.shape)}: weights of another model"
            )
    extra = sorted(set(shapes) - set(params))
    if extra:
        raise ConfigError(f"{path}: tensor {extra[0]!r} is not a parameter of this config")


@torch.no_grad()
def load_weights(hf: nn.Module, files: list[str]) -> None:
    """The weights' files into the HF model as built (before any conversion), one shard
    in memory at a time; checked whole first, from their headers."""
    from safetensors.torch import load_file

    shapes = {name: shape for path in files for name, shape in _header_shapes(path).items()}
    _check_fits(hf, shapes, _weights_label(files))
    params = dict(hf.named_parameters())
    for path in files:
        for name, tensor in load_file(path).items():
            if name in params:
                params[name].copy_(tensor)
