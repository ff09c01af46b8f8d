"""Configuration: what to train, how to parallelise it, how to run it.

Keyword-only dataclasses whose ``__post_init__`` checks each value on its own (types,
ranges, names from :mod:`paracube.choices`), so a malformed object cannot exist. How the
values fit together for a job — the model against the tensor-parallel size, the schedule
against the micro-batches, the stages against the layers, the world size, the data — is
checked once per job by :func:`paracube.validate.validate`. Torch-free on purpose: the
CLI validates a whole job before importing torch or starting any process, and the
planner reuses these classes as pure math.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from paracube.choices import (
    ACTIVATIONS,
    AXES,
    BALANCE,
    COMPILE,
    DP_MODES,
    GRAD_REDUCE,
    METRICS_MODES,
    NORMS,
    OFFLOAD,
    ON_NAN,
    POSITIONS,
    PRECISIONS,
    RECOMPUTE,
    ROPE_SCALINGS,
    ROUTER_SCORES,
    ZERO_STAGES,
)
from paracube.errors import ConfigError
from paracube.options import CheckpointConfig
from paracube.pipeline.schedules import SCHEDULES
from paracube.values import MAX_SEED, check_loss_scale, compression, number, positive


def compile_refusal(mode: str, *, recompute: str) -> str | None:
    """What keeps ``paracube train --compile`` from a layout, None if nothing: it traces
    the forward of each block — paracube's GPT's, a Hugging Face model's decoder layers, a
    factory's ``ModelSpec.units`` — while the hooks around it (ZeRO-3's gathers) stay eager,
    so every ZeRO stage compiles, and tensor parallelism's collectives run eager between the
    compiled regions (comm.autograd); but the attention core's checkpoint (selective) is
    not what the memory model counts compiled (models.shapes.block_saved_bytes). The
    planner refuses to emit such a command with it."""
    if mode == "none":
        return None
    if recompute == "selective":
        return (
            "--recompute selective (the attention core's checkpoint inside a compiled block; "
            "use none or full)"
        )
    return None


def compression_with_zero(kind: str, zero: int) -> str | None:
    """The engine's refusal of a compressor a ZeRO stage cannot take, None where they
    compose — the planner's search gives the same reason."""
    if kind in ("topk", "powersgd") and zero >= 2:
        return (
            f"--compress {kind} with --zero {zero} is not supported: a compressed sum has no "
            "reduce-scatter into shards; use --zero 0 or 1, or --compress bf16/fp16 (they work "
            "with every stage)"
        )
    return None


# The engine's refusal, which the planner's search gives as its reason too.
ZERO3_WITH_PIPELINE = (
    "--zero 3 with --pp > 1 is not supported: every micro-batch would re-gather each stage's "
    "parameters; use --zero 1 or --zero 2 with pipeline parallelism"
)


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of the reference decoder-only transformer (``paracube.models.gpt``).

    ``ffn_hidden`` defaults to 4·hidden (GELU MLP); SwiGLU presets give it explicitly.
    ``n_kv_heads`` < ``n_heads`` is grouped-query attention (LLaMA-2 70B, LLaMA-3).
    ``head_size`` decouples the heads' width from ``hidden / n_heads`` (Qwen3-32B: 64 heads
    of 128 over a hidden size of 5,120 — the query projection h → n_heads·d, the output
    projection back); ``qk_norm`` normalises each head's queries and keys over its d values
    before the rotary positions (Qwen3's q_norm and k_norm, OLMo 2's), RMSNorms as the
    block's own norms.
    """

    n_layers: int
    hidden: int
    n_heads: int
    vocab_size: int
    seq_len: int
    n_kv_heads: int = None  # type: ignore[assignment]  # None: = n_heads (set in __post_init__)
    ffn_hidden: int = None  # type: ignore[assignment]  # None: 4·hidden (set in __post_init__)
    norm: str = "layernorm"
    activation: str = "gelu"
    position: str = "learned"
    tie_embeddings: bool = False
    bias: bool = True
    # the q, k and v projections biased where ``bias`` leaves the block's other linears
    # without (Qwen2's and Qwen2-MoE's attention; Megatron-LM's --add-qkv-bias)
    qkv_bias: bool = False
    norm_eps: float = 1e-5
    init_std: float = 0.02
    name: str = "custom"
    # Mixture of experts — planned by ``paracube plan``, not built by paracube's GPT: each
    # block's MLP becomes ``experts`` MLPs of the shape above and a router (an h × experts
    # matrix) that sends every token to ``experts_per_token`` of them (Mixtral 8x7B and
    # Grok-1: 8 and 2). 0 and 0: the dense MLP.
    experts: int = 0
    experts_per_token: int = 0
    # A mixture's group-limited routing (DeepSeek-V3's node-limited routing, §2.1.2: the
    # experts in ``route_groups`` groups of consecutive experts, each token's k chosen from
    # the ``route_group_topk`` groups whose best experts score highest — at most that many
    # nodes when a group is a node's; its config's n_group and topk_group, Megatron-Core's
    # --moe-router-num-groups and --moe-router-group-topk). 0 and 0: any k of all experts.
    route_groups: int = 0
    route_group_topk: int = 0
    # How a mixture's router weighs a token's k experts (Megatron-Core's
    # topk_routing_with_score_function; a config's scoring_func, norm_topk_prob, topk_method
    # and routed_scaling_factor): ``router_score`` softmax (Mixtral, Qwen) or sigmoid
    # (DeepSeek-V3, GLM-4.5, Kimi K2) of the router's logits; ``router_renorm`` the k chosen
    # scores divided by their sum (a softmax over the top k logits is the same), or kept as
    # scored (DeepSeek-V2's and Qwen2-MoE's softmax over all experts: Megatron's
    # --moe-router-pre-softmax); ``router_expert_bias`` a learned per-expert bias added to
    # the scores that choose the experts, not to those that weigh them (DeepSeek-V3's
    # auxiliary-loss-free balancing, §2.1.2: --moe-router-enable-expert-bias);
    # ``router_scale`` the weights' multiplier (DeepSeek-V3's 2.5:
    # --moe-router-topk-scaling-factor). Planned alike: the router's work is the same.
    router_score: str = "softmax"
    router_renorm: bool = True
    router_expert_bias: bool = False
    router_scale: float = 1.0
    # A mixture's shared experts: an MLP of this width (SwiGLU or GELU as the experts) that
    # every token passes beside its k routed ones — DeepSeek-V2/V3's n_shared_experts ×
    # moe_intermediate_size, Qwen2-MoE's shared_expert_intermediate_size; Megatron-Core's
    # SharedExpertMLP, split by tensor parallelism, replicated over the expert-parallel
    # ranks (--moe-shared-expert-intermediate-size). 0: none.
    shared_expert_ffn: int = 0
    # A mixture's dense blocks: the indices of the blocks whose MLP is one dense MLP of
    # ``dense_ffn`` width (0: ffn_hidden) instead of the experts — DeepSeek-V3's and
    # GLM-4.5's first three (first_k_dense_replace), Qwen-MoE's mlp_only_layers, the zeros
    # of Megatron-Core's --moe-layer-freq pattern. The blocks are then of two kinds, each a
    # uniform model of its own (:meth:`block_kind`): the planner sums per kind. (): every
    # block a mixture.
    dense_layers: tuple[int, ...] = ()
    dense_ffn: int = 0
    head_size: int | None = None  # None: hidden // n_heads
    # Multi-head latent attention (DeepSeek-V2 §2.1, DeepSeek-V3, Kimi K2): the keys and
    # values of every head come up from one latent of kv_lora_rank values a token (and a
    # rotary key of rope_head_dim values shared by the heads), the queries from a latent of
    # q_lora_rank (0: projected from the hidden state directly); each head's query and key
    # are head_size (qk_nope_head_dim) + rope_head_dim wide, its value v_head_dim.
    # Megatron-Core's MLASelfAttention. kv_lora_rank 0: standard attention.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    rope_head_dim: int = 0
    v_head_dim: int = 0
    # Multi-token prediction (DeepSeek-V3 §2.2): after the last block, this many modules
    # that each predict one token further — the shared embedding of the next input token and
    # the previous depth's hidden state, each normed, concatenated (2h) and projected back to
    # h, one more block of the last block's kind, and the shared output head with a loss of
    # its own. Megatron-Core's --mtp-num-layers, on the last pipeline stage. 0: none.
    mtp_layers: int = 0
    # Local attention, planned by ``paracube plan`` (paracube's GPT attends fully). A sliding
    # window (Mistral 7B, §2; GPT-OSS; Gemma 2/3): a block's query attends to itself and the
    # ``attention_window`` - 1 keys before it, not to all earlier ones. Chunked attention
    # (Llama 4's attention_chunk_size): the sequence cut into chunks of ``attention_chunk``
    # tokens, a query attending to the keys of its own chunk up to itself. One or the other.
    # ``full_attention_every`` N keeps every N-th block (1-based: blocks N, 2N, …) at full
    # causal attention — GPT-OSS's alternate blocks (2), Llama 4's one in four (4), Gemma
    # 3's one in six (6); 0: every block local. Megatron-Core's --window-size and
    # --window-attn-skip-freq, whose layer numbering this is. 0 and 0: full attention.
    attention_window: int = 0
    attention_chunk: int = 0
    full_attention_every: int = 0
    # Gemma 2/3's sandwich norms: each sub-layer's output normed again before the residual
    # add (their post_attention_layernorm and post_feedforward_layernorm) — four norms a
    # block. Planned by ``paracube plan``; paracube's GPT has the two pre-norms.
    post_norms: bool = False
    # Gemma 2's logit soft-capping, planned by ``paracube plan`` (paracube's GPT has none):
    # x ↦ c·tanh(x/c) on each attention score (``attention_softcap`` c, Gemma 2's 50 —
    # applied inside the fused kernel, FlashAttention-2's or -3's softcap) and on each output
    # logit before the loss (``logit_softcap``, Gemma 2's 30 — three element-wise passes over
    # the logits and their tanh kept for backward). 0: none.
    attention_softcap: float = 0.0
    logit_softcap: float = 0.0
    qk_norm: bool = False
    # the rotary positions' base θ (RoFormer's 10,000; Llama 3's 500,000, Qwen3's 1,000,000):
    # the angle of pair i at position t is t·θ^(−2i/d)
    rope_theta: float = 10000.0
    # rotary frequencies stretched for a long context (paracube.choices.ROPE_SCALINGS):
    # linear divides each by rope_factor; llama3 (Llama 3.1's 8, 1, 4, 8,192) divides those
    # whose wavelength exceeds rope_original_context / rope_low_freq_factor, keeps those
    # under rope_original_context / rope_high_freq_factor, and blends between
    rope_scaling: str = "none"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_context: int = 8192

    def __post_init__(self) -> None:
        for f in ("n_layers", "hidden", "n_heads", "vocab_size", "seq_len"):
            positive(f, getattr(self, f))
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        positive("n_kv_heads", self.n_kv_heads)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        positive("ffn_hidden", self.ffn_hidden)
        number("norm_eps", self.norm_eps, low=0, high=1, open_low=True)
        number("init_std", self.init_std, low=0, high=1, open_low=True)
        number("rope_theta", self.rope_theta, low=1)
        self._check_rope_scaling()
        if self.head_size is not None:
            positive("head_size", self.head_size)
        elif self.hidden % self.n_heads:
            raise ConfigError(
                f"hidden={self.hidden} is not divisible by n_heads={self.n_heads}: "
                "choose a head count that divides the hidden size"
            )
        if self.qk_norm and self.norm != "rmsnorm":
            raise ConfigError(
                f"qk_norm with norm={self.norm!r}: the per-head q and k norms are RMSNorms (Qwen3's, "
                "OLMo 2's), in a block of RMSNorms; use norm='rmsnorm' (--norm rmsnorm)"
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}: "
                "each key/value head must serve a whole group of query heads"
            )
        if self.experts or self.experts_per_token:
            if not (isinstance(self.experts, int) and self.experts >= 2):
                raise ConfigError(
                    f"experts={self.experts!r}: a mixture of experts has 2 or more; "
                    "use 0 (with experts_per_token 0) for a dense MLP"
                )
            if not (
                isinstance(self.experts_per_token, int)
                and 1 <= self.experts_per_token <= self.experts
            ):
                raise ConfigError(
                    f"experts_per_token={self.experts_per_token!r}: each token goes to 1 to "
                    f"experts={self.experts} of them (Mixtral and Grok-1: 2)"
                )
        self._check_route_groups()
        self._check_router()
        if self.shared_expert_ffn:
            if not (isinstance(self.shared_expert_ffn, int) and self.shared_expert_ffn > 0):
                raise ConfigError(
                    f"shared_expert_ffn={self.shared_expert_ffn!r}: the shared experts' MLP "
                    "width is a positive integer (0: none)"
                )
            if not self.moe:
                raise ConfigError(
                    f"shared_expert_ffn={self.shared_expert_ffn} without experts: shared experts "
                    "sit beside a mixture's routed ones; give experts and experts_per_token, or "
                    "widen the dense MLP (ffn_hidden) instead"
                )
        self._check_dense_layers()
        self._check_latent_attention()
        self._check_qkv_bias()
        self._check_attention_window()
        for name in ("attention_softcap", "logit_softcap"):
            cap = getattr(self, name)
            if not (type(cap) in (int, float) and math.isfinite(cap) and cap >= 0):
                raise ConfigError(
                    f"{name}={cap!r}: the soft cap c of c·tanh(x/c) is a positive number "
                    "(Gemma 2: 50 on the attention scores, 30 on the logits; 0: none)"
                )
        if not (isinstance(self.mtp_layers, int) and self.mtp_layers >= 0):
            raise ConfigError(
                f"mtp_layers={self.mtp_layers!r}: the multi-token prediction depth is 0 or a "
                "positive integer (DeepSeek-V3: 1)"
            )
        if self.position == "rope" and self.head_dim % 2 and not self.mla:
            raise ConfigError(f"rotary positions need an even head size, got {self.head_dim}")
        for f, allowed in (("norm", NORMS), ("activation", ACTIVATIONS), ("position", POSITIONS)):
            if getattr(self, f) not in allowed:
                raise ConfigError(
                    f"unknown {f} {getattr(self, f)!r}: choose one of {', '.join(allowed)}"
                )

    def _check_router(self) -> None:
        if self.router_score not in ROUTER_SCORES:
            raise ConfigError(
                f"router_score={self.router_score!r}: choose {' or '.join(ROUTER_SCORES)} "
                "(Mixtral's and Qwen's softmax, DeepSeek-V3's sigmoid)"
            )
        for name in ("router_renorm", "router_expert_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r}: True or False")
        number("router_scale", self.router_scale, low=0, open_low=True)
        default = (self.router_score, self.router_renorm, self.router_expert_bias)
        if not self.moe and (default != ("softmax", True, False) or self.router_scale != 1):
            raise ConfigError(
                "router_score, router_renorm, router_expert_bias and router_scale weigh a "
                "mixture's experts: give experts and experts_per_token, or leave them at "
                "softmax, True, False and 1"
            )

    def _check_route_groups(self) -> None:
        if not (self.route_groups or self.route_group_topk):
            return
        groups, chosen, k = self.route_groups, self.route_group_topk, self.experts_per_token
        whole = all(isinstance(v, int) and not isinstance(v, bool) for v in (groups, chosen))
        if not (whole and self.moe and 1 <= chosen <= groups and self.experts % groups == 0):
            raise ConfigError(
                f"route_groups={groups!r}, route_group_topk={chosen!r}: group-limited routing "
                f"takes a mixture's experts ({self.experts}) in groups that divide them and "
                "chooses 1 to route_groups of them (DeepSeek-V3: 8 and 4)"
            )
        if k % chosen:
            raise ConfigError(
                f"route_group_topk={chosen} does not divide experts_per_token={k}: planned "
                "where each chosen group takes k / route_group_topk of a token's experts"
            )

    def _check_dense_layers(self) -> None:
        if isinstance(self.dense_layers, list):  # as JSON gives it back (a checkpoint's header)
            object.__setattr__(self, "dense_layers", tuple(self.dense_layers))
        if not (self.dense_layers or self.dense_ffn):
            return
        if not self.moe:
            raise ConfigError(
                "dense_layers without experts: dense blocks sit among a mixture's; give "
                "experts and experts_per_token, or leave every block dense (no dense_layers)"
            )
        layers = self.dense_layers
        if not (
            isinstance(layers, tuple)
            and all(isinstance(i, int) and 0 <= i < self.n_layers for i in layers)
            and list(layers) == sorted(set(layers))
        ):
            raise ConfigError(
                f"dense_layers={layers!r}: give the dense blocks' indices in increasing order, "
                f"each once, from 0 to n_layers - 1 = {self.n_layers - 1}"
            )
        if len(layers) == self.n_layers:
            raise ConfigError(
                f"dense_layers names all {self.n_layers} blocks: that is a dense model; drop "
                "the experts instead"
            )
        if not (isinstance(self.dense_ffn, int) and self.dense_ffn >= 0):
            raise ConfigError(
                f"dense_ffn={self.dense_ffn!r}: the dense blocks' MLP width is a positive "
                "integer (0: ffn_hidden, the experts' width)"
            )
        if self.dense_ffn and not layers:
            raise ConfigError(
                f"dense_ffn={self.dense_ffn} without dense_layers: name the dense blocks "
                "(--first-dense-blocks K for the first K)"
            )

    def _check_qkv_bias(self) -> None:
        if not isinstance(self.qkv_bias, bool):
            raise ConfigError(f"qkv_bias={self.qkv_bias!r}: True or False")
        if self.qkv_bias and self.bias:
            raise ConfigError(
                "qkv_bias=True with bias=True: bias already biases every linear, q, k and v "
                "among them; qkv_bias biases those three alone (Qwen2's): set bias=False "
                "(--no-bias)"
            )
        if self.qkv_bias and self.mla:
            raise ConfigError(
                "qkv_bias=True with a latent attention (kv_lora_rank): its queries, keys and "
                "values come from latents through projections of their own, which qkv_bias "
                "does not name; set qkv_bias=False (drop --qkv-bias)"
            )

    @property
    def attention_biased(self) -> bool:
        """Whether the q, k and v projections carry biases (``bias`` or ``qkv_bias``)."""
        return self.bias or self.qkv_bias

    def _check_latent_attention(self) -> None:
        fields = ("kv_lora_rank", "q_lora_rank", "rope_head_dim", "v_head_dim")
        for name in fields:
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 0):
                raise ConfigError(
                    f"{name}={value!r}: a latent attention's width is a positive integer (0: none)"
                )
        if not self.mla:
            given = [name for name in fields[1:] if getattr(self, name)]
            if given:
                raise ConfigError(
                    f"{given[0]}={getattr(self, given[0])} without kv_lora_rank: it shapes a "
                    "multi-head latent attention; give kv_lora_rank (DeepSeek-V3: 512)"
                )
            return
        if self.n_kv_heads != self.n_heads:
            raise ConfigError(
                f"n_kv_heads={self.n_kv_heads} with kv_lora_rank: a latent attention's every "
                "head has its own key and value; leave n_kv_heads at n_heads"
            )
        if self.position == "rope" and self.rope_head_dim % 2:
            raise ConfigError(
                f"rotary positions need an even rope_head_dim, got {self.rope_head_dim}"
            )

    def _check_attention_window(self) -> None:
        window, chunk, every = (
            self.attention_window,
            self.attention_chunk,
            self.full_attention_every,
        )
        for name, value, example in (
            ("attention_window", window, "the sliding window (GPT-OSS: 128, Mistral 7B: 4096)"),
            ("attention_chunk", chunk, "the attention's chunk (Llama 4: 8192)"),
        ):
            if not (type(value) is int and value >= 0):
                raise ConfigError(
                    f"{name}={value!r}: {example} is a positive number of tokens (0: full "
                    "attention)"
                )
        if window and chunk:
            raise ConfigError(
                f"attention_window={window} with attention_chunk={chunk}: a block attends over "
                "a sliding window or within its chunk; give one"
            )
        if not (type(every) is int and every >= 0):
            raise ConfigError(
                f"full_attention_every={every!r}: every N-th block attends fully (GPT-OSS: 2); "
                "0 makes every block local"
            )
        if every and not (window or chunk):
            raise ConfigError(
                f"full_attention_every={every} without a window or chunk: it names the blocks "
                "that keep full attention among local ones; give attention_window (--attention-"
                "window) or attention_chunk (--attention-chunk)"
            )
        if every == 1:
            raise ConfigError(
                "full_attention_every=1 keeps every block at full attention: drop the "
                "window instead (attention_window 0)"
            )

    @property
    def block_norms(self) -> int:
        """Norms a block runs: the attention's and the MLP's input norms, and under
        ``post_norms`` their outputs' too."""
        return 4 if self.post_norms else 2

    @property
    def local_span(self) -> int:
        """The window's or the chunk's tokens when it is shorter than the sequence — what
        makes a block's attention local —, else 0 (a window or chunk as long as the sequence
        masks nothing)."""
        span = self.attention_window or self.attention_chunk
        return span if span < self.seq_len else 0

    def local_attention(self, index: int) -> bool:
        """Whether block ``index`` (0-based) attends locally — over a sliding window or
        within its chunk, shorter than the sequence: every block under one, but the
        ``full_attention_every``-th ones (1-based numbering, as Megatron-Core's
        is_layer_window_attention counts them).

        >>> cfg = ModelConfig(n_layers=4, hidden=64, n_heads=4, vocab_size=100, seq_len=32,
        ...                   attention_window=8, full_attention_every=2)
        >>> [cfg.local_attention(i) for i in range(4)]
        [True, False, True, False]
        """
        if not self.local_span:
            return False
        return not self.full_attention_every or (index + 1) % self.full_attention_every != 0

    @property
    def attended_keys(self) -> float:
        """Keys a query attends to on average over a sequence, in one block of this (uniform)
        model — the mask's non-zero elements over s: (s + 1)/2 under full causal attention;
        under a window of w < s, the first w queries see 1 … w keys and the other s − w see
        w: (w(w + 1)/2 + (s − w)·w)/s, as NeMo's GPT-OSS FLOP count takes them; in chunks of
        c < s, each chunk's causal triangle, c(c + 1)/2 a whole chunk, over s."""
        s, w, c = self.seq_len, self.attention_window, self.attention_chunk
        if 0 < w < s:
            return (w * (w + 1) / 2 + (s - w) * w) / s
        if 0 < c < s:
            rest = s % c
            return ((s // c) * c * (c + 1) / 2 + rest * (rest + 1) / 2) / s
        return (s + 1) / 2

    @property
    def planned_parts(self) -> str:
        """What of this model only ``paracube plan`` models ("" if nothing beyond a mixture
        of experts, which is refused on its own): a latent attention, multi-token
        prediction, local attention, post-norms, soft caps — paracube's GPT has standard
        attention, two norms a block and one uncapped output head, so a run built from such
        a config would train another model."""
        parts = [
            f"kv_lora_rank={self.kv_lora_rank} (a multi-head latent attention)" if self.mla else "",
            f"mtp_layers={self.mtp_layers} (multi-token prediction)" if self.mtp_layers else "",
            (
                f"attention_window={self.attention_window} (sliding-window attention)"
                if self.attention_window
                else f"attention_chunk={self.attention_chunk} (chunked attention)"
            )
            if self.local_span
            else "",
            "post_norms (four norms a block)" if self.post_norms else "",
            (
                f"attention_softcap={self.attention_softcap:g}, logit_softcap="
                f"{self.logit_softcap:g} (logit soft-capping)"
            )
            if self.attention_softcap or self.logit_softcap
            else "",
        ]
        return ", ".join(part for part in parts if part)

    @property
    def mla(self) -> bool:
        """Whether the attention is multi-head latent attention (``kv_lora_rank``)."""
        return self.kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        """Each head's query and key width: head_dim, and a latent attention's rotary part."""
        return self.head_dim + self.rope_head_dim

    @property
    def v_dim(self) -> int:
        """Each head's value width: head_dim unless a latent attention gives its own."""
        return self.v_head_dim or self.head_dim

    @functools.cached_property  # asked on the search's every path
    def uniform(self) -> bool:
        """Whether every block is alike (no dense blocks among a mixture's, no locally
        attending blocks among fully attending ones)."""
        return not (self.dense_layers or self.mixed_attention)

    @property
    def mixed_attention(self) -> bool:
        """Whether some blocks attend locally and others fully."""
        every = self.full_attention_every
        return bool(every and self.local_span) and self.n_layers >= every

    def block_kind(self, index: int) -> ModelConfig:
        """Block ``index``'s kind as a uniform model (every other field the same): the
        mixture's, or a dense block's — its MLP one of ``dense_ffn`` width, no experts —,
        each windowed or fully attending as the block does."""
        if self.uniform:
            return self
        return self._kinds[index in self.dense_layers, self.local_attention(index)]

    @functools.cached_property  # a search asks for the kinds of a few models many times
    def _kinds(self) -> dict[tuple[bool, bool], ModelConfig]:
        """The uniform model of each (dense, attending locally) block kind."""
        local = self.replace(dense_layers=(), dense_ffn=0, full_attention_every=0)
        full = local.replace(attention_window=0, attention_chunk=0)
        return {
            (dense, is_local): (self._densed(base) if dense else base)
            for dense in (False, True)
            for is_local, base in ((True, local), (False, full))
        }

    def _densed(self, kind: ModelConfig) -> ModelConfig:
        return kind.replace(
            experts=0,
            experts_per_token=0,
            route_groups=0,
            route_group_topk=0,
            router_score="softmax",
            router_renorm=True,
            router_expert_bias=False,
            router_scale=1.0,
            shared_expert_ffn=0,
            ffn_hidden=self.dense_ffn or self.ffn_hidden,
        )

    @property
    def mixture_kind(self) -> ModelConfig:
        """The model as if every block were one of its mixture's (attending as its first
        block does: a window or chunk changes no block's parameters or kept bytes)."""
        return self if self.uniform else self._kinds[False, self.local_attention(0)]

    @property
    def dense_kind(self) -> ModelConfig:
        """The model as if every block were one of its dense blocks."""
        if self.uniform:
            return self._densed(self)
        return self._kinds[True, self.local_attention(0)]

    @property
    def kind_key(self) -> tuple[bool, int, int]:
        """What tells a uniform kind's blocks apart from another kind's in the time model:
        whether its MLP is a mixture, and the window or chunk it attends within."""
        return self.moe, self.attention_window, self.attention_chunk

    def kind_counts(self, blocks: Sequence[int] | None = None) -> list[tuple[ModelConfig, int]]:
        """(kind, how many) of the given block indices (all the model's by default), each
        kind once, the mixture's first; a uniform model's one kind is the model itself.

        >>> cfg = ModelConfig(n_layers=6, hidden=64, n_heads=4, vocab_size=100, seq_len=32,
        ...                   experts=8, experts_per_token=2, dense_layers=(0, 1))
        >>> [(kind.moe, n) for kind, n in cfg.kind_counts()]
        [(True, 4), (False, 2)]
        >>> [(kind.moe, n) for kind, n in cfg.kind_counts([4, 5])]
        [(True, 2)]
        """
        if self.uniform:  # the search's hot path: no kinds to tell apart
            return [(self, self.n_layers if blocks is None else len(blocks))]
        indices = range(self.n_layers) if blocks is None else blocks
        counts = dict.fromkeys(self._kinds, 0)
        keys = self._block_keys
        for i in indices:
            counts[keys[i]] += 1
        return [(self._kinds[key], n) for key, n in counts.items() if n]

    @functools.cached_property
    def _block_keys(self) -> tuple[tuple[bool, bool], ...]:
        """Each block's (dense, attending locally) kind, by index."""
        dense = set(self.dense_layers)
        return tuple((i in dense, self.local_attention(i)) for i in range(self.n_layers))

    def _check_rope_scaling(self) -> None:
        if self.rope_scaling not in ROPE_SCALINGS:
            raise ConfigError(
                f"rope_scaling {self.rope_scaling!r} is not built: choose one of "
                f"{', '.join(ROPE_SCALINGS)} (other stretches train as --model hf:DIR)"
            )
        if self.rope_scaling == "none":
            return
        number("rope_factor", self.rope_factor, low=1)
        if self.rope_scaling == "llama3":
            number("rope_low_freq_factor", self.rope_low_freq_factor, low=0, open_low=True)
            number("rope_high_freq_factor", self.rope_high_freq_factor, low=0, open_low=True)
            positive("rope_original_context", self.rope_original_context)
            if self.rope_high_freq_factor <= self.rope_low_freq_factor:
                raise ConfigError(
                    f"rope_high_freq_factor {self.rope_high_freq_factor} must exceed "
                    f"rope_low_freq_factor {self.rope_low_freq_factor} (Llama 3.1's: 4 and 1)"
                )

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.n_heads

    @property
    def q_dim(self) -> int:
        """The queries' width, n_heads · d: the hidden size unless ``head_size`` decouples it."""
        return self.n_heads * self.head_dim

    @property
    def moe(self) -> bool:
        """Whether the blocks' MLPs are a mixture of experts."""
        return self.experts > 0

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """How ranks are arranged: ``world = pp × dp × tp``, axis order pp-dp-tp (tp innermost).

    ``bucket_mb`` is the data-parallel gradient bucket capacity in MiB: gradients are
    all-reduced one bucket at a time, as soon as the bucket is complete during backward.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    bucket_mb: float = 25.0
    sequence_parallel: bool = False
    gpus_per_node: int | None = None
    schedule: str = "1f1b"
    chunks: int = 1
    balance: str = "params"

    def __post_init__(self) -> None:
        for axis in AXES:
            positive(f"--{axis}", getattr(self, axis), "use 1 to switch this axis off")
        if not (isinstance(self.bucket_mb, (int, float)) and self.bucket_mb > 0):
            raise ConfigError(f"--bucket-mb must be > 0, got {self.bucket_mb!r}")
        if self.gpus_per_node is not None:
            positive("--gpus-per-node", self.gpus_per_node)
            if self.tp > self.gpus_per_node:
                raise ConfigError(
                    f"--tp {self.tp} is larger than a node ({self.gpus_per_node} ranks per node): tensor "
                    "parallelism all-reduces every layer and needs the intra-node links; "
                    f"use --tp ≤ {self.gpus_per_node} and pipeline or data parallelism across nodes"
                )
        if self.schedule not in SCHEDULES:
            raise ConfigError(
                f"unknown schedule {self.schedule!r}: choose one of {', '.join(SCHEDULES)}"
            )
        if self.balance not in BALANCE:
            raise ConfigError(
                f"unknown --balance {self.balance!r}: choose one of {', '.join(BALANCE)}"
            )
        positive("--chunks", self.chunks)
        if self.sequence_parallel and self.tp == 1:
            raise ConfigError(
                "--sequence-parallel needs --tp > 1: it shards the sequence over the tensor-parallel ranks"
            )

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    def check_world_size(self, world_size: int) -> None:
        """Raise unless ``pp·dp·tp`` equals the number of launched ranks."""
        if self.world_size != world_size:
            raise ConfigError(
                f"pp×dp×tp = {self.pp}×{self.dp}×{self.tp} = {self.world_size} but the job has "
                f"{world_size} ranks: make the product equal the world size"
            )

    def replace(self, **changes) -> ParallelConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training job. The global batch is ``dp × micro_batch × grad_accum`` sequences.

    If ``global_batch`` is given, ``grad_accum`` is derived from it and must come out whole.
    With pipeline parallelism ``grad_accum`` is the number of micro-batches per step (m).
    """

    model: ModelConfig
    # None: paracube's reference GPT of shape ``model``; "hf:DIR" a Hugging Face model,
    # "factory:pkg.mod:fn" a user's (paracube.models.sources): ``model`` is then its shape
    model_source: str | None = None
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    steps: int = 100
    micro_batch: int = 8
    grad_accum: int = 1
    global_batch: int = None  # type: ignore[assignment]  # None: dp × micro_batch × grad_accum
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 10
    weight_decay: float = 0.1
    grad_clip: float | None = 1.0
    seed: int = 0
    data: str | None = None
    val_fraction: float = 0.05
    eval_every: int = 0
    eval_batches: int = 4
    metrics: str | None = None
    metrics_mode: str = "new"  # an existing metrics file: refused (new), appended, overwritten
    on_nan: str = (
        "stop"  # a non-finite loss or gradient norm: stop (exit 3), skip the step, continue
    )
    progress: bool = True
    zero: int = 0
    recompute: str = "none"
    recompute_blocks: int | None = (
        None  # the first N blocks (of each pipeline stage's model); None: all
    )
    compile: str = "none"  # torch.compile the model's blocks (paracube.choices.COMPILE)
    precision: str = "fp32"
    offload: str = "none"  # "optimizer": master weights and optimizer states on the host
    grad_reduce: str = "fp32"  # dtype of gradient accumulation and reduction under bf16/fp16
    loss_scale: str | None = None  # fp16: "dynamic" (default) or a fixed number; "none" refused
    count_activations_every: int = (
        10  # count saved activations on steps 0, N, 2N, … (1: every step)
    )
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    data_workers: int = 0  # background threads making micro-batches (0: on the training thread)
    prefetch: int = 2  # micro-batches made ahead of the step, with data_workers
    straggler_threshold: float = 0.10  # a rank this much above its peers' median is slow
    dp_balance: str = "even"  # the global batch over dp ranks: even, auto, or weights "1,3"
    compress: str = "none"  # gradient compression: none, fp16, bf16, topk:RATIO, powersgd:RANK
    error_feedback: bool = True  # top-k / PowerSGD keep what they did not send for the next step
    dp_mode: str = "sync"  # sync, local-sgd:H, diloco:H (averaged every H steps), stale:S, ps[:S]

    def __post_init__(self) -> None:
        self._check_memory_options()
        for f in ("data_workers", "prefetch"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 64:
                raise ConfigError(
                    f"--{f.replace('_', '-')} must be an integer in [0, 64], got {value!r}"
                )
        number("--straggler-threshold", self.straggler_threshold, low=0, high=10, open_low=True)
        for f in ("steps", "micro_batch", "grad_accum", "eval_batches", "count_activations_every"):
            positive(f"--{f.replace('_', '-')}", getattr(self, f))
        if self.global_batch is not None:
            positive("--global-batch", self.global_batch)
            per_step = self.parallel.dp * self.micro_batch
            if self.global_batch % per_step:
                raise ConfigError(
                    f"--global-batch {self.global_batch} is not divisible by dp×micro-batch = "
                    f"{self.parallel.dp}×{self.micro_batch} = {per_step}: choose a multiple of {per_step}"
                )
            object.__setattr__(self, "grad_accum", self.global_batch // per_step)
        else:
            object.__setattr__(
                self, "global_batch", self.parallel.dp * self.micro_batch * self.grad_accum
            )
        if self.dp_balance != "even":
            self.data_split()  # a --dp-balance that cannot split this batch is refused now
        for f, allowed in (("metrics_mode", METRICS_MODES), ("on_nan", ON_NAN)):
            if getattr(self, f) not in allowed:
                raise ConfigError(
                    f"unknown --{f.replace('_', '-')} {getattr(self, f)!r}: choose one of {', '.join(allowed)}"
                )
        number("--lr", self.lr, low=0, open_low=True)
        number("--min-lr", self.min_lr, low=0)
        if self.min_lr > self.lr:
            raise ConfigError(
                f"--min-lr {self.min_lr:g} is above --lr {self.lr:g}: the cosine decay ends at "
                "--min-lr, so choose --min-lr <= --lr"
            )
        number("--weight-decay", self.weight_decay, low=0)
        for f in ("warmup_steps", "eval_every"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                flag = f"--{f.replace('_', '-')}"
                raise ConfigError(f"{flag} must be a non-negative integer, got {value!r}")
        if self.grad_clip is not None:
            number("--grad-clip", self.grad_clip, low=0, open_low=True)
        number("--val-fraction", self.val_fraction, low=0, high=0.5, open_low=True)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"--seed must be an integer, got {self.seed!r}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"--seed must be in [0, 2**32 - 1], got {self.seed}")

    def data_split(self):
        """The split of every global batch over the data-parallel ranks that ``dp_balance``
        asks for (``auto`` starts even; :mod:`paracube.data.split`)."""
        from paracube.data.split import DataSplit, parse_weights

        dp, batch, accum = self.parallel.dp, self.global_batch, self.grad_accum
        if self.dp_balance in ("even", "auto"):
            if self.dp_balance == "auto" and dp == 1:
                raise ConfigError("--dp-balance auto needs --dp > 1: there is nothing to balance")
            split = DataSplit.even(dp, batch, accum)
        else:
            split = DataSplit.weighted(parse_weights(self.dp_balance, dp), batch, accum)
        if self.dp_balance != "even" and self.parallel.pp > 1:
            raise ConfigError(
                f"--dp-balance {self.dp_balance} with --pp > 1 is not supported yet: a pipeline "
                "sends fixed-size micro-batches between its stages; use --dp-balance even"
            )
        return split

    def _check_dp_mode(self) -> None:
        """``--dp-mode``: sync, local-sgd:H / diloco:H or stale:S, with what each composes with."""
        kind, _, text = self.dp_mode.partition(":")
        if kind not in DP_MODES:
            raise ConfigError(
                f"unknown --dp-mode {self.dp_mode!r}: choose sync, local-sgd:H, diloco:H, stale:S or ps[:S]"
            )
        if kind == "sync":
            return
        least = 0 if kind in ("stale", "ps") else 1
        if (text or kind != "ps") and (not text.isdigit() or int(text) < least):
            what = {
                "stale": "S must be an integer ≥ 0 (steps a gradient is late)",
                "ps": "S must be an integer ≥ 0 (pushes a worker may be ahead of the slowest), or left out",
            }.get(kind, "H must be an integer ≥ 1 (steps between averages)")
            raise ConfigError(f"--dp-mode {self.dp_mode}: {what}, e.g. {kind}:{least + 1}")
        alone = kind != "stale"  # local-sgd / diloco / ps: every rank's own gradients
        saved = self.checkpoint.save_dir is not None or self.checkpoint.resume is not None
        clash = [
            (self.parallel.dp == 1, "--dp 1 (there is no data-parallel communication: use --dp > 1)"),
            (self.zero != 0 and alone, f"--zero {self.zero} (each rank steps all its parameters: use --zero 0)"),
            (self.zero >= 2 and not alone,
             f"--zero {self.zero} (a late gradient has no shard to land in: use --zero 0 or 1)"),
            (self.compress != "none", "--compress (leave it out: these modes send parameters, or gradients late)"),
            (self.dp_balance != "even" and alone, "--dp-balance (every rank steps alone: leave it out)"),
            (self.precision == "fp16" and not alone,
             "--precision fp16 (a late gradient was scaled by another step's loss scale: use bf16)"),
            (kind == "ps" and (self.parallel.tp > 1 or self.parallel.pp > 1),
             f"--tp {self.parallel.tp} --pp {self.parallel.pp} (a worker is one rank: use --tp 1 --pp 1)"),
            (kind == "ps" and self.precision == "fp16", "--precision fp16 (no loss scale across workers: use bf16)"),
            (saved, "checkpoints (drifted ranks, outer momentum, gradients in flight are not saved yet)"),
        ]  # fmt: skip
        for bad, what in clash:
            if bad:
                raise ConfigError(f"--dp-mode {self.dp_mode} is not supported with {what}")

    def _check_compression(self) -> None:
        """``--compress``: a known kind, its value in range, a ZeRO stage it composes with."""
        from paracube.models.shapes import smallest_matrix_dim

        kind, value = compression(self.compress)
        if kind == "powersgd":
            smallest = smallest_matrix_dim(self.model, self.parallel.tp)
            if value >= smallest:
                raise ConfigError(
                    f"--compress {self.compress}: RANK must be an integer in [1, {smallest - 1}] (below this "
                    f"model's smallest matrix dimension per rank, {smallest}), e.g. powersgd:4"
                )
        refusal = compression_with_zero(kind, self.zero)
        if refusal:
            raise ConfigError(refusal)
        if not self.error_feedback and kind not in ("topk", "powersgd"):
            raise ConfigError(
                "--no-error-feedback applies to --compress topk:RATIO or powersgd:RANK (nothing else keeps a residual)"
            )

    def _check_compile(self) -> None:
        if self.compile not in COMPILE:
            raise ConfigError(
                f"unknown --compile {self.compile!r}: choose one of {', '.join(COMPILE)}"
            )
        refusal = compile_refusal(self.compile, recompute=self.recompute)
        if refusal:
            raise ConfigError(f"--compile {self.compile} with {refusal}: drop --compile or that")

    def _check_memory_options(self) -> None:
        """ZeRO stage, recomputation and precision: values and supported combinations."""
        if self.zero not in ZERO_STAGES or isinstance(self.zero, bool):
            raise ConfigError(f"unknown --zero {self.zero!r}: choose 0, 1, 2 or 3")
        if self.zero == 3 and self.parallel.pp > 1:
            raise ConfigError(ZERO3_WITH_PIPELINE)
        self._check_compression()
        self._check_dp_mode()
        if self.offload not in OFFLOAD:
            raise ConfigError(
                f"unknown --offload {self.offload!r}: choose one of {', '.join(OFFLOAD)}"
            )
        if self.recompute not in RECOMPUTE:
            raise ConfigError(
                f"unknown --recompute {self.recompute!r}: choose one of {', '.join(RECOMPUTE)}"
            )
        if self.recompute_blocks is not None:
            positive("--recompute-blocks", self.recompute_blocks)
            if self.recompute == "none":
                raise ConfigError("--recompute-blocks needs --recompute selective or full")
            if self.recompute_blocks > self.model.n_layers:
                raise ConfigError(
                    f"--recompute-blocks {self.recompute_blocks} is more than the model's {self.model.n_layers} blocks"
                )
        self._check_compile()
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"unknown --precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}"
            )
        if self.grad_reduce not in GRAD_REDUCE:
            raise ConfigError(f"unknown --grad-reduce {self.grad_reduce!r}: choose fp32 or compute")
        if self.grad_reduce == "compute" and self.precision == "fp32":
            raise ConfigError(
                "--grad-reduce compute is for --precision bf16 or fp16: under fp32 gradients are "
                "reduced in fp32 anyway; drop the flag or choose a lower precision"
            )
        if self.precision == "fp16":
            if self.loss_scale is None:
                object.__setattr__(self, "loss_scale", "dynamic")
            if str(self.loss_scale).lower() == "none":
                raise ConfigError(
                    "--precision fp16 without loss scaling underflows small gradients to zero: "
                    "use --loss-scale dynamic (default) or a fixed scale such as 1024, or --precision bf16"
                )
            if self.loss_scale != "dynamic":
                check_loss_scale(self.loss_scale)
        elif self.loss_scale is not None:
            raise ConfigError(
                f"--loss-scale is for --precision fp16 (got --precision {self.precision}): "
                "bf16 and fp32 have fp32's exponent range and need no loss scaling"
            )

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.model.seq_len

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)
