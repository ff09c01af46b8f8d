"""``paracube plan``'s arguments — a table, kept apart from what the command does
(:mod:`paracube.cli.plan`), as ``train``'s are (:mod:`paracube.cli.train_args`)."""

from __future__ import annotations

import argparse

from paracube.choices import ROUTER_SCORES
from paracube.cli.plan_budget import token_count


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="which parallel layout for a model on a cluster: memory, step time, MFU, bubble, ranked",
        description="Evaluate one layout (--layout) or search them all, for a model on a cluster.",
    )
    m = p.add_argument_group("model (a preset, or a custom transformer)")
    m.add_argument(
        "--model",
        default=None,
        help="a preset (see paracube.models.PRESETS), a Hugging Face model's local config "
        "(hf:DIR or DIR/config.json, as paracube train reads it), or a factory "
        "package.module:function",
    )
    for flag in ("--layers", "--hidden", "--heads", "--vocab", "--ffn", "--kv-heads"):
        m.add_argument(flag, type=int, default=None)
    m.add_argument("--seq", "--seq-len", type=int, default=None, help="tokens per sequence")
    # a custom shape's block, as ModelConfig names it (default: a GPT block)
    m.add_argument("--activation", default=None, help="gelu (default) or swiglu (LLaMA's MLP)")
    m.add_argument("--norm", default=None, help="layernorm (default) or rmsnorm")
    m.add_argument("--position", default=None, help="learned (default) or rope")
    m.add_argument(
        "--tie-embeddings", action="store_true", default=None, help="the head shares the embedding"
    )
    m.add_argument(
        "--no-bias", action="store_true", default=None, help="linear layers without bias"
    )
    m.add_argument(
        "--qkv-bias",
        action="store_true",
        default=None,
        help="q, k and v projections biased, no other linear (Qwen2's; with --no-bias)",
    )
    m.add_argument(
        "--experts",
        type=int,
        default=None,
        help="a mixture of experts: each block's MLP as this many MLPs of its shape and a "
        "router (planned, not run by paracube train; with --experts-per-token)",
    )
    m.add_argument(
        "--experts-per-token",
        type=int,
        default=None,
        help="the experts each token is routed to (Mixtral, Grok-1: 2)",
    )
    m.add_argument(
        "--shared-expert-ffn",
        type=int,
        default=None,
        help="a mixture's shared experts: the width of the MLP every token passes beside its "
        "routed experts (Qwen1.5-MoE-A2.7B: 5632, Qwen2-57B-A14B: 20480)",
    )
    m.add_argument(
        "--route-groups",
        type=int,
        default=None,
        metavar="G",
        help="group-limited routing: the experts in G groups, each token's from "
        "--route-group-topk of them (DeepSeek-V3's node-limited routing: 8 and 4; Megatron's "
        "--moe-router-num-groups), so DeepEP's dispatch reaches fewer nodes",
    )
    m.add_argument(
        "--route-group-topk",
        type=int,
        default=None,
        metavar="g",
        help="the groups a token's experts come from under --route-groups (DeepSeek-V3: 4)",
    )
    m.add_argument(
        "--router-score",
        choices=ROUTER_SCORES,
        default=None,
        help="how the router scores the experts: softmax (Mixtral, Qwen; the default) or "
        "sigmoid (DeepSeek-V3, GLM-4.5; Megatron's --moe-router-score-function)",
    )
    m.add_argument(
        "--router-keep-scores",
        action="store_true",
        default=None,
        help="a token's k expert weights kept as scored, not renormalised over the k "
        "(DeepSeek-V2's and Qwen2-MoE's softmax over every expert: --moe-router-pre-softmax)",
    )
    m.add_argument(
        "--router-expert-bias",
        action="store_true",
        default=None,
        help="a learned per-expert bias that chooses the experts but does not weigh them "
        "(DeepSeek-V3's auxiliary-loss-free balancing: --moe-router-enable-expert-bias)",
    )
    m.add_argument(
        "--router-scale",
        type=float,
        default=None,
        metavar="S",
        help="the expert weights' multiplier (DeepSeek-V3: 2.5; --moe-router-topk-scaling-factor)",
    )
    m.add_argument(
        "--first-dense-blocks",
        type=int,
        default=None,
        metavar="K",
        help="a mixture whose first K blocks have one dense MLP instead of experts "
        "(DeepSeek-V3, GLM-4.5: 3; Kimi K2: 1), of --dense-ffn width",
    )
    m.add_argument(
        "--dense-ffn",
        type=int,
        default=None,
        help="the dense blocks' MLP width (default: --ffn, the experts'; DeepSeek-V3: 18432 "
        "beside experts of 2048)",
    )
    m.add_argument(
        "--mtp-layers",
        type=int,
        default=None,
        metavar="D",
        help="multi-token prediction modules after the last block, on the last pipeline "
        "stage (DeepSeek-V3: 1; Megatron's --mtp-num-layers)",
    )
    m.add_argument(
        "--attention-window",
        type=int,
        default=None,
        metavar="W",
        help="sliding-window attention: each query attends to itself and the W - 1 keys "
        "before it (GPT-OSS: 128, Mistral 7B: 4096; Megatron's --window-size)",
    )
    m.add_argument(
        "--attention-chunk",
        type=int,
        default=None,
        metavar="C",
        help="chunked attention: the sequence cut into chunks of C tokens, each query "
        "attending within its own (Llama 4: 8192)",
    )
    m.add_argument(
        "--full-attention-every",
        type=int,
        default=None,
        metavar="N",
        help="under --attention-window or --attention-chunk, every N-th block attends fully "
        "(GPT-OSS: 2, Llama 4: 4; Megatron's --window-attn-skip-freq); default: none",
    )
    m.add_argument(
        "--head-size",
        type=int,
        default=None,
        help="each attention head's width, where it is not --hidden / --heads (Qwen3-32B: "
        "128 over 5120 / 64)",
    )
    m.add_argument(
        "--qk-norm",
        action="store_true",
        default=None,
        help="each head's queries and keys normalised (Qwen3's q_norm, k_norm)",
    )
    m.add_argument(
        "--post-norms",
        action="store_true",
        default=None,
        help="four norms a block: each sub-layer's output normed again before the residual "
        "add (Gemma 2 and 3)",
    )
    m.add_argument(
        "--attention-softcap",
        type=float,
        default=None,
        metavar="C",
        help="each attention score soft-capped to C·tanh(x/C) inside the fused kernel "
        "(Gemma 2: 50)",
    )
    m.add_argument(
        "--logit-softcap",
        type=float,
        default=None,
        metavar="C",
        help="each output logit soft-capped to C·tanh(x/C) before the loss (Gemma 2: 30)",
    )
    c = p.add_argument_group("cluster")
    c.add_argument(
        "--gpus",
        default=None,
        help="how many GPUs (of --gpu), or a mixed cluster as counts of device types: "
        "8xa100-80gb,8xv100 (each type on its own nodes)",
    )
    c.add_argument("--gpus-per-node", type=int, default=8)
    c.add_argument(
        "--gpu",
        default="a100-80gb",
        help="v100, a100-40gb, a100-80gb, a800, h100, h800, h200, h100-96gb-500w (Grand Teton's "
        "H100s), or calibrated (this machine's GPU, as `paracube calibrate` measured it)",
    )
    c.add_argument("--intra", default=None, help="intra-node link (default: the GPU's NVLink)")
    c.add_argument(
        "--inter",
        default=None,
        help="inter-node link (default: InfiniBand HDR/NDR, a 200/400 Gb/s port a GPU), or a "
        "node's network as PORTSxGBPS: 4x100 (four 100 Gb/s ports its GPUs share: AWS p4d's "
        "400 Gb/s EFA), 32x100 (p5's 3,200 Gb/s)",
    )
    t = p.add_argument_group("training and fixed choices")
    t.add_argument("--global-batch", type=int, default=None, help="sequences per step")
    t.add_argument(
        "--precision",
        default=None,
        help="bf16 (the default; fp16 on GPUs without bfloat16 tensor cores: V100), fp16, "
        "fp32 (CUDA cores: torch's default for fp32 matmuls), tf32 (fp32 "
        "values, TF32 tensor-core matmuls) or fp8 (bf16 with the blocks' linear layers in FP8, "
        "as Transformer Engine runs them on Hopper: planned, not run by paracube train)",
    )
    t.add_argument(
        "--layout",
        default=None,
        help="evaluate one layout: dp=,tp=,pp= (and cp=, context parallelism as Megatron-Core "
        "runs it, ep=, a mixture of experts' expert parallelism out of the dp ranks, and "
        "etp=1, its experts folded over tp × cp × dp as Megatron-Core's parallel folding: "
        "planned, not run by paracube train)",
    )
    t.add_argument("--micro-batch", type=int, default=None)
    t.add_argument("--schedule", default=None)
    t.add_argument("--chunks", type=int, default=None)
    t.add_argument("--zero", type=int, default=None)
    t.add_argument(
        "--recompute",
        default=None,
        help="none, selective (the attention core), full, or op (torchtitan's op-level "
        "selective checkpointing: every matmul's output kept but every second one's; "
        "planned, not run by paracube train)",
    )
    t.add_argument(
        "--recompute-modules",
        default=None,
        type=lambda text: tuple(part.strip() for part in text.split(",") if part.strip()),
        help="what a selective recomputation makes again, comma-separated: core_attn (the "
        "attention core; the default), mla_up_proj (a latent attention's up projections: its "
        "per-head queries, keys and values not kept), mlp (a dense block's MLP, checkpointed "
        "whole), moe_act (the experts' activation), layernorm (the two norms; those two save "
        "nothing under FP8, whose linears keep copies of their own), moe (a mixture's whole "
        "MoE layer, its all-to-alls again), shared_experts — Megatron-Core's "
        "--recompute-modules, planned as it keeps its blocks (a megatron stack); implies "
        "--recompute selective",
    )
    t.add_argument(
        "--compress",
        default=None,
        help="gradient compression of the data-parallel reduction: fp16, bf16, topk:RATIO, "
        "powersgd:RANK (as paracube train's --compress)",
    )
    t.add_argument(
        "--offload",
        default=None,
        help="optimizer (states and step in host memory) or none; default: only where a "
        "layout does not fit without it",
    )
    t.add_argument(
        "--sequence-parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fix sequence parallelism on or off (default: on wherever tp > 1)",
    )
    t.add_argument(
        "--stack",
        default=None,
        help="the training software to plan for, all its facts at once (each flag below "
        "overrides its own): paracube (default: what paracube train runs), megatron-core "
        "(Transformer Engine's blocks, the fused loss, weight gradients accumulated by the "
        "GEMMs, Megatron's even pipeline split), nemo or megatron-bridge (the same, with the "
        "tensor-parallel collectives overlapped as their recipes run them), "
        "megatron-lm-2021 (unfused attention, no sequence parallelism, gradients reduced "
        "after the backward, even split), fsdp or torchtitan (PyTorch FSDP2: gradients cast "
        "and divided on a side stream, gathered parameters copied out into each parameter), "
        "fsdp1 (FSDP1's flat parameters: no copy-out) or composer (its FSDP1 without backward "
        "prefetch, the fused loss); the search then proposes only what the stack runs, and "
        "tries context parallelism where it runs it",
    )
    t.add_argument(
        "--attention",
        default=None,
        help="fused (FlashAttention-2 / PyTorch SDPA, paracube's default), fused-v1 "
        "(FlashAttention's own CUDA kernels before flash-attn 2.0), fused-triton "
        "(FlashAttention in Triton, as MPT's attn_impl: triton), fused-v3 (FlashAttention-3, "
        "Hopper only: 1.5× FlashAttention-2's rate) or unfused (s×s scores materialized, as "
        "Megatron-LM before 2022)",
    )
    t.add_argument(
        "--overlap-grad-reduce",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="data-parallel gradients reduced during the last backward (default, as paracube does) "
        "or only after it (--no-overlap-grad-reduce: Megatron-LM 2021, DeepSpeed's pipeline engine)",
    )
    t.add_argument(
        "--backward-prefetch",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ZeRO-3: the next unit's parameters gathered during this unit's backward "
        "(default, as paracube, FSDP2 and FSDP1's BACKWARD_PRE do) or only after it "
        "(--no-backward-prefetch: FSDP1's BACKWARD_POST, Composer's default)",
    )
    t.add_argument(
        "--grad-reduce",
        default=None,
        help="under bf16/fp16, gradients accumulated and reduced in fp32 (default, as paracube "
        "train and Megatron do) or in the compute dtype (compute: half the bytes)",
    )
    t.add_argument(
        "--shard-group",
        type=int,
        default=None,
        help="hybrid sharding: ZeRO within groups of N data-parallel ranks, replicated across "
        "the groups — ZeRO-3 (HSDP: FSDP's HYBRID_SHARD; the default) or, with --zero 1, the "
        "optimizer states only (InternLM's zero1 size); planned, not run by paracube train "
        "(the FSDP stacks' searches try one node's group themselves)",
    )
    t.add_argument(
        "--param-sync",
        default=None,
        help="ZeRO-1/2's updated slices brought back after the step: one all-gather "
        "(all-gather: paracube train, Megatron, DeepSpeed; default) or a broadcast from each "
        "rank of the ZeRO group that owns parameters, in turn (broadcast: InternLM — a chain "
        "to fill, hop by hop, per owner)",
    )
    t.add_argument(
        "--grad-bucket",
        default=None,
        help="the gradient buckets of a reduction overlapped with the backward, whose last one "
        "is always waited for: 25 MiB (ddp: paracube train's --bucket-mb default, PyTorch "
        "DDP's; default), Megatron-Core's max(40M, 1M × dp) elements (megatron) or "
        "InternLM's 512M (internlm)",
    )
    t.add_argument(
        "--grad-sync",
        default=None,
        help="ZeRO-1's gradient reduction before each rank steps its slice: an all-reduce of "
        "the whole buffer (all-reduce: paracube train, InternLM; default) or a reduce-scatter "
        "into each rank's slice (reduce-scatter: Megatron-Core's distributed optimizer, half "
        "the traffic)",
    )
    t.add_argument(
        "--zero3-pipeline",
        default=None,
        help="ZeRO-3 under a pipeline: not run (none: paracube train; default) or each stage "
        "gathered once a step and kept, its gradients reduce-scattered after its last backward "
        "(per-step: torchtitan's FSDP2 under PyTorch's pipelining)",
    )
    t.add_argument(
        "--param-gather",
        default=None,
        help="ZeRO-3's gathered parameters: used where the all-gather wrote them (flat: "
        "paracube train, FSDP1, DeepSpeed; default) or copied out into each parameter "
        "(per-parameter: FSDP2, one read and write of every gathered parameter per pass)",
    )
    t.add_argument(
        "--optimizer-kernel",
        default=None,
        help="the AdamW step: one fused kernel (fused: paracube train, Megatron's and "
        "Transformer Engine's FusedAdam; default) or an op per pass over the states "
        "(multi-op: torch.optim.AdamW's default, Composer's DecoupledAdamW — 80 bytes a "
        "parameter against 28)",
    )
    t.add_argument(
        "--clip-scale",
        default=None,
        help="clipping rescales the gradients only when their norm is over the limit "
        "(when-clipped: paracube train, Megatron; default) or always (torch's and FSDP's "
        "clip_grad_norm_: one more read and write of every gradient)",
    )
    t.add_argument(
        "--recompute-replay",
        default=None,
        help="a fully recomputed block replayed until backward has what it needs "
        "(early-stop: torch's non-reentrant checkpoint since PyTorch 2.1 — paracube train, "
        "PyTorch FSDP, torchtitan; the block's last matmul is not redone; default) or whole "
        "(Megatron, DeepSpeed, InternLM, a reentrant or older torch checkpoint)",
    )
    t.add_argument(
        "--recompute-scope",
        default=None,
        help="which N blocks --recompute-blocks N takes: the model's first N (model: paracube "
        "train's; default) or the first N of every stage's chunk of blocks (stage: Megatron's "
        "--recompute-method block, the megatron-core, nemo and megatron-bridge stacks')",
    )
    t.add_argument(
        "--logit-metrics",
        type=int,
        default=None,
        metavar="N",
        help="cross-entropy metrics the trainer computes over every micro-batch's logits "
        "beside the loss (Composer's training metrics: 2; paracube train: 0, the default) — "
        "each a cast of the logits to fp32 and a log-softmax: 14 bytes a 16-bit logit",
    )
    t.add_argument(
        "--grad-accumulation",
        default=None,
        help="how each micro-batch's weight gradients reach the buffer they are reduced from: "
        "buffer (a pass adding them in, as paracube train, Megatron's DDP hook and FSDP do; "
        "default), fused (the weight-gradient GEMM accumulates: Megatron-Core's "
        "--gradient-accumulation-fusion), bf16-optimizer (cast to fp32, then added: "
        "DeepSpeed's BF16_Optimizer) or side-stream (cast and pre-divided beside the compute: "
        "PyTorch FSDP)",
    )
    t.add_argument(
        "--tp-comm-overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tensor-parallel collectives overlapped with the matmuls they feed (Megatron-Core's "
        "--tp-comm-overlap, NeMo's ub_tp_comm_overlap); default off, as paracube's tensor "
        "parallel waits for them",
    )
    t.add_argument(
        "--ep-comm-overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a mixture's all-to-alls overlapped with another micro-batch's compute "
        "(Megatron-Core's --overlap-moe-expert-parallel-comm, its combined 1F1B: without a "
        "pipeline or under interleaved-1f1b); default off, the all-to-alls waited for",
    )
    t.add_argument(
        "--ep-dispatch",
        default=None,
        help="how a mixture's tokens reach the experts' ranks: a row per token and expert "
        "(alltoall: Megatron-Core's all-to-all dispatcher; default) or a token once per rank "
        "holding any of its experts (deepep: DeepEP, Megatron-Core's flex dispatcher)",
    )
    t.add_argument(
        "--router",
        default=None,
        help="which experts a token goes to, for the dispatch's traffic: its router's top k, "
        "counted as k experts at random (top-k; default) or k consecutive ones in turn "
        "(round-robin: NeMo AutoModel's fake balanced gate)",
    )
    t.add_argument(
        "--master-weights",
        default=None,
        help="where mixed precision's fp32 main weights live: in the optimizer beside 16-bit "
        "parameters (optimizer: paracube train, Megatron, DeepSpeed; default), as the fp32 "
        "parameters themselves, cast as they are gathered (parameters: PyTorch FSDP — under "
        "ZeRO-3 no 16-bit shard is kept; the fsdp, fsdp1, torchtitan and composer stacks), or "
        "nowhere (none: pure 16-bit training — parameters, gradients and Adam's moments in the "
        "compute dtype, 2 + 2 + 4 bytes a parameter, as NeMo AutoModel's own models train)",
    )
    t.add_argument(
        "--moments",
        default=None,
        help="the dtype of Adam's two moments beside fp32 main weights: fp32 (default) or bf16, "
        "as DeepSeek-V3 trained and Megatron-Core's precision-aware optimizer keeps them "
        "(--exp-avg-dtype/--exp-avg-sq-dtype bf16, under its distributed optimizer): 4 + 2 + 2 "
        "optimizer bytes a parameter (2 + 2 + 2 in bf16: the main weight kept as the int16 "
        "remainder beside the bf16 parameter), its step moving the moments at 2 bytes",
    )
    t.add_argument(
        "--fp8-scaling",
        default=None,
        help="under --precision fp8: delayed (scales from the amax history, Transformer "
        "Engine's default; the planner's) or current (each tensor's own amax read before its "
        "cast: Megatron-Bridge's FP8-CS, torchao's dynamic float8)",
    )
    t.add_argument(
        "--loss",
        default=None,
        help="the loss's backward: torch (paracube's: two fp32 gradients of the logits' shape "
        "alive at once; default) or fused (computed in place: Megatron's vocabulary-parallel "
        "cross-entropy, llm-foundry's fused one)",
    )
    t.add_argument(
        "--recompute-blocks",
        type=int,
        default=None,
        help="recompute only the first N blocks, whole (implies --recompute full; as paracube "
        "train's --recompute-blocks — under --stack megatron-core, nemo or megatron-bridge the "
        "first N of every stage's chunk, as their --recompute-method block; default: the "
        "fewest that fit)",
    )
    t.add_argument(
        "--activations",
        default=None,
        help="what a block keeps for backward, in the memory model: paracube (its own blocks, "
        "op by op; default), megatron (Megatron-Core with Transformer Engine: sequence-"
        "parallel inputs kept sharded, no output-projection copy, FP8 inputs "
        "under --precision fp8) or compiled (its blocks under torch.compile, as torchtitan "
        "and OLMo-core run them: the norms' and SwiGLU's element-wise intermediates "
        "recomputed in backward; emitted as paracube train --compile inductor)",
    )
    t.add_argument(
        "--elementwise",
        default=None,
        help="the blocks' element-wise ops (norms, rotary, activation, residual adds) in the "
        "time model: fused (fused kernels or torch.compile move what a block keeps for "
        "backward; default) or eager (one PyTorch kernel per op, each reading its inputs and "
        "writing its output, counted op by op: torchtitan without torch.compile)",
    )
    t.add_argument(
        "--pipeline-split",
        dest="split",
        default=None,
        help="how the blocks are cut into pipeline stages: engine (paracube train's cut by "
        "--balance, which gives a heavy embedding or head fewer blocks beside it; default), "
        "even (Megatron's equal blocks per virtual stage, the embedding and head on top) or "
        "even-ends (the embedding and the loss each counted as a block: Megatron-Core's "
        "--account-for-embedding/loss-in-pipeline-split) or torchtitan (the embedding and "
        "the head a layer each, the layers dealt as evenly as they go, the first stages "
        "taking the rest), or an explicit layout in Megatron-Core's grammar "
        "(--pipeline-model-parallel-layout: E the embedding, t a block, m a multi-token "
        "prediction module, L the loss, | between virtual stages, x*n and (…)*n repeat; "
        "stage k on rank k mod pp, so it fixes pp × chunks: DeepSeek-V3's 'Et|(tt|)*30mL')",
    )
    o = p.add_argument_group("output")
    o.add_argument("--top", type=int, default=5)
    o.add_argument("--explain", action="store_true", help="the reasoning, in plain language")
    o.add_argument(
        "--epochs",
        type=float,
        default=None,
        help="time to train this many epochs, on the best layout and on the speed-up's "
        "baseline (resnet50: ImageNet-1k's 1,281,167 images; transformers: --train-samples)",
    )
    o.add_argument(
        "--train-samples",
        type=float,
        default=None,
        help="samples (sequences, images) in one epoch, for --epochs",
    )
    o.add_argument(
        "--train-tokens",
        type=token_count,
        default=None,
        metavar="N",
        help="time to train on N tokens (a transformer's budget: 2e12, 300B, 15T), on the best "
        "layout and on the speed-up's baseline",
    )
    o.add_argument("--json", action="store_true", help="every figure as JSON")
    o.add_argument(
        "--emit",
        choices=["torchrun", "megatron"],
        default=None,
        help="print the launch command: paracube train's (torchrun), or Megatron-LM's "
        "pretrain_gpt.py for a plan as Megatron-LM runs it (megatron: --stack megatron-core)",
    )
    o.add_argument(
        "--calibrate",
        action="store_true",
        help="measure this machine (matmul rate, memory and gloo bandwidth) for `train --predict`",
    )
    from paracube.cli.plan import cmd_plan

    p.set_defaults(func=cmd_plan)
