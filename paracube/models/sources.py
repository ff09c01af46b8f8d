"""Where a model comes from — torch-free, so the CLI checks a job before starting ranks.

``--model`` takes one of three forms:

- a preset name (``tiny``, ``llama2-7b`` …): paracube's reference GPT;
- a Hugging Face model — ``hf:DIR`` or ``hf:DIR/config.json``, or a directory holding a
  ``config.json`` — read locally (nothing is downloaded), with weights from its
  ``model.safetensors`` when present, else initialised from the seed;
- a user factory ``package.module:function`` returning a
  :class:`paracube.models.spec.ModelSpec`.

For a Hugging Face config, its shape is read into a :class:`~paracube.config.ModelConfig`
(the planner's and the validator's view of the model); the families listed in
:data:`HF_FAMILIES` are the ones whose tensor-parallel plan and pipeline chain paracube
ships (:mod:`paracube.models.hf`).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

from paracube.choices import ROUTER_SCORES
from paracube.config import ModelConfig
from paracube.errors import ConfigError

# model_type → the plan family (paracube.models.hf): Llama's decoder layout is shared by
# Mistral, Qwen2 (q/k/v biases, which the column-parallel layers keep) and Qwen3 (a head
# size of its own — head_dim — and per-head q/k norms, replicated with their gradients
# summed over tp).
HF_FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama",
               "gpt2": "gpt2", "mixtral": "llama", "qwen3_moe": "llama",
               "qwen2_moe": "llama", "glm4_moe": "llama", "deepseek_v2": "llama",
               "deepseek_v3": "llama", "kimi_k2": "llama", "gpt_oss": "llama",
               "llama4_text": "llama", "llama4": "llama", "gemma": "llama", "gemma2": "llama",
               "gemma3_text": "llama", "gemma3": "llama"}  # fmt: skip
# Mixtral is Mistral's decoder with a mixture of experts for its MLP: planned (its experts
# from num_local_experts and num_experts_per_tok), not trained — paracube builds dense models.
# Qwen3-MoE is Qwen3's decoder with one (num_experts of moe_intermediate_size, top
# num_experts_per_tok; Qwen3-30B-A3B, Qwen3-235B-A22B), Qwen2-MoE Qwen2's with one and a
# shared expert (shared_expert_intermediate_size; Qwen2-57B-A14B): planned likewise, the
# blocks a config makes dense (mlp_only_layers, decoder_sparse_step: transformers'
# Qwen3MoeDecoderLayer and Qwen2MoeDecoderLayer) with an MLP of intermediate_size. GLM-4.5
# (glm4_moe) is a GQA decoder whose first first_k_dense_replace blocks are dense
# (intermediate_size) and the rest a mixture with n_shared_experts shared ones: planned
# likewise, its rotary positions over every head dimension (it rotates half of them,
# partial_rotary_factor — element-wise work the plan barely sees) and its multi-token
# prediction modules (num_nextn_predict_layers) planned as Megatron-Core trains them.
# DeepSeek-V2/V3
# and Kimi K2 (deepseek_v2, deepseek_v3, kimi_k2) are the same mixture (every
# moe_layer_freq-th block after the first first_k_dense_replace) behind a multi-head latent
# attention (q_lora_rank — null: none —, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
# v_head_dim): planned likewise, their router's groups and bias not told apart (an h × E
# matrix either way). GPT-OSS (gpt_oss) is a mixture (num_local_experts, top
# num_experts_per_tok, biased experts) whose blocks attend over a sliding_window in turn
# with full attention (layer_types): planned likewise, its window where layer_types says,
# its attention sinks (a logit a head, one more softmax column) and its clamped SwiGLU
# counted as the plain ones. Llama 4 (llama4_text, or llama4's text_config) is a mixture
# (num_local_experts, top num_experts_per_tok, a shared expert of intermediate_size) in
# every interleave_moe_layer_step-th block, the others dense (intermediate_size_mlp), whose
# rotary blocks attend within chunks of attention_chunk_size and whose every fourth
# (no_rope_layers 0) attends fully without positions: planned likewise, its weightless
# q/k L2 norms as Qwen3's per-head norms. Gemma 3 (gemma3_text, or gemma3's text_config)
# is a GQA decoder with per-head q/k norms, four norms a block (its post-attention and
# post-feed-forward norms: post_norms), a GeGLU MLP (tanh GELU on the gate: the same three
# matrices as SwiGLU, planned as them) and a sliding_window in five blocks of six
# (layer_types, or sliding_window_pattern): planned likewise, its embedding's √h scale and
# its norms' 1 + w not told apart. Gemma (gemma) is the GeGLU decoder without them: two
# norms a block, no q/k norms, no window. Gemma 2 (gemma2) is Gemma 3's block without
# the q/k norms, its sliding_window in every other block (from the first: transformers'
# Gemma2DecoderLayer), and logit soft-capping — c·tanh(x/c) on each attention score
# (attn_logit_softcapping) and on each output logit (final_logit_softcapping): planned
# likewise, the scores' cap inside FlashAttention-2's kernel and the logits' as its passes
# over them; its query_pre_attn_scalar (the scores' scale) not told apart.
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
WEIGHTS_FILE = "model.safetensors"
# a checkpoint saved in shards (save_pretrained above its max_shard_size, every published
# model of a few billion parameters): model-0000i-of-0000n.safetensors, and this index —
# {"weight_map": {tensor name: shard file}}
WEIGHTS_INDEX = "model.safetensors.index.json"


def hf_weight_files(directory: str) -> list[str]:
    """The safetensors files of a Hugging Face model's weights: the shards its index names,
    or its one model.safetensors; none for a config alone (random weights from the seed).
    A shard the index names but the folder lacks is refused."""
    index = os.path.join(directory, WEIGHTS_INDEX)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{index}: not a safetensors index ({e})") from None
        missing = [s for s in shards if not os.path.isfile(os.path.join(directory, s))]
        if missing:
            raise ConfigError(
                f"{index} names {missing[0]}, which is not in {directory}: copy every shard "
                f"({len(shards)} files)"
            )
        return [os.path.join(directory, s) for s in shards]
    single = os.path.join(directory, WEIGHTS_FILE)
    return [single] if os.path.isfile(single) else []


@dataclass(frozen=True)
class ModelSource:
    """``kind`` is ``preset``, ``hf`` or ``factory``; ``where`` the preset name, the HF
    model directory, or ``module:function``."""

    kind: str
    where: str

    @property
    def spec(self) -> str | None:
        """What the ranks rebuild the model from (None: the preset's GPT)."""
        return None if self.kind == "preset" else f"{self.kind}:{self.where}"


def source_of(text: str) -> ModelSource:
    """A :attr:`TrainConfig.model_source` (``hf:DIR``, ``factory:pkg.mod:fn``) back as a
    :class:`ModelSource`."""
    kind, _, where = text.partition(":")
    return ModelSource(kind, where)


def parse_model(text: str) -> ModelSource:
    """``--model``'s value: a preset, ``hf:PATH``, a model directory, or ``module:function``."""
    from paracube.models.presets import PRESETS

    if text.startswith("hf:"):
        return ModelSource("hf", hf_directory(text[3:]))
    if text.startswith("factory:"):
        text = text[len("factory:") :]
    elif text in PRESETS:
        return ModelSource("preset", text)
    elif os.path.isdir(text) or text.endswith(".json"):
        return ModelSource("hf", hf_directory(text))
    if _FACTORY.match(text):
        return ModelSource("factory", text)
    raise ConfigError(
        f"unknown --model {text!r}: give a preset ({', '.join(PRESETS)}), hf:DIR with a "
        "Hugging Face config.json, or a factory package.module:function"
    )


def hf_directory(path: str) -> str:
    """The directory of a Hugging Face model given as its directory or its config.json."""
    directory = (os.path.dirname(path) or ".") if path.endswith(".json") else path
    config = os.path.join(directory, "config.json")
    if not os.path.isfile(config):
        raise ConfigError(
            f"--model hf:{path}: no config.json at {config}; give a local model directory "
            "(nothing is downloaded)"
        )
    return directory


def read_hf_config(directory: str) -> dict:
    path = os.path.join(directory, "config.json")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--model hf:{directory}: cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--model hf:{directory}: {path} is not a JSON object")
    kind = data.get("model_type")
    if kind not in HF_FAMILIES:
        why = f" (not modelled: {NOT_MODELLED[kind]})" if kind in NOT_MODELLED else ""
        raise ConfigError(
            f"--model hf:{directory}: model_type {kind!r} is not a supported architecture{why}: "
            f"supported are {', '.join(HF_FAMILIES)} (or write a factory returning a ModelSpec)"
        )
    return data


# Architectures users ask for that neither paracube's GPT nor the planner has the parts of:
# what is missing, named in the refusal (transformers' model_type → the parts)
NOT_MODELLED = {
    "gpt_neox": "its parallel attention and MLP (use_parallel_residual) beside partial rotary "
    "positions",
}


# the dropout probabilities of the supported configs: paracube trains without dropout
# (as Megatron's large-model recipes do) so that every layout computes the same function
HF_DROPOUTS = (
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "attention_dropout",
    "summary_first_dropout",
)


def dropouts_turned_off(data: dict) -> list[str]:
    """``name=p`` of every non-zero dropout of a Hugging Face config (set to 0 in training)."""
    return [
        f"{n}={data[n]:g}"
        for n in HF_DROPOUTS
        if isinstance(data.get(n), (int, float)) and data[n] > 0
    ]


def hf_context(data: dict) -> int:
    """The longest sequence a Hugging Face config's model takes (its position table)."""
    if HF_FAMILIES[data["model_type"]] == "gpt2":
        return data.get("n_positions", 1024)
    return data.get("max_position_embeddings", 2048)


def _rope_theta(get) -> float:
    """The rotary base a config states: transformers 5 writes it in ``rope_parameters``,
    earlier releases at the top level; 10,000 (RoFormer's) where neither says."""
    parameters = get("rope_parameters") or {}
    return parameters.get("rope_theta") or get("rope_theta") or 10000.0


# model types whose q, k and v projections alone are biased (their o_proj and MLPs never
# are), and the config key that says so (None: always) — transformers' Qwen2Attention,
# Qwen2MoeAttention, Glm4MoeAttention
QKV_BIASED = {"qwen2": None, "qwen2_moe": "qkv_bias", "glm4_moe": "attention_bias"}


def _biases(kind: str, get) -> dict:
    """A config's ``bias`` and ``qkv_bias``: q, k and v alone for :data:`QKV_BIASED`
    (Qwen2-MoE's ``qkv_bias`` defaults to True); elsewhere ``attention_bias``, which biases
    the output projection as well (Llama's, with its MLP under ``mlp_bias``: import checks
    the two agree)."""
    if kind in QKV_BIASED:
        key = QKV_BIASED[kind]
        return dict(bias=False, qkv_bias=key is None or bool(get(key, kind == "qwen2_moe")))
    return dict(bias=bool(get("attention_bias")), qkv_bias=False)


def rope_stretch(data: dict) -> tuple[str, dict]:
    """How a config stretches its rotary frequencies: the kind ("default" for none) and, for
    the kinds paracube's GPT builds (paracube.choices.ROPE_SCALINGS), the ModelConfig
    fields. transformers 5 writes it in ``rope_parameters`` (``rope_type``), earlier
    releases in ``rope_scaling`` (``rope_type`` or ``type``)."""
    stated = data.get("rope_parameters") or data.get("rope_scaling") or {}
    kind = stated.get("rope_type") or stated.get("type") or "default"
    fields = {"linear": {"rope_factor": "factor"},
              "llama3": {"rope_factor": "factor", "rope_low_freq_factor": "low_freq_factor",
                         "rope_high_freq_factor": "high_freq_factor",
                         "rope_original_context": "original_max_position_embeddings"}}  # fmt: skip
    if kind not in fields:
        return kind, {}
    missing = [
        key for key in fields[kind].values() if not isinstance(stated.get(key), (int, float))
    ]
    if missing:
        raise ConfigError(
            f"config.json: its rotary stretch {kind!r} gives no number for {missing[0]!r}: "
            "a config transformers wrote has it"
        )
    out: dict = {"rope_scaling": kind}
    for ours, theirs in fields[kind].items():
        out[ours] = (
            int(stated[theirs]) if ours == "rope_original_context" else float(stated[theirs])
        )
    return kind, out


# transformers' defaults where a Qwen MoE config omits a key: (experts, per token, expert
# width, shared expert width) of Qwen3MoeConfig and Qwen2MoeConfig
QWEN_MOE_DEFAULTS = {"qwen3_moe": (128, 8, 768, 0), "qwen2_moe": (60, 4, 1408, 5632)}


def _qwen_moe_experts(data: dict) -> dict:
    """A Qwen MoE config's mixture, as :class:`ModelConfig` fields (transformers' defaults
    where a key is absent, :data:`QWEN_MOE_DEFAULTS`). A block is a mixture where its index
    is not in ``mlp_only_layers`` and (index + 1) is a multiple of ``decoder_sparse_step``;
    the others are dense, their MLP of ``intermediate_size`` (transformers' Qwen2MoeMLP
    and Qwen3MoeMLP at ``config.intermediate_size``)."""
    kind, get = data["model_type"], data.get
    experts, per_token, width, shared = QWEN_MOE_DEFAULTS[kind]
    layers = get("num_hidden_layers", 48)
    dense_only, step = get("mlp_only_layers") or [], get("decoder_sparse_step", 1)
    if not isinstance(step, int) or step < 1:
        raise ConfigError(f"{kind} config: decoder_sparse_step {step!r} must be a positive integer")
    if not all(isinstance(i, int) and 0 <= i < layers for i in dense_only):
        raise ConfigError(
            f"{kind} config: mlp_only_layers {dense_only} must be block indices from 0 to "
            f"num_hidden_layers - 1 = {layers - 1}"
        )
    dense = tuple(sorted({*dense_only, *(i for i in range(layers) if (i + 1) % step)}))
    if len(dense) == layers:
        raise ConfigError(
            f"{kind} config: mlp_only_layers {dense_only} and decoder_sparse_step {step} leave "
            f"every one of its {layers} blocks dense: plan it as a dense model "
            f"({kind.removesuffix('_moe')})"
        )
    return dict(
        ffn_hidden=get("moe_intermediate_size", width),
        experts=get("num_experts", experts),
        experts_per_token=get("num_experts_per_tok", per_token),
        shared_expert_ffn=get("shared_expert_intermediate_size", shared),
        dense_layers=dense,
        dense_ffn=get("intermediate_size", 0) if dense else 0,
        **_router(data),
    )


# A router's weighing where its config leaves a key out, per model type, as transformers'
# config classes default them: (scoring_func, norm_topk_prob, an expert bias that chooses
# but does not weigh — DeepseekV3's topk_method "noaux_tc", GLM-4.5's e_score_correction_bias
# —, routed_scaling_factor). Mixtral, GPT-OSS: a softmax over the top k logits (the defaults).
ROUTER_DEFAULTS = {
    "deepseek_v2": ("softmax", False, False, 1.0),
    "deepseek_v3": ("sigmoid", True, True, 2.5),
    "kimi_k2": ("sigmoid", True, True, 2.5),
    "glm4_moe": ("sigmoid", True, True, 1.0),
    "qwen2_moe": ("softmax", False, False, 1.0),
    "qwen3_moe": ("softmax", False, False, 1.0),
}


def _router(data: dict) -> dict:
    """A mixture's router weighing (``ModelConfig.router_*``) from its config's
    ``scoring_func``, ``norm_topk_prob``, ``topk_method`` (``noaux_tc``: the expert bias)
    and ``routed_scaling_factor``, :data:`ROUTER_DEFAULTS` where absent; GLM-4.5's router
    always scores by sigmoid beside its correction bias (transformers' Glm4MoeTopkRouter)."""
    kind, get = data["model_type"], data.get
    score, renorm, bias, scale = ROUTER_DEFAULTS[kind]
    if kind != "glm4_moe":
        score = get("scoring_func", score)
        bias = get("topk_method", "noaux_tc" if bias else "greedy") == "noaux_tc"
    renorm, scale = get("norm_topk_prob", renorm), get("routed_scaling_factor", scale)
    if score not in ROUTER_SCORES:
        raise ConfigError(
            f"{kind} config: scoring_func {score!r} is not planned: choose "
            f"{' or '.join(ROUTER_SCORES)}"
        )
    if not isinstance(renorm, bool):
        raise ConfigError(f"{kind} config: norm_topk_prob {renorm!r} must be true or false")
    if isinstance(scale, bool) or not (isinstance(scale, (int, float)) and 0 < scale < math.inf):
        raise ConfigError(
            f"{kind} config: routed_scaling_factor {scale!r} must be a positive number"
        )
    return dict(
        router_score=score,
        router_renorm=renorm,
        router_expert_bias=bias,
        router_scale=float(scale),
    )


# the keys a GLM-4.5, DeepSeek-V2/V3 or Kimi K2 config gives for its mixture (transformers'
# Glm4MoeConfig and DeepseekV3Config write them), and for a latent attention
MIXTURE_KEYS = (
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "first_k_dense_replace",
)
LATENT_KEYS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
LATENT_ATTENTION = ("deepseek_v2", "deepseek_v3", "kimi_k2")


def _given(data: dict, keys: tuple[str, ...]) -> None:
    kind = data["model_type"]
    missing = [key for key in keys if not isinstance(data.get(key), int)]
    if missing:
        raise ConfigError(
            f"{kind} config: no integer {missing[0]!r}: a config transformers wrote gives "
            f"{', '.join(keys)}"
        )


def _routed_experts(data: dict) -> dict:
    """A GLM-4.5, DeepSeek-V2/V3 or Kimi K2 config's mixture, as :class:`ModelConfig`
    fields: ``n_routed_experts`` of ``moe_intermediate_size``, ``num_experts_per_tok`` a
    token, ``n_shared_experts`` shared ones of that width (Megatron's
    --moe-shared-expert-intermediate-size is their sum); ``n_group`` groups of experts of
    which ``topk_group`` are a token's (group-limited routing, where n_group > 1); the first
    ``first_k_dense_replace`` blocks — and, after them, those off every ``moe_layer_freq``-th
    — dense at ``intermediate_size`` (transformers' Glm4MoeDecoderLayer, DeepseekV3's);
    ``num_nextn_predict_layers`` multi-token prediction modules (transformers loads none
    of them, Megatron-Core trains them under --mtp-num-layers)."""
    kind = data["model_type"]
    _given(data, MIXTURE_KEYS)
    mtp = data.get("num_nextn_predict_layers") or 0
    if not isinstance(mtp, int) or mtp < 0:
        raise ConfigError(
            f"{kind} config: num_nextn_predict_layers {mtp!r} must be 0 or a positive integer"
        )
    layers, first = data.get("num_hidden_layers", 32), data["first_k_dense_replace"]
    step = data.get("moe_layer_freq", 1)
    if not isinstance(step, int) or step < 1:
        raise ConfigError(f"{kind} config: moe_layer_freq {step!r} must be a positive integer")
    dense = tuple(i for i in range(layers) if i < first or i % step)
    width = data["moe_intermediate_size"]
    groups = data.get("n_group") or 1
    return dict(
        route_groups=groups if groups > 1 else 0,
        route_group_topk=(data.get("topk_group") or groups) if groups > 1 else 0,
        ffn_hidden=width,
        experts=data["n_routed_experts"],
        experts_per_token=data["num_experts_per_tok"],
        shared_expert_ffn=data["n_shared_experts"] * width,
        dense_layers=dense,
        dense_ffn=data.get("intermediate_size", 0) if dense else 0,
        mtp_layers=mtp,
        **_router(data),
    )


def _latent_attention(data: dict) -> dict:
    """A DeepSeek-V2/V3 or Kimi K2 config's multi-head latent attention, as
    :class:`ModelConfig` fields (``q_lora_rank`` null: the queries projected directly)."""
    _given(data, LATENT_KEYS)
    q_lora = data.get("q_lora_rank") or 0
    return dict(
        kv_lora_rank=data["kv_lora_rank"],
        q_lora_rank=q_lora,
        head_size=data["qk_nope_head_dim"],
        rope_head_dim=data["qk_rope_head_dim"],
        v_head_dim=data["v_head_dim"],
        n_kv_heads=data.get("num_attention_heads", 32),  # every head its own key and value
    )


def hf_model_config(data: dict, seq_len: int | None, vocab_size: int | None = None) -> ModelConfig:
    """The shape of a Hugging Face config as paracube's :class:`ModelConfig`.

    ``seq_len`` defaults to the model's context (max_position_embeddings / n_positions),
    capped at 1024 so a default run fits a CPU. ``vocab_size`` overrides the config's (a
    tokenized dataset's vocabulary)."""
    if data["model_type"] in ("llama4", "gemma3"):  # a multimodal config: its language model
        data = {**(data.get("text_config") or {}), "model_type": f"{data['model_type']}_text"}
    kind = data["model_type"]
    get = data.get
    if HF_FAMILIES[kind] == "gpt2":
        hidden = get("n_embd", 768)
        shape = dict(
            n_layers=get("n_layer", 12), hidden=hidden, n_heads=get("n_head", 12),
            ffn_hidden=get("n_inner") or 4 * hidden, norm="layernorm", activation="gelu",
            position="learned", tie_embeddings=get("tie_word_embeddings", True), bias=True,
            norm_eps=get("layer_norm_epsilon", 1e-5), init_std=get("initializer_range", 0.02),
        )  # fmt: skip
    else:
        gemma = kind in GEMMA
        if gemma:
            act = get("hidden_activation") or get("hidden_act") or "gelu_pytorch_tanh"
            if act not in ("gelu_pytorch_tanh", "gelu"):
                raise ConfigError(
                    f"{kind} config: hidden_activation {act!r} is not supported (planned as "
                    "Gemma's GeGLU: use 'gelu_pytorch_tanh')"
                )
        elif get("hidden_act", "silu") != "silu":
            raise ConfigError(
                f"{kind} config: hidden_act {get('hidden_act')!r} is not supported (the plan "
                "shards a SwiGLU MLP; use hidden_act 'silu')"
            )
        hidden, heads = get("hidden_size", 4096), get("num_attention_heads", 32)
        head_dim = get("head_dim") or hidden // heads
        shape = dict(
            n_layers=get("num_hidden_layers", 32), hidden=hidden, n_heads=heads,
            n_kv_heads=get("num_key_value_heads") or heads,
            ffn_hidden=get("intermediate_size", 11008), norm="rmsnorm", activation="swiglu",
            position="rope", tie_embeddings=get("tie_word_embeddings", gemma),
            **_biases(kind, get),
            norm_eps=get("rms_norm_eps", 1e-6), init_std=get("initializer_range", 0.02),
            head_size=None if head_dim * heads == hidden else head_dim,
            qk_norm=kind in ("qwen3", "qwen3_moe", "gemma3_text"),
            post_norms=kind in ("gemma2", "gemma3_text"),
            rope_theta=float(_rope_theta(get)), **rope_stretch(data)[1], **_softcaps(data),
        )  # fmt: skip
        if kind == "mixtral":
            shape.update(
                experts=get("num_local_experts", 8), experts_per_token=get("num_experts_per_tok", 2)
            )
        if kind in QWEN_MOE_DEFAULTS:
            shape.update(_qwen_moe_experts(data))
        if kind == "glm4_moe":
            shape.update(_routed_experts(data), qk_norm=bool(get("use_qk_norm")))
        if kind in LATENT_ATTENTION:
            shape.update(_routed_experts(data), **_latent_attention(data))
        if kind == "gpt_oss":
            shape.update(
                experts=get("num_local_experts", 128),
                experts_per_token=get("num_experts_per_tok", 4),
            )
        if kind == "llama4_text":
            shape.update(_llama4_mixture(data), qk_norm=bool(get("use_qk_norm", True)))
    context = hf_context(data)
    seq = seq_len if seq_len is not None else min(context, 1024)
    if seq > context:
        raise ConfigError(
            f"--seq-len {seq} is longer than the model's context {context}: use --seq-len ≤ {context}"
        )
    return ModelConfig(
        vocab_size=vocab_size or get("vocab_size", 32000),
        seq_len=seq,
        name=f"hf:{kind}",
        **shape,
        **_local_attention(data, seq),
    )


# the Gemma model types: GeGLU MLPs (tanh GELU on the gate) and a tied head by default
GEMMA = ("gemma", "gemma2", "gemma3_text")


def _softcaps(data: dict) -> dict:
    """A Gemma config's logit soft caps as :class:`ModelConfig` fields: its
    ``attn_logit_softcapping`` and ``final_logit_softcapping`` (transformers' Gemma2Config:
    50 and 30 by default; Gemma 3's: none, null)."""
    kind, get = data["model_type"], data.get
    if kind not in GEMMA:
        return {}
    defaults = (50.0, 30.0) if kind == "gemma2" else (None, None)
    caps = {}
    for key, field, default in zip(
        ("attn_logit_softcapping", "final_logit_softcapping"),
        ("attention_softcap", "logit_softcap"),
        defaults,
    ):
        cap = get(key, default)
        if cap is not None:
            if not (type(cap) in (int, float) and cap > 0):
                raise ConfigError(
                    f"{kind} config: {key} {cap!r} must be a positive number (null: none)"
                )
            caps[field] = float(cap)
    return caps


def _llama4_mixture(data: dict) -> dict:
    """A Llama 4 config's mixture, as :class:`ModelConfig` fields: its ``moe_layers`` (by
    default every ``interleave_moe_layer_step``-th block, transformers' Llama4TextConfig)
    a mixture of ``num_local_experts`` of ``intermediate_size``, ``num_experts_per_tok`` a
    token, beside a shared expert of the same width (Llama4TextMoe's shared_expert); the
    other blocks dense at ``intermediate_size_mlp``."""
    get = data.get
    layers, step = get("num_hidden_layers", 48), get("interleave_moe_layer_step", 1)
    if not (type(step) is int and step >= 1):
        raise ConfigError(
            f"llama4 config: interleave_moe_layer_step {step!r} must be a positive integer"
        )
    moe = get("moe_layers") or list(range(step - 1, layers, step))
    dense = tuple(i for i in range(layers) if i not in moe)
    width = get("intermediate_size", 8192)
    # its router: the sigmoid of the chosen expert's logit, not renormalised (transformers'
    # Llama4Router)
    return dict(
        experts=get("num_local_experts", 16),
        experts_per_token=get("num_experts_per_tok", 1),
        ffn_hidden=width,
        shared_expert_ffn=width,
        dense_layers=dense,
        dense_ffn=get("intermediate_size_mlp", 16384) if dense else 0,
        router_score="sigmoid",
        router_renorm=False,
    )


# the model types whose configs window their attention unless use_sliding_window says not
WINDOWED_BY_DEFAULT = ("mistral", "mixtral", "gpt_oss", "gemma2", "gemma3_text")


def _local_attention(data: dict, seq: int) -> dict:
    """A config's local attention as :class:`ModelConfig` fields, where it is shorter than
    the sequence: ``sliding_window`` where the model uses it (Mistral's and Mixtral's,
    GPT-OSS's; Qwen2's under ``use_sliding_window``), Llama 4's ``attention_chunk_size``.
    The blocks that keep full attention — ``layer_types``' "full_attention" among
    "sliding_attention" or "chunked_attention", or Llama 4's ``no_rope_layers`` zeros
    (transformers' default: every fourth), Gemma 3's ``sliding_window_pattern`` N, or
    Qwen2's first ``max_window_layers`` — must be every N-th block (Megatron-Core's
    --window-attn-skip-freq N) or none."""
    kind, get = data["model_type"], data.get
    if kind == "llama4_text":
        name, field = "attention_chunk_size", "attention_chunk"
        span = get(name, 8192)
        interval = get("no_rope_layer_interval", 4)
        rope = get("no_rope_layers") or [
            int((i + 1) % interval != 0) for i in range(get("num_hidden_layers", 48))
        ]
        types = get("layer_types") or ["chunked_attention" if r else "full_attention" for r in rope]
    else:
        name, field = "sliding_window", "attention_window"
        windowed = get("use_sliding_window", kind in WINDOWED_BY_DEFAULT)
        span = get(name) if windowed else None
        layers = get("num_hidden_layers", 32)
        pattern = get("sliding_window_pattern")  # Gemma 3's older configs: every N-th full
        below = get("max_window_layers")  # Qwen2's: the blocks before it attend fully
        types = get("layer_types") or []
        if not types and type(pattern) is int and pattern > 0:
            types = [
                "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                for i in range(layers)
            ]
        elif not types and kind == "gemma2":  # every other block, from the first
            types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        elif not types and kind == "qwen2" and type(below) is int:
            types = ["sliding_attention" if i >= below else "full_attention" for i in range(layers)]
    if span is None or span >= seq:
        return {}
    if not (type(span) is int and span > 0):
        raise ConfigError(f"{kind} config: {name} {span!r} must be a positive integer")
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    if not full:
        return {field: span}
    if len(full) == len(types):  # every block attends fully
        return {}
    every = full[0] + 1
    if full != list(range(every - 1, len(types), every)):
        raise ConfigError(
            f"{kind} config: layer_types puts full attention in blocks {full[:6]}…: planned "
            "where every N-th block attends fully and the others locally (GPT-OSS: every "
            "2nd, Llama 4: every 4th)"
        )
    return {field: span, "full_attention_every": every}


def source_config(
    source: ModelSource, seq_len: int | None = None, vocab_size: int | None = None
) -> ModelConfig:
    """The :class:`ModelConfig` of a preset or Hugging Face source (torch-free). A factory's
    config comes from calling it (:func:`paracube.models.spec.factory_config`)."""
    if source.kind == "preset":
        from paracube.models.presets import preset

        overrides = {"seq_len": seq_len} if seq_len is not None else {}
        if vocab_size is not None:
            overrides["vocab_size"] = vocab_size
        return preset(source.where, **overrides)
    if source.kind == "hf":
        return hf_model_config(read_hf_config(source.where), seq_len, vocab_size)
    raise ValueError("a factory's config is read by calling it (paracube.models.spec)")
