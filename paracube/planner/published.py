"""Published large-scale training runs, as the planner's accuracy check (pure math).

Each run's paper states the model, the cluster, the layout, the global batch and the achieved
throughput. :func:`evaluate` has the planner time that layout — choosing only what the paper
leaves open — with the run's software stated as planner options (attention fused or not,
sequence parallelism, gradient reduction overlapped or not), and converts its step time into
TFLOP/s per GPU with the paper's own counting: *hardware* FLOPs (SC21 Eq. 3, the recomputed
forward included) or *model* FLOPs (Korthikanti Eq. 7, MFU × peak). Nothing in the planner is
fitted to these numbers; ``benchmarks/bench_planner_published.py`` prints the table.

Sources:
- SC21: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", Table 1 (A100-80GB, DGX A100, fp16, full recompute, 1F1B,
  sequence 2048, vocabulary 51,200).
- Korthikanti: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", Tables 3 and 5 (micro-batch 1, tp 8, dp 1; iteration times of the
  full-recompute baseline and of sequence parallel + selective recompute).
- MT-NLG: Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing NLG
  530B", §2.3 (280 / 350 / 420 DGX A100, tp 8 × pp 35, global batch 1920, bf16, full
  recompute; DeepSpeed's pipeline engine).
- BLOOM: bigscience-workshop/bigscience, ``train/tr11-176B-ml/`` — the production run's
  slurm script (``tr11-176B-ml.slurm``: 48 nodes of 8 A100 80GB, TP 4 × PP 12 × DP 8,
  micro-batch 2, global batch 2048 × 2048 tokens, bf16, ``--checkpoint-activations``,
  70 layers of 14,336 hidden, 112 heads, vocabulary padded to 250,880, tied embedding,
  ALiBi, Megatron-DeepSpeed's pipeline engine with ``--pp-partition-method
  'type:transformer|embedding'`` — the embeddings counted as blocks — and DeepSpeed's
  BF16_Optimizer: fp32 gradients all-reduced, ZeRO-1's sharded step) and its README (the
  cluster: "4 OmniPath links" per node; the steady-state log line of iteration 85,376:
  "elapsed time per iteration (s): 104.70 | global batch size: 2048 | … | TFLOPs: 149.77",
  hardware FLOPs with the recomputed forward). BLOOM reshaping: ``reshaping-log.md`` in
  the same folder, the run resumed on 24 and 36 nodes at other TP × PP × micro-batch; the
  layouts whose last two logged iterations agree within 1 % (:data:`BLOOM_STEPS`).
- Llama 3: Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4 and §3.3 (405B on
  H100, tp 8, pp 16, sequence 8192, 16M tokens per batch, BF16 MFU; no activation
  checkpointing; one block fewer on the first and the last pipeline stage, §3.3.2). The
  table's third row (131,072 tokens at cp 16) is left out: its virtual stages are not
  stated, and its MFU converts to tokens/s only under a count of causal attention the
  paper does not give.
- Nemotron-4 report: NVIDIA 2024, "Nemotron-4 340B Technical Report" (arXiv 2406.11704),
  §2 and Table 2: 768 DGX H100 nodes, 8-way tensor and 12-way interleaved pipeline
  parallelism, the batch ramp's last stage — data parallel 64 on 6,144 GPUs, global batch
  2,304 × 4,096 tokens, 8.0 s per iteration, MFU 41.0 % (paracube's FLOP count gives
  40.9 %: test). The model from NeMo's nemotron_340b.yaml (below); recomputation and the
  virtual stages are left to the planner.
- Nemotron-4 15B report: Parmar et al. 2024, "Nemotron-4 15B Technical Report" (arXiv
  2402.16819), Table 1 (32 blocks of 6,144, 48 heads, 8 KV heads, 4,096 tokens, a
  256,000-token vocabulary), its pre-training section and Table 2: 384 DGX H100 nodes
  (eight 400 Gb/s HCAs each), 8-way tensor parallelism, data parallelism with the
  distributed optimizer; the batch ramp's three stages — data parallel 96, 192 and 288 on
  768, 1,536 and 2,304 GPUs, batches of 384, 768 and 1,152, 0.57, 0.58 and 0.64 s an
  iteration, MFU 34.3, 33.3 and 30.5 % (paracube's FLOP count gives 34.1, 33.6, 30.4,
  within the rounding of the iteration times: test). Sequence parallelism, recomputation
  and the micro-batch are not stated and left to the planner; the tensor-parallel overlap
  of NeMo's later recipes is not stated and not assumed (Megatron's default: off).
- Megatron-Core: NVIDIA/Megatron-LM ``README.md``, "Performance Benchmarking": GPT-3 175B
  "strong scaled ... from 96 H100 GPUs to 4608 GPUs, using the same batch size of 1152
  sequences", MFU 47 % → 42 %; the section's benchmark configuration (vocabulary 131,072,
  sequence 4096, DP/TP/PP communication overlapped) and the README's parallelism guide for
  GPT-3 175B (TP 4, PP 8); virtual stages, micro-batch and ZeRO are left to the planner.
- MosaicML: mosaicml/llm-foundry, ``scripts/train/benchmarking/README.md``, every row of
  its H100 80GB, A100 80GB and A100 40GB BF16 tables and of its H100 80GB FP8 table, of
  the H100 table of its 2023 revision, and of the first sweep's A100 80GB table (mosaicml/
  examples, ``examples/llm/throughput/README.md``) (:mod:`paracube.planner.mosaic`: MPT
  models on Composer's FSDP FULL_SHARD — ZeRO-3 with no tensor or pipeline parallelism —,
  FlashAttention in Triton; MFU by the README's formula, the same model FLOPs as
  Korthikanti Eq. 7).
- torchtitan: pytorch/torchtitan, ``docs/performance.md`` (Llama 2 and Llama 3 on 64
  A100-80GB with FSDP2, local batch 1–2; tokens/s per GPU converted to model TFLOP/s here
  with paracube's own FLOP count), with their checkpointing: none, full, "selective layer"
  (every other block: half the blocks recomputed) and "selective op" (the op-level policy,
  ``recompute="op"``: :func:`paracube.models.shapes.op_checkpoint_linears`).
- torchtitan on H200 (FP8): pytorch/torchtitan, ``benchmarks/llama3_8b_h200_2025-06_torchtitan.md``
  (Trainy, June 2025; the same table as ``llama3-8b_h200_202506_trainy-whitefiber.md``):
  Llama 3.1 8B on 4 and 8 hosts of 8 H200s, "400Gb/s (Mellanox CX-7) per GPU", 10,938 and
  10,753 tokens/s per GPU; its command: ``llama3_8b.toml`` (8,192 tokens, op-level selective
  checkpointing), local batch 2, torch.compile, torchao's float8 (tensor-wise dynamic scaling:
  the planner's current scaling) with float8 all-gathers of the FSDP2 parameters.
- torchtitan on H100 (December 2024): pytorch/torchtitan, ``benchmarks/
  llama3_h100_202412_torchtitan.md``: Grand Teton hosts of 8 H100s ("96GB HBM2e with 2.4
  TB/sec", "the default 500W power limit", "400 Gb/s per GPU"; the GPU as
  ``hardware.GPUS["h100-96gb-500w"]``), tokens/s per GPU read at iteration 90. Its Tables 1
  and 3: Llama 3.1 8B with FSDP2 on 8 and 128 GPUs, local batch 2, op-level selective
  checkpointing (``train_configs/llama3_8b.toml``: 8,192 tokens, ``norm_type = "rmsnorm"``,
  ``compile = false`` — eager blocks, their element-wise ops counted op by op), then with
  torch.compile, then with torch.compile and torchao's float8; Table 2: the same model on 8
  GPUs at 32K–256K tokens over FSDP × context parallel 1–8 (local batch 1, every block
  checkpointed, compiled and float8; the context-parallel rotation then ``allgather``:
  ``torchtitan/config_manager.py``, ``--experimental.context_parallel_rotate_method``); Table
  4: Llama 3.1 70B on 256 GPUs, FSDP 32 × TP 8 (sequence parallel: torchtitan's TP plan
  shards the norms), local batch 16, every block checkpointed, compiled and float8, without
  and with async TP (the planner's TP overlap). Tables 5 and 6 (405B pipelined) state
  neither the micro-batch count nor the virtual stages and are left out.
- IBM FMS FSDP: foundation-model-stack/fms-fsdp, ``README.md``'s throughput table (128
  A100s, tokens/s per GPU; PyTorch blog, "Maximizing training throughput using PyTorch
  FSDP", IBM and Meta, 2024): the two FULL_SHARD rows — its "34b" at batch 8 and Llama 2
  70B at batch 6 per GPU, activation checkpointing on (every block: ``selective_checkpointing``
  1), sequence 4,096, SDPA's FlashAttention-2, bf16 gradients reduced (its bfSixteen policy),
  one micro-batch per step; A100 80GB (70B at batch 6 does not fit 40 GB). The two HYBRID_SHARD
  rows (7B, 13B: sharded within a node, replicated across; ``Layout.shard``) are left out:
  they turn on the network between the nodes, which neither the README nor the blog states
  — the planner gives them 1.15 and 1.32 on InfiniBand HDR (25 GB/s a GPU), 0.72 and 0.48
  on one 100 Gb/s Ethernet NIC per node (hybrid sharding is what a slow network is given);
  a network chosen to match them would be fitted, not predicted.
- LLaMA: Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language Models", §2.4:
  the 65B model at "around 380 tokens/sec/GPU on 2048 A100 GPU with 80GB of RAM" (1.4T
  tokens in about 21 days, which it agrees with), 4M-token batches (Table 2) of 2,048-token
  sequences, the 65B shape of Table 2 (80 blocks of 8,192, 64 heads; the released model's
  SwiGLU of 22,016), xformers' causal attention kernel, "model and sequence parallelism, as
  described by Korthikanti et al. (2022)" with the expensive activations (the linear layers'
  outputs) kept and the cheap ones recomputed — the planner's fused attention, sequence
  parallelism and selective recomputation. The model-parallel sizes, ZeRO and micro-batch
  are not stated: the planner's; the network neither (200 Gb/s a GPU, the A100 default,
  what both of Meta's clusters give a GPU: Llama 2 paper §2.2.1).
- TinyLlama: jzhang38/TinyLlama, ``README.md`` ("24k tokens per second per A100-40G GPU",
  16 A100-40G, 2M-token batches of 2,048 tokens, "a per-gpu batch size of 16k tokens", no
  activation checkpointing; FlashAttention-2, fused norm, SwiGLU, rotary and cross-entropy)
  and ``pretrain/tinyllama.py`` (micro-batch 8; Lightning's FSDPStrategy: FULL_SHARD over
  every GPU, one unit per block; bf16-mixed, whose FSDP policy reduces gradients in bf16;
  torch.optim.AdamW with ``foreach=False``, a kernel per op and parameter); the 1.1B shape
  of its README's table (22 blocks of 2,048, 32 heads in 4 groups, SwiGLU of 5,632, Llama's
  32,000 tokens). Two nodes whose network the repository does not state: the planner's
  InfiniBand default gives 0.95, one 100 Gb/s Ethernet NIC per node 0.91 — the step hides
  its gathers either way.
- OLMo-core: allenai/OLMo-core, ``README.md`` (its revision of early 2025: throughput "in
  tokens per second per device", "measured on a cluster with NVIDIA H100 GPUs") — the Llama
  8B rows, 9,500 tokens/s in BF16 and 12,500 with ``--model.float8_config.enabled=true``
  ("most matrix multiplications are computed in float8, everything else is in bfloat16":
  torchao's float8, scaled per tensor from its own amax — the planner's current scaling);
  ``src/scripts/train/Llama-8B.py``: Llama 3 8B's shape at the dolma2 tokenizer's 100,352
  padded tokens and 4,096-token sequences, FSDP2 (``DataParallelType.fsdp``: bf16
  parameters, fp32 reduction), torch.compile'd blocks and loss, a fused AdamW, micro-batches
  of 2 × 4,096 tokens, 1,024 sequences a step, no activation checkpointing. The GPU count is
  not stated: the scripts' launcher default, one node of 8 (``olmo_core.internal.experiment``,
  ``num_nodes=1``) — 16 to 64 GPUs predict within 0.01 of it; the blocks counted as
  compiled blocks keep (``activations="compiled"``: 70 GB a GPU; as eager blocks, 93).
  The same table's OLMo 2 13B rows, 4,600 and 5,500 tokens/s: ``OLMo2-13B.py`` (commit
  45d9c18) — ``TransformerConfig.olmo2_13B``, Llama 2 13B's shape with q/k norms and the
  reordered norms, at the same vocabulary; micro-batches of one 4,096-token sequence, 2,048
  a step, HSDP (sharded within a node: on the one node, FSDP), bf16 parameters and fp32
  reduction, torch.compile'd blocks, a fused AdamW, no activation checkpointing. Which
  revision of the script the table measured is not stated (its float8 override names the
  model's config, where that commit keeps it in the train module); two sequences a
  micro-batch would not fit (the planner's memory model, compiled blocks: 116 GB) and plan
  higher still. The table's 1B and 7B rows are left out: the 7B script stored beside it
  runs 2,048-token micro-batches against the table's 4,096, and no 1B script of that
  revision is stored.
- FlashAttention's GPT: Dao-AILab/flash-attention, ``training/README.md`` ("Training
  speed", added in its commit of 29 November 2022 with the configurations it names): GPT-3
  125M to 2.7B on The Pile, "one node with 8 x A100 80GB SXM4 80GB (400W) with NVLink",
  tokens/s for the node; FlashAttention's own CUDA kernels of that time (flash-attn before
  2.0: the planner's ``fused-v1``), its fused matmul + bias + GELU, dropout + residual +
  LayerNorm and cross-entropy kernels, no activation checkpointing, bf16 autocast (fp32
  parameters and gradients). ``training/configs/experiment/pile/``: ``base.yaml`` (2,048
  tokens, 256 sequences a step, Lightning DDP, apex's fused AdamW, GPT-2's 50,257 tokens
  padded to a multiple of 8, learned positions, tied embedding), ``gpt3{s,m,l,xl}-flash.yaml``
  and ``gpt3-2.7B-flash-hdim128.yaml`` (the shapes; the per-GPU batch each picks on an 80 GB
  GPU: 32, 16, 16, 8, 4; 512 sequences a step from 1.3B; from 760M PyTorch's
  ZeroRedundancyOptimizer over ``torch.optim.AdamW`` — ZeRO-1, an op per pass).
- FlashAttention-2 paper: Dao 2023, "FlashAttention-2: Faster Attention with Better
  Parallelism and Work Partitioning" (arXiv 2307.08691), §4.2 and Table 1: GPT3-1.3B and
  GPT3-2.7B at 2k and 8k tokens "on 8 x A100 80GB SXM", TFLOP/s per GPU counted as
  6·seqlen·params + 12·layers·hidden·seqlen² a sequence (its stated formula, attention not
  halved for the causal mask) — here turned into tokens/s with the model's exact parameter
  count (``shapes.parameter_count``: learned positions, biases and norms included) and back
  into TFLOP/s with paracube's count. The FlashAttention-2 column at 2k and 8k and the
  FlashAttention column at 8k (its 2k figures are the README's runs, above); the column
  without FlashAttention is left out — the paper does not say what its baseline ran. The
  same training code as the README's runs (the paper's models are its GPT3-1.3B and its
  2.7B at head size 128, whose FlashAttention 2k figure, 189, is the README's 85k tokens/s);
  the 8k runs from ``gpt3xl-flash-8k.yaml`` (128 sequences a step, 4 a GPU at 80 GB, ZeRO-1
  from ``gpt3xl-flash.yaml``) and ``gpt3-2.7B-flash-8k.yaml``, whose 32 heads of 80 the
  2k runs had replaced by 20 of 128 (the README: "we set head dimension to 128 (instead of
  80) for better efficiency"; the repository has a 2.7B 8k config at 128 too). At 80 the
  planner gives these two rows 0.79 and 0.94: FlashAttention 1 pads a head of 80 to 128.
  That 2.7B config's 4 sequences a GPU would hold 125 GB by the planner's memory model, and
  the paper does not state the micro-batch, so the planner chooses it there (2; its
  predictions at 4 differ by under 1 %).
- Zero Bubble paper: Qi et al. 2024, "Zero Bubble Pipeline Parallelism" (ICLR 2024, arXiv
  2401.10241), §5.1 and Tables 3 and 4: GPT-3-like models of 1.5B, 6.2B, 14.6B and 28.3B
  (22, 30, 46 and 62 blocks of 2,304, 4,096, 5,120 and 6,144; 24–48 heads; 1,024 tokens)
  pipelined alone over 8, 8, 16 and 32 A100 SXM 80GB ("distributed across 4 nodes
  interconnected by a RoCE RDMA network": the planner's default network, unstated), at
  micro-batches of 6, 3, 1 and 1, three micro-batch counts each, on Megatron-LM with "both
  the initial and final pipeline stages [holding] one fewer transformer layer" (the
  planner's ``even-ends`` split); samples per GPU per second × 1,024 tokens × paracube's
  model FLOPs. Three of its four schedules: 1F1B, interleaved 1F1B ("each transformer layer
  serves as a chunk": virtual stages of one layer, the embedding and the loss one each) and
  ZB-1p as the planner's ZB-H1 — its Table 5 gives ZB-1p the bubble of ZB-H1 in every
  setup. ZB-2p (twice 1F1B's activations) is not a schedule the planner has. The paper
  states neither the vocabulary nor the kernels: a 32,000-token tied embedding gives all
  four stated sizes to their last digit (``shapes.parameter_count``: 1.48, 6.18, 14.64,
  28.29B; GPT-2's 50,257 gives 6.25, 14.74 and 28.41), the SentencePiece tokenizer of the
  repository's sample dataset; the software is its example script at the paper's 1,024
  tokens (sail-sg/zero-bubble-pipeline-parallelism, ``examples/pretrain_zbh1.sh``:
  ``--fp16``, ``--recompute-granularity selective``, no ``--use-flash-attn`` — Megatron's
  unfused attention), with Megatron-LM's gradient-accumulation fusion (on unless
  ``--no-gradient-accumulation-fusion``). With FlashAttention-2 and no recomputation instead
  (its later scripts, at 4,096 tokens) the planner gives 1.10–1.43. Its Table 8 runs 1F1B
  and ZB-1p again at twice the micro-batch; its Table 9 adds 1F1B
  with as few micro-batches as stages or fewer (2–16 on 8 and 16 stages), planned as GPipe
  below the stage count: Megatron's 1F1B then runs a stage's forwards before its backwards.
- NeMo AutoModel: NVIDIA-NeMo/Automodel, ``docs/performance-summary.md`` (the version of
  April 2026; also docs.nvidia.com/nemo/automodel, "Performance Summary"), pre-training on
  DGX-H100 in BF16: Llama 3 70B on 64 GPUs, global batch 128 × 8192 tokens, micro-batch 1,
  4 accumulation steps, FSDP2 over 32 ranks × context parallel 2, Transformer Engine
  kernels, 866.77 tokens/s per GPU (converted with paracube's FLOP count); checkpointing
  is not stated, so the planner chooses it.
- NeMo (FP8): NVIDIA/NeMo, ``docs/source/performance/performance_summary.md`` (container
  NeMo 24.07, DGX-H100, FP8): pre-training rows of GPT-3 5B/20B/175B and Llama 2 7B/13B/70B,
  Llama 3 8B/70B (TP, PP, CP, VP, MBS, GBS as tabled; tokens/s per GPU converted with
  paracube's FLOP count). The software each ran, from NVIDIA/NeMo-Framework-Launcher
  ``launcher_scripts/conf/training``: GPT-3 ``gpt3/{5b,20b,175b}_fp8_performance.yaml`` (24,
  44 and 96 layers of 4096, 6144, 12288 hidden, 32/48/96 heads, GPT-2 BPE vocabulary padded
  to 50,304; selective recomputation, sequence parallel, the distributed optimizer, bf16
  gradient sync, overlapped), Llama ``llama/llama{2,3}_*.yaml`` (no recomputation, the
  distributed optimizer); Transformer Engine's FP8 linear layers, its fused attention,
  Megatron's fused loss; Nemotron ``nemotron/nemotron_{8b,22b,340b}.yaml`` (no
  recomputation, userbuffers' overlap; 340B's gradients synced in bf16), shapes from the
  same files (squared-ReLU MLP of 4·h, no biases, rotary; the 256,000-token vocabulary).
  The table's "Model TFLOP / sec / GPU" is its tokens/s × paracube's model FLOPs per token
  to 0.2 % in every row (a test checks it): NeMo counts as paracube does.
- DGX Cloud benchmarking: NVIDIA/dgxc-benchmarking, the H100 tables of its recipes'
  READMEs (:data:`DGXC_TABLES`): ``nemo_megatron/README_175b.md`` (GPT-3 175B, TP 4 × PP 8
  × VP 12, 128–2,048 GPUs), ``nemotron/README_15b.md`` (Nemotron-4 15B, TP 4, micro-batch
  4, 16–2,048 GPUs), ``nemotron/README_340b.md`` (NeMo 24.11: Nemotron-4 340B, TP 8 × PP 8
  × VP 12, 128–2,048 GPUs), ``llama3.1/README_{8b,70b,405b}.md`` (NeMo 24.09: Llama 3.1
  8B at CP 2, 70B at TP 4 × PP 4 × CP 2 × VP 5, 405B at TP 8 × PP 9 × CP 2 × VP 7 on 576–
  2,304 GPUs and its "proxy" configurations of 7, 21 and 42 blocks on 32–192 GPUs), each
  in BF16 and in FP8: the global batch and the logged ``train_step_timing`` of every GPU
  count (their MFU columns follow from those with the READMEs' own FLOP formulas: test).
  The software from the yaml each recipe names (``nemo_megatron/gpt3_175b_hydra.yaml``,
  ``nemotron/nemotron4-15b-synth.yaml``; NeMo-Framework-Launcher
  ``conf/training/llama/llama3_1_*.yaml`` and ``nemotron/nemotron_340b.yaml``): no
  recomputation, sequence parallelism, userbuffers' TP overlap, the distributed optimizer
  (GPT-3 and Nemotron-4 340B reducing gradients in bf16), Transformer Engine with delayed
  FP8 scaling.
- NeMo long sequence (FP8): NVIDIA/NeMo, ``docs/source/performance/performance_long_sequence.md``
  (container NeMo 24.03.01, DGX-H100, FP8): Llama 2 7B from 4K to 1M tokens per sequence,
  the with-CP configurations (TP, PP, DP, CP as tabled, context parallel up to 32), TFLOP/s
  per GPU counted as NeMo counts (= paracube's count, above); the global batch of each run
  (1,024 sequences at 4K down to 4 at 1M, micro-batch 1) from the same table as
  ``performance_summary.md`` prints it (its "Long Input Sequences" section, a later edit
  of the 24.07 page); checkpointing is left to the planner.
- Megatron-Bridge (FP8): NVIDIA-NeMo/Megatron-Bridge, ``docs/performance-summary.md``,
  container 25.11, DGX-H100: the dense rows (Llama 3 8B on 8 GPUs with Megatron's FSDP,
  Llama 3 70B at TP 4 × PP 8 × VP 5, Llama 3.1 405B on 1,024 GPUs at TP 8 × PP 8 × CP 2 ×
  VP 8), and ``docs/performance-summary-archive.md``, container 26.02: the same recipes at
  global batch 256 (70B) and 1,536 (405B). FP8 with current scaling
  (``fp8_scaling="current"``: each tensor's amax read before its cast); the software from
  the repository: gradients reduced in bf16 (``scripts/performance/configs/llama/
  llama3{,1}_llm_pretrain.py``: ``grad_reduce_in_fp32 = False``), userbuffers' TP overlap
  and, for 405B, the embedding and the loss counted in the pipeline split
  (``src/megatron/bridge/recipes/llama/llama3_70b.py``, ``llama31_405b.py``);
  checkpointing is not stated, so the planner chooses it.
- Megatron-Bridge, MoE (FP8): the same pages, DGX-H100: Qwen3-30B-A3B (128 experts of 768,
  8 a token) on 16 GPUs at TP 1 × PP 2 × EP 8 — 25.11: global batch 512, micro-batch 2,
  VP 24, 5,275 tokens/s per GPU; 26.02: 1,024, 1, VP 12, 5,113 — forced-balanced and
  dropless, as the pages say; no recomputation and the flex dispatcher, DeepEP's dispatch
  (``scripts/performance/configs/qwen/qwen3_llm_pretrain.py``: ``set_qwen3_common_configs``,
  ``qwen3_30b_a3b_pretrain_config_h100``). The 25.09 table's run of the 25.11 layout, token-dropping,
  10,494 tokens/s, states no precision and is left out. Qwen3-235B-A22B on 256 GPUs at
  TP 2 × PP 8 × VP 4, EP 32 folded over TP × DP at expert-tensor-parallel size 1
  (Megatron-Core's parallel folding; ``scripts/performance/configs/qwen/
  qwen3_workload_base_configs.py``: ``expert_tensor_parallel_size=1``, global batch 2,048,
  V2 8,192, ``moe_a2a_overlap`` on H100 in the V2 era; ``qwen3_llm_pretrain.py``: no
  recomputation), micro-batch 1 — 25.11: 1,575 tokens/s per GPU (the row's global-batch
  cell is missing; the recipe's 2,048); 26.02: global batch 8,192, 1,633.
- Megatron-Bridge, GPT-OSS-120B (BF16): the 26.02 table, DGX-H100, 64 GPUs at PP 4 × EP 8
  (expert-tensor-parallel size 1), global batch 1,280, micro-batch 1, 5,993 tokens/s per
  GPU, its recipe ``GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V2``
  (``scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py``: the norms and
  the experts' activation recomputed); a 128-token sliding window in alternate blocks
  (``ModelConfig.attention_window``). The 25.11 table's row (global batch 512,
  micro-batch 4, 5,630) is left out: the recipe of that release was not read.
- Megatron-Bridge, DeepSeek-V3 (FP8): the archive page's 25.09 table, DGX-H100,
  "DeepSeekV3 (dropless)" on 1,024 GPUs at TP 2 × PP 8 × VP 4 × EP 64, global batch 8,192,
  micro-batch 1, 1,297 tokens/s per GPU — FP8 with current scaling (its 338 TFLOP/s beside
  a parenthesised 330, which the page's note makes the H100's 128 × 128 blockwise FP8). The
  software from ``scripts/performance/configs/deepseek/deepseek_workload_base_configs.py``
  (DEEPSEEK_V3_PRETRAIN_CONFIG_H100_V1: experts folded at expert-tensor-parallel size 1,
  the flex dispatcher, the all-to-alls not overlapped, the pipeline layout
  ``Et|(tt|)*30mL`` — the embedding and a block first, the MTP module and the loss alone
  last; :mod:`paracube.planner.pipeline_layout`) and the recipe
  (``src/megatron/bridge/recipes/deepseek/deepseek_v3.py``: one MTP module, bf16 gradient
  reduction, no userbuffers' TP overlap, the precision-aware optimizer's bf16 moments, the
  selective recomputation of the latent attention's up projections and the dense MLPs).
- NeMo AutoModel, MoE: its ``docs/performance-summary.md`` (versions of October 2025 on):
  Qwen3 MoE 30B on 8 H100s in BF16, FSDP2 over 8 ranks × EP 8, global batch 512 × 4,096
  tokens, micro-batch 4, 16 accumulation steps, 12,040 tokens/s per GPU; its recipe
  (``examples/benchmark/configs/qwen3_moe_30b_te_deepep.yaml``) checkpoints every block whole
  (``activation_checkpointing: true``, which ``nemo_automodel/components/moe/
  parallelizer.py``, ``apply_ac``, turns into torch's ``checkpoint_wrapper`` around each
  block), dispatches with DeepEP (``enable_deepep: true``) and routes with the fake balanced
  gate (``fake_balanced_gate: true``: ``FakeBalancedGate`` in ``nemo_automodel/components/
  moe/layers.py``, token i to experts 8i … 8i + 7 mod 128 — one rank of the 8 each).
- Megatron-MoE-ModelZoo (Megatron-Core's MoE team): yanring/Megatron-MoE-ModelZoo,
  ``best_practice/Qwen3/readme.md``: Qwen3-235B-A22B on 256 H100s (InfiniBand 8 × 50 GB/s a
  node) in BF16, sequence 4,096, global batch 2,048, micro-batch 1, every row of its main
  table that the planner has the parts for (:data:`MOE_MODEL_ZOO_QWEN3`): expert
  parallelism over 4 nodes with DeepEP, with and without the 1F1B pairing of all-to-alls,
  and within each node with the all-to-all dispatcher (TP 2 × PP 32 × VP 3) or DeepEP
  (TP 4 × PP 8 × VP 4); the software from its ``model_configs/benchmarking/
  Qwen3-235B-A22B.yaml`` and ``runtime_configs/benchmarking/runtime.conf``. The same page's
  long-context table (:data:`MOE_MODEL_ZOO_LONG`): 32 nodes, DeepEP, BF16, PP 8 × VP 4 ×
  TP 4 × EP 8, CP 1, 2, 4 and 8 at 16K, 32K, 64K and 128K tokens, global batch 256, the
  norms and the mixture recomputed (its command line), TFLOPS per GPU dropless — the rows
  its main table's runs are (it adds --moe-router-force-load-balancing only for the forced
  figures). Its TFLOPS are Megatron-LM's count, whose attention is the causal half
  (:func:`megatron_causal_flops_per_token`: the main table's step times and TFLOPS agree
  with it within 1 %); each is turned into paracube's count.
- InternLM: InternLM/InternLM, ``doc/en/train_performance.md`` (InternLM-7B's scaling tests,
  2023): A100 80GB nodes of 8 over "4 * 100Gb RoCE" (``roce-4x100``), sequence 2,048, from
  8 to 1,024 GPUs. Both FLOPS tables (packed samples, tp 1, ZeRO-1 within each node —
  ``zero1=8``, :attr:`~paracube.planner.layout.Layout.shard` under ZeRO-1 —, with and
  without activation checkpointing, 11 rows each: tokens/s per GPU, and the TFLOPS the
  table derives from them with Megatron's count, which paracube's hardware FLOPs reproduce
  within 4 %), and the throughput table's three other layouts (tp 1 and 2 with ZeRO-1 over
  every data-parallel rank, tp 2 within groups of 4; 8 GPU counts each; its tp 1, zero1=8
  row is the FLOPS table's runs). The throughput table ran ``pack_sample_into_one=False``
  — attention within each packed document, cheaper than the whole 2,048 the planner
  charges: under 4 % of a step's FLOPs at this size, a tenth of its time at FlashAttention
  1's rate. The software from the code (:data:`~paracube.planner.stacks.INTERNLM`):
  FlashAttention's first kernels (``doc/en/install.md`` pins "Flash-Attention == v1.0.5"),
  bf16 gradient all-reduce in 512M-element buckets during the last backward, a broadcast
  from each ZeRO rank after the step.
- ResNet-50 (:data:`RESNET50_RUNS`, a model described without layers: not in :func:`runs`):
  NVIDIA/DeepLearningExamples, ``PyTorch/Classification/ConvNets/resnet50v1.5/README.md``,
  "Training performance results" (pytorch-21.03 container): images/s on 1 and 8 GPUs of a
  DGX A100 (8 × A100 80GB, TF32 and mixed precision) and of DGX-1s (8 × V100 16GB and
  32GB, FP32 and mixed precision — apex AMP, fp16); the per-GPU batch of each from the same
  folder's ``configs.yml`` (256; FP32 on DGX-1V 112).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from paracube.config import ModelConfig
from paracube.models import shapes
from paracube.models.presets import preset
from paracube.planner import hardware as hw
from paracube.planner import mosaic
from paracube.planner.flops import hardware_flops_per_token, model_flops_per_token
from paracube.planner.layout_memory import peak_memory
from paracube.planner.search import Candidate, candidate_layouts, search
from paracube.planner.stacks import (
    COMPOSER_FSDP,
    FSDP2,
    INTERNLM,
    MEGATRON_2021,
    MEGATRON_CORE,
    MEGATRON_FP16,
    MEGATRON_SPLIT,
    PYTORCH_FSDP,
    WHOLE_REPLAY,
)
from paracube.planner.time_model import Cluster, estimate


def gpt(heads: int, hidden: int, layers: int) -> ModelConfig:
    return ModelConfig(
        n_layers=layers,
        hidden=hidden,
        n_heads=heads,
        vocab_size=51200,
        seq_len=2048,
        name=f"GPT h={hidden} L={layers}",
    )


def runs() -> list[dict]:
    """Every published run, with the planner options that describe its software."""
    return (
        _sc21()
        + _korthikanti()
        + _mt_nlg()
        + _bloom()
        + _llama3()
        + _nemotron4_production()
        + _nemotron4_15b_production()
        + _megatron_core_h100()
        + _mosaic()
        + _torchtitan()
        + _torchtitan_h200()
        + _torchtitan_h100()
        + _fms_fsdp()
        + _llama1()
        + _tinyllama()
        + _olmo_core()
        + _flash_attention_gpt()
        + _flash_attention_2()
        + _zero_bubble()
        + _automodel()
        + _nemo_fp8()
        + _dgxc()
        + _dgxc_grok1()
        + _qwen3_moe()
        + _deepseek_v3()
        + _gpt_oss()
        + _moe_model_zoo()
        + _megatron_bridge_fp8()
        + _nemo_long_sequence()
        + _internlm()
    )


MOSAIC_SOURCE = {
    "h100": "MosaicML (H100)",
    "a100-80gb": "MosaicML (A100 80GB)",
    "a100-40gb": "MosaicML (A100 40GB)",
}

# The stack each source ran: the accuracy is reported per stack (Megatron's own software,
# DeepSpeed's pipeline engine, Meta's production stack, the FSDP-only ones).
STACKS = {
    "SC21": "Megatron-LM",
    "Korthikanti (full)": "Megatron-LM",
    "Korthikanti (SP+sel.)": "Megatron-LM",
    "MT-NLG": "DeepSpeed pipeline + Megatron TP",
    "BLOOM": "DeepSpeed pipeline + Megatron TP",
    "BLOOM reshaping": "DeepSpeed pipeline + Megatron TP",
    "Llama 3": "Meta production (H100)",
    "Nemotron-4 report": "NVIDIA production (H100)",
    "Nemotron-4 15B report": "NVIDIA production (H100)",
    "Megatron-Core": "Megatron-Core (H100)",
    "MosaicML (H100)": "FSDP-only: Composer (H100)",
    "MosaicML (A100 80GB)": "FSDP-only: Composer (A100)",
    "MosaicML (A100 40GB)": "FSDP-only: Composer (A100)",
    "MosaicML (H100 FP8)": "FSDP-only: Composer, FP8 (H100)",
    "MosaicML (H100, 2023)": "FSDP-only: Composer (H100)",
    "MosaicML (A100 80GB, PURE)": "FSDP-only: Composer (A100)",
    "torchtitan": "FSDP-only: FSDP2 (A100)",
    "torchtitan (H200, FP8)": "FSDP-only: FSDP2, FP8 (H200)",
    "torchtitan (H100 500 W)": "FSDP-only: FSDP2 (H100)",
    "torchtitan (H100 500 W), compiled": "FSDP-only: FSDP2 (H100)",
    "torchtitan (H100 500 W), compiled, FP8": "FSDP-only: FSDP2, FP8 (H100)",
    "IBM FMS FSDP": "FSDP-only: FSDP1 (A100)",
    "LLaMA": "Meta production (A100)",
    "TinyLlama": "FSDP-only: FSDP1 (A100)",
    "OLMo-core": "FSDP-only: FSDP2 (H100)",
    "OLMo-core (FP8)": "FSDP-only: FSDP2, FP8 (H100)",
    "FlashAttention's GPT": "DDP / ZeRO-1: FlashAttention's GPT (A100)",
    "FlashAttention-2 paper": "DDP / ZeRO-1: FlashAttention's GPT (A100)",
    "Zero Bubble paper (1F1B)": "Megatron-LM, pipeline only (A100)",
    "Zero Bubble paper (1F1B-I)": "Megatron-LM, pipeline only (A100)",
    "Zero Bubble paper (ZB-1p)": "Megatron-LM, pipeline only (A100)",
    "Zero Bubble paper (1F1B, 2× micro-batch)": "Megatron-LM, pipeline only (A100)",
    "Zero Bubble paper (ZB-1p, 2× micro-batch)": "Megatron-LM, pipeline only (A100)",
    "NeMo AutoModel": "FSDP2 + context parallel (H100)",
    "NeMo (FP8)": "Megatron-Core via NeMo, FP8 (H100)",
    "Megatron-Bridge 25.11 (FP8)": "Megatron-Core via NeMo, FP8 (H100)",
    "Megatron-Bridge 26.02 (FP8)": "Megatron-Core via NeMo, FP8 (H100)",
    "NeMo long sequence (FP8)": "Megatron-Core via NeMo, FP8 (H100)",
    "DGX Cloud benchmarking (BF16)": "Megatron-Core via NeMo, BF16 (H100)",
    "DGX Cloud benchmarking (FP8)": "Megatron-Core via NeMo, FP8 (H100)",
    "DGX Cloud benchmarking, MoE (BF16)": "Megatron-Core MoE via NeMo, BF16 (H100)",
    "DGX Cloud benchmarking, MoE (FP8)": "Megatron-Core MoE via NeMo, FP8 (H100)",
    "Megatron-Bridge 25.09, MoE (FP8)": "Megatron-Core MoE via NeMo, FP8 (H100)",
    "Megatron-Bridge 25.11, MoE (FP8)": "Megatron-Core MoE via NeMo, FP8 (H100)",
    "Megatron-Bridge 26.02, MoE (FP8)": "Megatron-Core MoE via NeMo, FP8 (H100)",
    "Megatron-Bridge 26.02, MoE (BF16)": "Megatron-Core MoE via NeMo, BF16 (H100)",
    "NeMo AutoModel, MoE": "FSDP2 + expert parallel (H100)",
    "Megatron-MoE-ModelZoo": "Megatron-Core MoE, BF16 (H100)",
    "InternLM": "ZeRO-1: InternLM (A100)",
}


# The stacks `paracube plan --stack` names whose published runs this module holds: the run
# labels of STACKS each one's software is (DeepSpeed's pipeline engine and Meta's production
# code have no --stack of their own).
PLANNED_AS = {
    "composer": (
        "FSDP-only: Composer (H100)",
        "FSDP-only: Composer (A100)",
        "FSDP-only: Composer, FP8 (H100)",
    ),
    "fsdp": (
        "FSDP-only: FSDP2 (A100)",
        "FSDP-only: FSDP2 (H100)",
        "FSDP-only: FSDP2, FP8 (H100)",
        "FSDP-only: FSDP2, FP8 (H200)",
        "FSDP2 + context parallel (H100)",
        "FSDP2 + expert parallel (H100)",
    ),
    "torchtitan": (
        "FSDP-only: FSDP2 (A100)",
        "FSDP-only: FSDP2 (H100)",
        "FSDP-only: FSDP2, FP8 (H100)",
        "FSDP-only: FSDP2, FP8 (H200)",
        "FSDP2 + context parallel (H100)",
        "FSDP2 + expert parallel (H100)",
    ),
    "fsdp1": ("FSDP-only: FSDP1 (A100)",),
    "megatron-core": (
        "Megatron-Core (H100)",
        "NVIDIA production (H100)",
        "Megatron-Core MoE, BF16 (H100)",
        "Megatron-Core via NeMo, FP8 (H100)",
        "Megatron-Core via NeMo, BF16 (H100)",
        "Megatron-Core MoE via NeMo, BF16 (H100)",
        "Megatron-Core MoE via NeMo, FP8 (H100)",
    ),
    "nemo": (
        "Megatron-Core via NeMo, FP8 (H100)",
        "Megatron-Core via NeMo, BF16 (H100)",
        "Megatron-Core MoE via NeMo, BF16 (H100)",
        "Megatron-Core MoE via NeMo, FP8 (H100)",
    ),
    "megatron-bridge": (
        "Megatron-Core via NeMo, FP8 (H100)",
        "Megatron-Core via NeMo, BF16 (H100)",
        "Megatron-Core MoE via NeMo, FP8 (H100)",
    ),
    "megatron-lm-2021": ("Megatron-LM",),
    "internlm": ("ZeRO-1: InternLM (A100)",),
}


@dataclass(frozen=True)
class TrackRecord:
    """How the planner did on the published runs of one stack on one GPU in one precision —
    of mixtures of experts or of dense models, where ``moe`` says which: predicted ÷
    published, its range and median, and how many of the runs within ±15 %."""

    runs: int
    low: float
    median: float
    high: float
    within: int
    sources: tuple[str, ...]
    moe: bool | None = None


def track_record(
    stack_name: str | None, gpu: str, precision: str, moe: bool | None = None
) -> TrackRecord | None:
    """The planner's record on the published runs of ``stack_name`` (a ``--stack``) on
    ``gpu`` (a catalog key) in ``precision`` — only those of mixtures of experts (``moe``
    True) or of dense models (False) where ``moe`` is given: the two are timed by different
    terms, and a dense plan read against Qwen3-30B-A3B's rows, or a mixture's against dense
    ones, would borrow a spread that is not its own. None where this module holds none.

    >>> record = track_record("fsdp1", "a100-80gb", "bf16")
    >>> record.runs, record.sources
    (2, ('IBM FMS FSDP',))
    """
    labels = PLANNED_AS.get(stack_name or "", ())
    rows = [
        r
        for r in runs()
        if STACKS[r["source"]] in labels
        and r["gpu"] == gpu
        and r["precision"] == precision
        and moe in (None, r["cfg"].moe)
    ]
    if not rows:
        return None
    ratios = sorted(evaluate(r)["ratio"] for r in rows)
    return TrackRecord(
        runs=len(ratios),
        low=ratios[0],
        median=ratios[len(ratios) // 2],  # the upper middle, as the benchmark's table
        high=ratios[-1],
        within=sum(abs(x - 1) <= 0.15 for x in ratios),
        sources=tuple(dict.fromkeys(r["source"] for r in rows)),
        moe=moe,
    )


# Run tables are laid out as tables, not by the formatter.
# fmt: off
def _run(source: str, cfg: ModelConfig, gpu: str, gpus: int, batch: int, precision: str,
         fixed: dict, counting: str, published: float, inter: str = "") -> dict:
    """One published run: its model, cluster, global batch, layout (``fixed``: what the paper
    states), FLOP counting (``hardware`` or ``model``) and achieved TFLOP/s per GPU; ``inter``:
    the cluster's network where it is not the GPU's usual one (hardware.DEFAULT_INTER)."""
    return dict(source=source, cfg=cfg, gpu=gpu, gpus=gpus, batch=batch, precision=precision,
                fixed=fixed, counting=counting, published=published,
                inter=inter or hw.DEFAULT_INTER[gpu])


def _sc21() -> list[dict]:
    """SC21 Table 1: fp16, full recomputation, 1F1B, no ZeRO; the micro-batch left to the
    planner."""
    out = []
    # heads, hidden, layers, tp, pp, GPUs, global batch, achieved TFLOP/s per GPU
    for a, h, L, tp, pp, n, B, tflops in [
        (24, 2304, 24, 1, 1, 32, 512, 137),
        (32, 3072, 30, 2, 1, 64, 512, 138),
        (32, 4096, 36, 4, 1, 128, 512, 142),
        (48, 6144, 40, 8, 1, 256, 1024, 135),
        (64, 8192, 48, 8, 2, 512, 1536, 138),
        (80, 10240, 60, 8, 4, 1024, 1792, 140),
        (96, 12288, 80, 8, 8, 1536, 2304, 148),
        (128, 16384, 96, 8, 16, 1920, 2160, 155),
        (128, 20480, 105, 8, 35, 2520, 2520, 163),
        (160, 25600, 128, 8, 64, 3072, 3072, 163),
    ]:
        # Megatron-LM 2021's data parallelism all-reduced the gradients: no ZeRO (its
        # distributed optimizer came in 2022)
        layout = dict(dp=n // (tp * pp), tp=tp, pp=pp, schedule="1f1b", recompute="full", zero=0)
        out.append(
            _run("SC21", gpt(a, h, L), "a100-80gb", n, B, "fp16",
                 dict(layout, **MEGATRON_2021, **MEGATRON_FP16), "hardware", tflops)
        )
    return out


def _korthikanti() -> list[dict]:
    """Korthikanti Tables 3 and 5: each model's full-recompute baseline and its sequence
    parallel + selective recompute run, TFLOP/s from the iteration times (model FLOPs)."""
    out = []
    # heads, hidden, layers, pp, GPUs (= batch), seconds full / SP + selective
    for a, h, L, pp, n, B, full_s, sel_s in [
        (64, 6144, 48, 1, 8, 4, 1.42, 1.10),
        (96, 12288, 96, 8, 64, 64, 18.13, 13.75),
        (128, 20480, 105, 35, 280, 280, 49.05, 37.83),
        (160, 25600, 128, 64, 512, 512, 94.42, 71.49),
    ]:
        cfg = gpt(a, h, L)
        flops = B * cfg.seq_len * model_flops_per_token(cfg)
        base = dict(dp=1, tp=8, pp=pp, micro_batch=1, schedule="1f1b", attention="unfused",
                    overlap_grad_reduce=False, **MEGATRON_FP16, **MEGATRON_SPLIT,
                    **WHOLE_REPLAY)
        for source, seconds, recompute, sp in [
            ("Korthikanti (full)", full_s, "full", False),
            ("Korthikanti (SP+sel.)", sel_s, "selective", True),
        ]:
            fixed = dict(base, recompute=recompute, sequence_parallel=sp)
            published = round(flops / seconds / n / 1e12, 1)
            out.append(_run(source, cfg, "a100-80gb", n, B, "fp16", fixed, "model", published))
    return out


def _mt_nlg() -> list[dict]:
    """MT-NLG 530B on 280 × dp A100s: tp 8 × pp 35, bf16, full recompute."""
    layout = dict(tp=8, pp=35, micro_batch=1, schedule="1f1b", recompute="full", **MEGATRON_2021)
    return [
        _run("MT-NLG", gpt(128, 20480, 105), "a100-80gb", 280 * dp, 1920, "bf16",
             dict(layout, dp=dp), "hardware", tflops)
        for dp, tflops in [(8, 126), (10, 121), (12, 113)]  # data-parallel size, TFLOP/s per GPU
    ]


def bloom() -> ModelConfig:
    """BLOOM 176B: GPT blocks (LayerNorm, GELU MLP of 4·h, biases), tied embedding; learned
    positions stand in for ALiBi (its table, 2048 × 14,336, is 0.02 % of the parameters, and
    BLOOM's own parameter count includes it: the README's s·h term)."""
    return ModelConfig(n_layers=70, hidden=14336, n_heads=112, vocab_size=250880,
                       seq_len=2048, tie_embeddings=True, name="BLOOM-176B")


# BLOOM's logged steps: source, TP, PP, micro-batch, nodes of 8 GPUs, seconds per iteration
# (the last one logged). The production run (README, iteration 85,376), and the reshaping
# experiments that resumed it on other layouts (reshaping-log.md) whose last two logged
# iterations agree within 1 % — the others were still settling after the restart.
BLOOM_STEPS = [
    ("BLOOM", 4, 12, 2, 48, 104.70),
    ("BLOOM reshaping", 4, 12, 2, 24, 215.99),
    ("BLOOM reshaping", 4, 24, 1, 24, 220.30),
    ("BLOOM reshaping", 2, 36, 1, 36, 141.22),
    ("BLOOM reshaping", 1, 72, 1, 36, 141.69),
]


def _bloom() -> list[dict]:
    """BLOOM 176B on A100 80GB: the iteration times of its logged runs, converted with
    paracube's hardware FLOP count (the logs' TFLOPs count the recomputed forward too)."""
    cfg, batch, out = bloom(), 2048, []
    for source, tp, pp, b, nodes, seconds in BLOOM_STEPS:
        gpus = 8 * nodes
        fixed = dict(dp=gpus // (tp * pp), tp=tp, pp=pp, micro_batch=b, zero=1,
                     schedule="1f1b", recompute="full", grad_accumulation="bf16-optimizer",
                     **{**MEGATRON_2021, "split": "even-ends"})
        published = batch * cfg.seq_len * hardware_flops_per_token(cfg, "full") / seconds / gpus
        out.append(_run(source, cfg, "a100-80gb", gpus, batch, "bf16", fixed, "hardware",
                        round(published / 1e12, 1), inter="opa-4x100"))
    return out


def _llama3() -> list[dict]:
    """Llama 3 405B on 128 × dp H100s: tp 8 × pp 16 interleaved, no recompute, BF16 MFU; one
    block fewer on the first and the last stage (§3.3.2: the embedding and the loss each
    take a block's place). Its data parallelism is FSDP (§3.3.2): the optimizer states and
    gradients sharded, the model's shards not resharded after forward, and the gradients,
    accumulated in FP32 over the micro-batches, reduce-scattered in FP32 (§3.3.4) — ZeRO-3
    gathered once a step under the pipeline (``zero3_pipeline="per-step"``)."""
    layout = dict(tp=8, pp=16, micro_batch=1, schedule="interleaved-1f1b", recompute="none",
                  sequence_parallel=True, attention="fused", split="even-ends", zero=3,
                  zero3_pipeline="per-step")
    return [
        _run("Llama 3", preset("llama3-405b"), "h100", 128 * dp, 2048, "bf16",
             dict(layout, dp=dp), "model", tflops)
        for dp, tflops in [(64, 430), (128, 400)]  # data-parallel size, model TFLOP/s per GPU
    ]


def _nemotron4_production() -> list[dict]:
    """Nemotron-4 340B's pre-training on 6,144 H100s (its report's Table 2, last stage of the
    batch ramp): 2,304 sequences of 4,096 tokens per 8.0-second iteration, BF16; TP 8 × PP
    12 interleaved (virtual stages not stated: the planner's) × DP 64."""
    cfg = _nemotron("Nemotron-4 340B", 96, 18432, 96, 8)
    fixed = dict(tp=8, pp=12, dp=64, sequence_parallel=True, attention="fused", zero=1,
                 schedule="interleaved-1f1b", **MEGATRON_CORE)
    published = round(2304 * cfg.seq_len * model_flops_per_token(cfg) / 8.0 / 6144 / 1e12, 1)
    return [_run("Nemotron-4 report", cfg, "h100", 6144, 2304, "bf16", fixed, "model",
                 published)]


def _nemotron4_15b_production() -> list[dict]:
    """Nemotron-4 15B's pre-training on H100 (its report's Table 2): the three stages of its
    batch ramp, four sequences of 4,096 tokens per data-parallel rank in each, TP 8 × DP 96,
    192 and 288, the distributed optimizer (ZeRO-1), BF16."""
    cfg = _nemotron("Nemotron-4 15B", 32, 6144, 48, 8)
    out = []
    for dp, batch, seconds in [(96, 384, 0.57), (192, 768, 0.58), (288, 1152, 0.64)]:
        fixed = dict(tp=8, pp=1, dp=dp, zero=1, attention="fused", **MEGATRON_CORE)
        published = round(batch * cfg.seq_len * model_flops_per_token(cfg) / seconds / (8 * dp) / 1e12, 1)
        out.append(_run("Nemotron-4 15B report", cfg, "h100", 8 * dp, batch, "bf16", fixed,
                        "model", published))
    return out


def _megatron_core_h100() -> list[dict]:
    """Megatron-Core's GPT-3 175B strong scaling on H100: 1152 sequences per step on 96 and
    4608 GPUs, TP 4 × PP 8 interleaved, sequence parallel; model TFLOP/s = MFU × 989."""
    cfg = ModelConfig(n_layers=96, hidden=12288, n_heads=96, vocab_size=131072, seq_len=4096,
                      name="GPT-3 175B (131k vocab)")
    layout = dict(tp=4, pp=8, schedule="interleaved-1f1b", sequence_parallel=True,
                  attention="fused", overlap_grad_reduce=True, tp_comm_overlap=True,
                  **MEGATRON_CORE)
    return [
        _run("Megatron-Core", cfg, "h100", gpus, 1152, "bf16", dict(layout, dp=gpus // 32),
             "model", round(mfu * 989.4, 1))
        for gpus, mfu in [(96, 0.47), (4608, 0.42)]
    ]


def _mosaic() -> list[dict]:
    """llm-foundry's H100 and A100 tables (:mod:`paracube.planner.mosaic`): the throughput
    behind each MFU, in paracube's model FLOPs (which leave the position table out)."""
    out = []
    # (source, GPU, precision, FSDP mixed precision, rows, the peak its MFU is a fraction of,
    # how a checkpointed block was replayed: the sweep's PyTorch)
    tables = [
        (MOSAIC_SOURCE[gpu], gpu, "bf16", mosaic.MIXED_PRECISION[gpu], rows,
         mosaic.PEAK_BF16[gpu], mosaic.REPLAY[gpu])
        for gpu, rows in mosaic.TABLES.items()
    ]
    tables += [
        ("MosaicML (H100 FP8)", "h100", "fp8", "DEFAULT", mosaic.FP8_TABLE, mosaic.PEAK_FP8_H100,
         mosaic.REPLAY_2023),
        ("MosaicML (H100, 2023)", "h100", "bf16", "PURE", mosaic.H100_PURE_2023,
         mosaic.PEAK_BF16["h100"], mosaic.REPLAY_2023),
        ("MosaicML (A100 80GB, PURE)", "a100-80gb", "bf16", "PURE", mosaic.A100_80GB_PURE,
         mosaic.PEAK_BF16["a100-80gb"], mosaic.REPLAY_2023),
    ]
    for source, gpu, precision, mixed, rows, peak, replay in tables:
        for name, s, n, mfu, b, B, ckpt, params in rows:
            cfg = mosaic.mpt(name, s)
            fixed = dict(dp=n, tp=1, pp=1, zero=3, micro_batch=b, attention="fused-triton",
                         recompute="full" if ckpt else "none", recompute_replay=replay,
                         **COMPOSER_FSDP)
            if mixed == "PURE":  # gradients reduced in the compute dtype
                fixed["grad_reduce"] = "compute"
            tflops = (mosaic.tokens_per_s(mfu, params, cfg, peak)
                      * model_flops_per_token(cfg) / 1e12)
            out.append(_run(source, cfg, gpu, n, B, precision, fixed, "model", round(tflops, 1)))
    return out


def _torchtitan() -> list[dict]:
    """torchtitan's FSDP2 runs on 64 A100-80GB: tokens/s per GPU (WPS) × model FLOPs per
    token; "selective layer" checkpointing recomputes every other block (half of them),
    "selective op" is the planner's recompute "op"; eager blocks, their element-wise ops
    counted op by op."""
    out = []
    # preset, local batch, checkpointing, tokens/s per GPU
    for name, b, ac, wps in [
        ("llama3-8b", 1, "layer", 2904),
        ("llama3-8b", 1, "op", 2973),
        ("llama3-70b", 1, "full", 331),
        ("llama2-13b", 2, "none", 2162),
        ("llama2-13b", 2, "layer", 1914),
        ("llama2-13b", 2, "op", 1904),
        ("llama2-70b", 1, "op", 355),  # batch 1: "2 ... will cause an OOM error" (its note)
        ("llama2-70b", 2, "full", 353),
    ]:
        cfg = preset(name)
        recompute = {"none": "none", "op": "op"}.get(ac, "full")
        # eager blocks (its configs' compile = false), norm_type "rmsnorm": torch's
        # composite RMSNorm, op by op
        fixed = dict(dp=64, tp=1, pp=1, zero=3, micro_batch=b, attention="fused", **FSDP2,
                     recompute=recompute, elementwise="eager")
        if ac == "layer":
            fixed["recompute_blocks"] = cfg.n_layers // 2
        published = round(wps * model_flops_per_token(cfg) / 1e12, 1)
        out.append(_run("torchtitan", cfg, "a100-80gb", 64, 64 * b, "bf16", fixed, "model",
                        published))
    return out


def _torchtitan_h200() -> list[dict]:
    """torchtitan's Llama 3.1 8B on 32 and 64 H200s with FSDP2, torch.compile and torchao's
    float8: tokens/s per GPU × model FLOPs per token; local batch 2, op-level selective
    checkpointing (its llama3_8b.toml)."""
    cfg = replace(preset("llama3-8b"), seq_len=8192, name="Llama 3.1 8B")
    # compiled blocks — which the memory model counts, under the op-level policy, as its
    # eager ops keep (layout_memory: a compiled block is counted kept or recomputed whole)
    fixed = dict(tp=1, pp=1, zero=3, micro_batch=2, recompute="op", attention="fused",
                 loss="fused", fp8_scaling="current", activations="compiled", **FSDP2)
    return [
        _run("torchtitan (H200, FP8)", cfg, "h200", n, 2 * n, "fp8", fixed | {"dp": n}, "model",
             round(tokens * model_flops_per_token(cfg) / 1e12, 1))
        for n, tokens in [(32, 10938), (64, 10753)]
    ]


def _torchtitan_h100() -> list[dict]:
    """torchtitan's benchmarks of December 2024 on Grand Teton H100s (96 GB HBM2e, 500 W):
    tokens/s per GPU × model FLOPs per token. Llama 3.1 8B with FSDP2 on 8 and 128 GPUs
    (local batch 2, 8,192 tokens, op-level selective checkpointing — its llama3_8b.toml)
    eager, with torch.compile, and with torch.compile and torchao's float8; Llama 3.1 70B on
    256 GPUs, FSDP 32 × TP 8 (sequence parallel, as torchtitan's plan shards the norms),
    local batch 16, every block checkpointed, compiled and float8, without and with
    asynchronous TP (the planner's TP overlap); and its context-parallel table (Table 2).
    Its 405B tables (5, 6) are left out: their micro-batch count and virtual stages are not
    stated."""
    llama8 = replace(preset("llama3-8b"), seq_len=8192, name="Llama 3.1 8B")
    llama70 = replace(preset("llama3-70b"), seq_len=8192, name="Llama 3.1 70B")
    gpu = "h100-96gb-500w"
    # compiled as the H200 run above: compiled blocks and loss; float8 scaled per tensor
    compiled = dict(activations="compiled", loss="fused")
    float8 = dict(compiled, fp8_scaling="current")
    out = []
    for n, eager_tps, compiled_tps, float8_tps in [(8, 5762, 6667, 8532), (128, 5605, 6514, 8380)]:
        fsdp = dict(dp=n, tp=1, pp=1, zero=3, micro_batch=2, recompute="op", attention="fused",
                    **FSDP2)
        for label, precision, software, tps in [
            ("torchtitan (H100 500 W)", "bf16", dict(elementwise="eager"), eager_tps),
            ("torchtitan (H100 500 W), compiled", "bf16", compiled, compiled_tps),
            ("torchtitan (H100 500 W), compiled, FP8", "fp8", float8, float8_tps),
        ]:
            out.append(_run(label, llama8, gpu, n, 2 * n, precision, fsdp | software, "model",
                            round(tps * model_flops_per_token(llama8) / 1e12, 1)))
    # Table 2: Llama 3.1 8B on 8 GPUs, local batch 1, every block checkpointed, compiled
    # and float8, 32K–256K tokens over FSDP × CP (context parallel 1–8; its default rotation
    # then, "allgather": each rank gathers every key and value shard, config_manager.py)
    for dp, cp, tps in [(8, 1, 3890), (4, 2, 2540), (2, 4, 1071), (1, 8, 548)]:
        cfg = replace(llama8, seq_len=32768 * cp, name=f"Llama 3.1 8B ({32 * cp}K)")
        fixed = dict(dp=dp, cp=cp, tp=1, pp=1, zero=3, micro_batch=1, recompute="full",
                     attention="fused", **FSDP2, **float8)
        out.append(_run("torchtitan (H100 500 W), compiled, FP8", cfg, gpu, 8, dp, "fp8", fixed,
                        "model", round(tps * model_flops_per_token(cfg) / 1e12, 1)))
    two_d = dict(dp=32, tp=8, pp=1, zero=3, micro_batch=16, recompute="full",
                 sequence_parallel=True, attention="fused", **FSDP2, **float8)
    for tp_overlap, tps in [(False, 829), (True, 876)]:
        out.append(_run("torchtitan (H100 500 W), compiled, FP8", llama70, gpu, 256, 512, "fp8",
                        two_d | {"tp_comm_overlap": tp_overlap}, "model",
                        round(tps * model_flops_per_token(llama70) / 1e12, 1)))
    return out


def _fms_fsdp() -> list[dict]:
    """IBM's FMS FSDP runs on 128 A100s with FULL_SHARD (ZeRO-3), one micro-batch per step,
    every block checkpointed: tokens/s per GPU × model FLOPs per token."""
    # fms-fsdp's "34b" (its get_model_config: Llama 2 70B's width and heads at 48 blocks and
    # an MLP of 22,016) and Llama 2 70B, Llama 2's vocabulary and its 4,096 tokens
    fms_34b = replace(preset("llama2-70b"), n_layers=48, ffn_hidden=22016, name="fms-fsdp 34b")
    out = []
    for cfg, b, tokens in [(fms_34b, 8, 772), (preset("llama2-70b"), 6, 380)]:
        # FSDP1: BACKWARD_PRE prefetch (its default), bf16 reduce (the bfSixteen policy),
        # torch.optim.AdamW at its default multi-tensor kernels (main_training_llama.py)
        fixed = dict(dp=128, tp=1, pp=1, zero=3, micro_batch=b, recompute="full",
                     attention="fused", grad_reduce="compute", optimizer_kernel="multi-op",
                     **PYTORCH_FSDP)
        published = round(tokens * model_flops_per_token(cfg) / 1e12, 1)
        out.append(_run("IBM FMS FSDP", cfg, "a100-80gb", 128, 128 * b, "bf16", fixed, "model",
                        published))
    return out


def _llama1() -> list[dict]:
    """LLaMA 65B on 2,048 A100 80GB: 380 tokens/s per GPU × model FLOPs per token; 2,048
    sequences of 2,048 tokens a step, sequence parallel, selective recomputation, fused
    attention; the parallel sizes the planner's."""
    cfg = replace(preset("llama2-70b", n_kv_heads=64, ffn_hidden=22016, seq_len=2048),
                  name="LLaMA 65B")  # multi-head: every head its own keys and values
    fixed = dict(recompute="selective", sequence_parallel=True, attention="fused")
    published = round(380 * model_flops_per_token(cfg) / 1e12, 1)
    return [_run("LLaMA", cfg, "a100-80gb", 2048, 2048, "bf16", fixed, "model", published)]


def _tinyllama() -> list[dict]:
    """TinyLlama 1.1B on 16 A100 40GB with FSDP1 FULL_SHARD: 24,000 tokens/s per GPU × model
    FLOPs per token; 1,024 sequences a step in micro-batches of 8, no recomputation. Its
    fused kernels keep what Transformer Engine's do (FlashAttention-2 takes the grouped keys
    and values unexpanded; the norm and rotary kernels keep their inputs): the memory model's
    ``megatron`` blocks."""
    cfg = replace(preset("llama2-7b", n_layers=22, hidden=2048, n_heads=32, n_kv_heads=4,
                         ffn_hidden=5632, seq_len=2048), name="TinyLlama 1.1B")
    fixed = dict(dp=16, tp=1, pp=1, zero=3, micro_batch=8, recompute="none", attention="fused",
                 grad_reduce="compute", optimizer_kernel="multi-op", loss="fused",
                 activations="megatron", **PYTORCH_FSDP)
    published = round(24000 * model_flops_per_token(cfg) / 1e12, 1)
    return [_run("TinyLlama", cfg, "a100-40gb", 16, 1024, "bf16", fixed, "model", published)]


def _olmo_core() -> list[dict]:
    """OLMo-core's Llama 8B and OLMo 2 13B on H100 with FSDP2 and torch.compile, BF16 and
    float8: tokens/s per GPU × model FLOPs per token; one node (its launcher's default)."""
    llama = replace(preset("llama3-8b", vocab_size=100352, seq_len=4096), name="Llama 8B (OLMo-core)")
    # OLMo 2 13B: Llama 2 13B's shape (40 heads, each its own keys and values) with q/k
    # norms, at the dolma2 tokenizer's padded vocabulary. OLMo 2 normalises the whole q and
    # k projections where qk_norm (Qwen3's) normalises each head: the same elements read
    # and written, 2·h weights a block for 2·d — nothing the time model tells apart
    olmo2 = replace(preset("llama2-13b", vocab_size=100352, seq_len=4096), qk_norm=True,
                    name="OLMo 2 13B (OLMo-core)")
    # (model, micro-batch, sequences a step, the README's BF16 and float8 tokens/s per GPU;
    # Llama-8B.py compiles its loss)
    models = [(llama, 2, 1024, 9500, 12500, {"loss": "fused"}), (olmo2, 1, 2048, 4600, 5500, {})]
    out = []
    for cfg, b, batch, bf16, fp8, extra in models:
        fixed = dict(dp=8, tp=1, pp=1, zero=3, micro_batch=b, recompute="none", attention="fused",
                     activations="compiled", **extra, **FSDP2)
        for source, precision, scaling, tokens in [
            ("OLMo-core", "bf16", {}, bf16),
            ("OLMo-core (FP8)", "fp8", {"fp8_scaling": "current"}, fp8),
        ]:
            out.append(_run(source, cfg, "h100", 8, batch, precision, fixed | scaling, "model",
                            round(tokens * model_flops_per_token(cfg) / 1e12, 1)))
    return out


# GPT-3's shapes as FlashAttention's training README runs them on 8 A100 80GB: (name, blocks,
# width, heads, per-GPU batch, sequences a step, ZeRO stage, tokens/s of the node)
FLASH_ATTENTION_GPT = [
    ("GPT3-125M", 12, 768, 12, 32, 256, 0, 1310e3),
    ("GPT3-355M", 24, 1024, 16, 16, 256, 0, 503e3),
    ("GPT3-760M", 24, 1536, 16, 16, 256, 1, 245e3),
    ("GPT3-1.3B", 24, 2048, 16, 8, 512, 1, 169e3),
    ("GPT3-2.7B", 32, 2560, 20, 4, 512, 1, 85e3),
]


def _flash_attention_gpt() -> list[dict]:
    """FlashAttention's GPT-3 models on one node of 8 A100 80GB: the node's tokens/s over its
    8 GPUs × model FLOPs per token; data parallel (DDP, ZeRO-1 from 760M), no recomputation,
    FlashAttention's first CUDA kernels."""
    out = []
    for name, layers, hidden, heads, b, batch, zero, tokens in FLASH_ATTENTION_GPT:
        cfg = ModelConfig(n_layers=layers, hidden=hidden, n_heads=heads, vocab_size=50264,
                          seq_len=2048, tie_embeddings=True, name=name)
        fixed = dict(dp=8, tp=1, pp=1, zero=zero, micro_batch=b, recompute="none",
                     attention="fused-v1", loss="fused",  # apex's in-place cross-entropy
                     optimizer_kernel="multi-op" if zero else "fused")
        published = round(tokens / 8 * model_flops_per_token(cfg) / 1e12, 1)
        out.append(_run("FlashAttention's GPT", cfg, "a100-80gb", 8, batch, "bf16", fixed,
                        "model", published))
    return out


# FlashAttention-2's Table 1 (module docstring): (name, blocks, hidden, heads, tokens per
# sequence, sequences a GPU — None: not stated and over the memory model, the planner's —,
# sequences a step, attention kernel, TFLOP/s a GPU as the paper counts).
FLASH_ATTENTION_2_TABLE = [
    ("GPT3-1.3B", 24, 2048, 16, 2048, 8, 512, "fused", 196),
    ("GPT3-1.3B", 24, 2048, 16, 8192, 4, 128, "fused-v1", 170),
    ("GPT3-1.3B", 24, 2048, 16, 8192, 4, 128, "fused", 220),
    ("GPT3-2.7B", 32, 2560, 20, 2048, 4, 512, "fused", 205),
    ("GPT3-2.7B", 32, 2560, 20, 8192, None, 128, "fused-v1", 175),
    ("GPT3-2.7B", 32, 2560, 20, 8192, None, 128, "fused", 225),
]


def flash_attention_2_paper_flops(cfg: ModelConfig) -> float:
    """FLOPs a token as FlashAttention-2's §4.2 counts them: 6·params + 12·L·h·s (its
    formula a sequence, over s) — the embedding's and positions' parameters included, the
    attention's full s×s."""
    return 6 * shapes.parameter_count(cfg) + 12 * cfg.n_layers * cfg.hidden * cfg.seq_len


def _flash_attention_2() -> list[dict]:
    """FlashAttention-2's Table 1 on one node of 8 A100 80GB: the FlashAttention repository's
    GPT as in :func:`_flash_attention_gpt` — ZeRO-1 over the 8 GPUs, no recomputation —
    with FlashAttention-2 (``fused``) or FlashAttention's first kernels (``fused-v1``)."""
    out = []
    for name, layers, hidden, heads, seq, b, batch, attention, paper in FLASH_ATTENTION_2_TABLE:
        cfg = ModelConfig(n_layers=layers, hidden=hidden, n_heads=heads, vocab_size=50264,
                          seq_len=seq, tie_embeddings=True, name=name)
        fixed = dict(dp=8, tp=1, pp=1, zero=1, recompute="none", attention=attention,
                     loss="fused", optimizer_kernel="multi-op")
        if b is not None:
            fixed["micro_batch"] = b
        tokens_per_gpu = paper * 1e12 / flash_attention_2_paper_flops(cfg)
        published = round(tokens_per_gpu * model_flops_per_token(cfg) / 1e12, 1)
        out.append(_run("FlashAttention-2 paper", cfg, "a100-80gb", 8, batch, "bf16", fixed,
                        "model", published))
    return out


# The Zero Bubble paper's Table 3 (model, blocks, heads, hidden, GPUs = pipeline stages,
# micro-batch) and Table 4 (samples per GPU per second at each count of micro-batches, by
# schedule: the paper's name → the planner's schedule).
ZERO_BUBBLE_MODELS = [
    ("1.5B", 22, 24, 2304, 8, 6, (24, 32, 64)),
    ("6.2B", 30, 32, 4096, 8, 3, (24, 32, 64)),
    ("14.6B", 46, 40, 5120, 16, 1, (48, 64, 128)),
    ("28.3B", 62, 48, 6144, 32, 1, (96, 128, 256)),
]
ZERO_BUBBLE_SAMPLES = {
    ("ZB-1p", "zb-h1"): [12.9, 13.4, 14.2, 3.88, 4.00, 4.20, 1.61, 1.67, 1.76, 0.87, 0.90, 0.96],
    ("1F1B", "1f1b"): [11.8, 12.5, 13.6, 3.50, 3.70, 4.03, 1.40, 1.49, 1.64, 0.76, 0.80, 0.88],
    ("1F1B-I", "interleaved-1f1b"): [13.1, 13.4, 13.9, 4.01, 4.08, 4.19, 1.54, 1.59, 1.66,
                                     0.82, 0.85, 0.90],
}
# Its Table 8: 1F1B and ZB-1p again at twice Table 3's micro-batch (its middle micro-batch
# count for 14.6B and 28.3B is printed as 32, a misprint for 64 and 128: each throughput lies
# between those at the counts either side, as in Table 4).
ZERO_BUBBLE_DOUBLED = {
    ("ZB-1p", "zb-h1"): [13.0, 13.6, 14.4, 3.95, 4.05, 4.24, 1.73, 1.79, 1.89, 0.93, 0.96, 1.02],
    ("1F1B", "1f1b"): [12.0, 12.6, 13.8, 3.56, 3.76, 4.09, 1.53, 1.62, 1.78, 0.81, 0.85, 0.94],
}
# Its Table 9's 1F1B runs with as few micro-batches as stages or fewer: (micro-batches,
# samples per GPU per second) by model.
ZERO_BUBBLE_FEW = {
    "1.5B": ((2, 3.56), (4, 5.74), (8, 8.26)),
    "6.2B": ((2, 1.04), (4, 1.69), (8, 2.45)),
    "14.6B": ((4, 0.39), (8, 0.65), (16, 0.95)),
}


def zero_bubble_model(name: str, layers: int, heads: int, hidden: int) -> ModelConfig:
    """A Zero Bubble paper model: GPT-3's shape at 1,024 tokens, 32,000 tied tokens."""
    return ModelConfig(n_layers=layers, hidden=hidden, n_heads=heads, vocab_size=32000,
                       seq_len=1024, tie_embeddings=True, name=f"GPT {name}")


def _zero_bubble() -> list[dict]:
    """The Zero Bubble paper's Tables 4, 8 and 9: pipeline parallelism alone (tp 1, dp 1),
    Megatron-LM in fp16 with its unfused attention and selective recomputation, the first
    and last stages one block short."""
    setups = [(model, micro) for model in ZERO_BUBBLE_MODELS for micro in model[-1]]
    tables = [
        (paper_name, 1, [(s, schedule, rate) for s, rate in zip(setups, rates, strict=True)])
        for (paper_name, schedule), rates in ZERO_BUBBLE_SAMPLES.items()
    ] + [
        (f"{paper_name}, 2× micro-batch", 2,
         [(s, schedule, rate) for s, rate in zip(setups, rates, strict=True)])
        for (paper_name, schedule), rates in ZERO_BUBBLE_DOUBLED.items()
    ]
    # Megatron's 1F1B with no more micro-batches than stages runs a stage's forwards before
    # its backwards (warm-up min(p − rank − 1, m)): GPipe's order and bubble, which the
    # planner plans where paracube's 1F1B does not run (m < p)
    tables.append(("1F1B", 1, [
        ((model, micro), "1f1b" if micro >= model[4] else "gpipe", rate)
        for model in ZERO_BUBBLE_MODELS for micro, rate in ZERO_BUBBLE_FEW.get(model[0], ())
    ]))
    out = []
    for paper_name, scale, rows in tables:
        for ((name, layers, heads, hidden, gpus, table3_b, _), micro), schedule, rate in rows:
            b = scale * table3_b
            cfg = zero_bubble_model(name, layers, heads, hidden)
            chunks = (layers + 2) // gpus if schedule == "interleaved-1f1b" else 1
            fixed = dict(tp=1, pp=gpus, dp=1, micro_batch=b, schedule=schedule, chunks=chunks,
                         attention="unfused", recompute="selective", grad_accumulation="fused",
                         **{**MEGATRON_SPLIT, "split": "even-ends"})
            published = round(rate * cfg.seq_len * model_flops_per_token(cfg) / 1e12, 1)
            out.append(_run(f"Zero Bubble paper ({paper_name})", cfg, "a100-80gb", gpus,
                            b * micro, "fp16", fixed, "model", published))
    return out


def _automodel() -> list[dict]:
    """NeMo AutoModel's Llama 3 70B on 64 H100s: FSDP2 (ZeRO-3) over 32 ranks × context
    parallel 2, tokens/s per GPU × model FLOPs per token."""
    cfg = preset("llama3-70b")  # sequence 8192, as the run
    fixed = dict(dp=32, cp=2, tp=1, pp=1, zero=3, micro_batch=1, attention="fused", **FSDP2)
    published = round(866.77 * model_flops_per_token(cfg) / 1e12, 1)
    return [_run("NeMo AutoModel", cfg, "h100", 64, 128, "bf16", fixed, "model", published)]


def _nemo_gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelConfig:
    """NeMo's GPT-3 (the launcher's gpt3/*.yaml): learned positions, biases, GELU MLP of 4·h,
    sequence 2048, the GPT-2 BPE vocabulary padded to 50,304."""
    return ModelConfig(n_layers=layers, hidden=hidden, n_heads=heads, vocab_size=50304,
                       seq_len=2048, name=name)


def _nemotron(name: str, layers: int, hidden: int, heads: int, kv: int) -> ModelConfig:
    """The launcher's nemotron_*.yaml: LayerNorm, rotary positions, no biases, untied, an MLP
    of 4·h with squared ReLU — the planner's two-matrix MLP (its "gelu": the same matmuls and
    element-wise passes) —, the 256,000-token vocabulary of Nemotron's tokenizer
    (nemotron_2_256k; the NeMo table's TFLOP column confirms it, test)."""
    return ModelConfig(n_layers=layers, hidden=hidden, n_heads=heads, n_kv_heads=kv,
                       vocab_size=256000, seq_len=4096, position="rope", bias=False, name=name)


def _nemo_fp8() -> list[dict]:
    """NeMo 24.07's FP8 pre-training table on DGX-H100 (Megatron-Core under NeMo)."""
    gpt3, nemotron = _nemo_gpt3, _nemotron
    # the *_fp8_performance.yaml: selective recompute, bf16 gradient sync, and userbuffers'
    # tensor-parallel overlap (ub_tp_comm_overlap) where tp > 1
    gpt3_sw: dict[str, object] = dict(
        recompute="selective", grad_reduce="compute", tp_comm_overlap=True
    )
    llama_sw: dict[str, object] = dict(recompute="none")  # llama/llama{2,3}_*.yaml
    # nemotron/nemotron_{8b,22b,340b}.yaml: no recomputation, userbuffers' overlap; 340B's
    # mcore_distributed_optim syncs gradients in bf16 (grad_sync_dtype: bf16)
    nemotron_sw: dict[str, object] = dict(recompute="none", tp_comm_overlap=True)
    out = []
    # model, GPUs, global batch, micro-batch, tp, pp, cp, vp, tokens/s per GPU, software
    for cfg, n, B, b, tp, pp, cp, vp, tokens, software in [
        (gpt3("GPT-3 5B", 24, 4096, 32), 64, 2048, 4, 1, 1, 1, 1, 22521, gpt3_sw),
        (gpt3("GPT-3 20B", 44, 6144, 48), 64, 256, 2, 2, 1, 1, 1, 5851, gpt3_sw),
        (gpt3("GPT-3 175B", 96, 12288, 96), 128, 256, 1, 4, 8, 1, 6, 726, gpt3_sw),
        (gpt3("GPT-3 175B", 96, 12288, 96), 512, 2048, 2, 4, 8, 1, 6, 782, gpt3_sw),
        (preset("llama2-7b"), 8, 128, 1, 1, 1, 1, 1, 16847, llama_sw),
        (preset("llama2-13b"), 16, 128, 1, 1, 4, 1, 10, 8646, llama_sw),
        (preset("llama2-70b"), 64, 128, 1, 4, 4, 1, 20, 1707, llama_sw),
        (preset("llama3-8b"), 8, 128, 1, 1, 1, 2, 1, 12036, llama_sw),
        (preset("llama3-70b"), 64, 128, 1, 4, 4, 2, 5, 1533, llama_sw),
        (nemotron("Nemotron-8B", 32, 4096, 32, 32), 64, 256, 4, 2, 1, 1, 1, 12701, nemotron_sw),
        (nemotron("Nemotron-22B", 40, 6144, 48, 48), 64, 256, 2, 2, 4, 1, 10, 4256, nemotron_sw),
        (nemotron("Nemotron-340B", 96, 18432, 96, 8), 128, 32, 1, 8, 8, 1, 12, 322,
         dict(nemotron_sw, grad_reduce="compute")),
    ]:
        fixed = dict(tp=tp, pp=pp, cp=cp, dp=n // (tp * pp * cp), micro_batch=b, zero=1,
                     sequence_parallel=tp > 1, attention="fused", **MEGATRON_CORE, **software)
        if vp > 1:  # every pipelined row of the table is interleaved
            fixed.update(schedule="interleaved-1f1b", chunks=vp)
        published = round(tokens * model_flops_per_token(cfg) / 1e12, 1)
        out.append(_run("NeMo (FP8)", cfg, "h100", n, B, "fp8", fixed, "model", published))
    return out


# NVIDIA/dgxc-benchmarking's H100 tables: (model, tp, pp, cp, vp, micro-batch, software,
# [(GPUs, global batch, BF16 step seconds, FP8 step seconds), …]). The software of each
# recipe's configuration (the launcher yaml it names, as its README says to keep):
# gpt3_175b_hydra.yaml — no recomputation, sequence parallel, userbuffers' TP overlap,
# distributed_fused_adam with grad_sync_dtype bf16; nemotron4-15b: no recomputation, TP
# overlap, the distributed optimizer; nemotron_340b.yaml as NeMo 24.07's row above; the
# llama3_1_*.yaml — no recomputation, TP overlap, distributed_fused_adam.
_DGXC_GPT3 = dict(recompute="none", grad_reduce="compute", tp_comm_overlap=True)
_DGXC_LLAMA = dict(recompute="none", tp_comm_overlap=True)
DGXC_TABLES: list[tuple[ModelConfig, int, int, int, int, int, dict, list[tuple[int, int, float, float]]]] = [
    (_nemo_gpt3("GPT-3 175B", 96, 12288, 96), 4, 8, 1, 12, 1, _DGXC_GPT3,
     [(128, 256, 8.309, 5.626), (256, 512, 8.408, 5.725), (512, 1024, 8.42, 5.774),
      (1024, 2048, 8.453, 5.82), (2048, 4096, 8.49, 5.96)]),
    (_nemotron("Nemotron-4 15B", 32, 6144, 48, 8), 4, 1, 1, 1, 4,
     dict(recompute="none", tp_comm_overlap=True),
     [(16, 64, 2.812, 2.039), (32, 128, 2.824, 2.046), (64, 256, 2.845, 2.048),
      (128, 512, 2.859, 2.059), (256, 1024, 2.852, 2.075), (512, 2048, 2.875, 2.12),
      (1024, 4096, 2.895, 2.094), (2048, 8192, 2.887, 2.12)]),
    (_nemotron("Nemotron-4 340B", 96, 18432, 96, 8), 8, 8, 1, 12, 1,
     dict(recompute="none", tp_comm_overlap=True, grad_reduce="compute"),
     [(128, 32, 4.61, 3.16), (256, 64, 4.67, 3.21), (512, 128, 4.7, 3.26),
      (1024, 256, 4.73, 3.34), (2048, 512, 4.84, 3.49)]),
    (preset("llama3-8b"), 1, 1, 2, 1, 1, _DGXC_LLAMA,
     [(8, 128, 12.91, 9.67), (16, 256, 13.00, 9.73), (32, 512, 13.05, 9.75),
      (64, 1024, 13.08, 9.80), (128, 2048, 13.10, 9.82)]),
    (preset("llama3-70b"), 4, 4, 2, 5, 1, _DGXC_LLAMA,
     [(64, 128, 14.72, 11.01), (128, 256, 14.73, 10.93), (256, 512, 14.8, 11.16),
      (512, 1024, 14.89, 11.18), (1024, 2048, 14.92, 11.28), (2048, 4096, 14.98, 11.39)]),
    (preset("llama3-405b"), 8, 9, 2, 7, 1, _DGXC_LLAMA,
     [(576, 252, 17.20, 11.24), (1152, 504, 17.52, 11.31), (2304, 1008, 17.62, 12.35)]),
]
# Llama 3.1 405B's proxy configurations for fewer GPUs: the same blocks, fewer of them
# (layers, GPUs, pp, vp, global batch, BF16 step seconds, FP8 step seconds)
DGXC_405B_PROXIES = [(7, 32, 1, 1, 126, 8.85, 5.80), (21, 96, 3, 7, 126, 8.75, 5.71),
                     (42, 192, 3, 7, 252, 16.93, 11.00)]


def _dgxc() -> list[dict]:
    """NVIDIA's DGX Cloud benchmarking recipes on H100 (Megatron-Core under NeMo): every
    GPU count of their BF16 and FP8 tables, step seconds converted to model TFLOP/s per GPU
    with paracube's FLOP count."""
    tables = list(DGXC_TABLES)
    for layers, n, pp, vp, B, bf16, fp8 in DGXC_405B_PROXIES:
        cfg = replace(preset("llama3-405b"), n_layers=layers,
                      name=f"llama3-405b ({layers} blocks)")
        tables.append((cfg, 8, pp, 2, vp, 1, _DGXC_LLAMA, [(n, B, bf16, fp8)]))
    out = []
    for cfg, tp, pp, cp, vp, b, software, scales in tables:
        for n, B, *steps in scales:
            fixed = dict(tp=tp, pp=pp, cp=cp, dp=n // (tp * pp * cp), micro_batch=b, zero=1,
                         sequence_parallel=tp > 1, attention="fused", **MEGATRON_CORE,
                         **software)
            if vp > 1:
                fixed.update(schedule="interleaved-1f1b", chunks=vp)
            for precision, step in zip(("bf16", "fp8"), steps):
                published = round(B * cfg.seq_len * model_flops_per_token(cfg) / step / n / 1e12, 1)
                out.append(_run(f"DGX Cloud benchmarking ({precision.upper()})", cfg, "h100", n,
                                B, precision, fixed, "model", published))
    return out


# NVIDIA/dgxc-benchmarking's Grok-1 314B tables (grok1/README_314b.md, NeMo's dev image):
# (GPUs, sequence, layers, tp, pp, cp, ep, dp as tabled, vp, global batch, BF16 and FP8
# step seconds). Below 512 GPUs the recipe is a proxy with fewer layers. Its GPUs are
# tp × pp × cp × ep × dp: expert parallelism out of the data-parallel ranks (the layout's
# dp is ep × the tabled dp). Its GA column (128 in every row) holds for the rows from 32
# GPUs on; at 8 and 16 the global batch of 1,024 over the 2 and 4 data-parallel ranks is
# 512 and 256 micro-batches, as the rows' tokens per second (global batch × sequence ÷
# step) also give.
GROK1_TABLE = [
    (8, 4096, 2, 4, 1, 1, 2, 1, 1, 1024, 24.03, 19.89),
    (16, 4096, 4, 4, 1, 1, 4, 1, 1, 1024, 21.52, 17.08),
    (32, 4096, 4, 4, 1, 1, 8, 1, 1, 1024, 10.64, 8.3),
    (64, 8192, 8, 4, 1, 2, 8, 1, 1, 1024, 20.64, 16.21),
    (128, 8192, 16, 4, 2, 2, 8, 1, 8, 1024, 20.64, 16.48),
    (256, 8192, 32, 4, 4, 2, 8, 1, 8, 1024, 20.7, 16.55),
    (512, 8192, 64, 4, 8, 2, 8, 1, 8, 1024, 20.83, 16.69),
    (1024, 8192, 64, 4, 8, 2, 8, 2, 8, 2048, 21.0, 16.89),
    (2048, 8192, 64, 4, 8, 2, 8, 4, 8, 4096, 21.09, 17.04),
]
# The recipe's software (NeMo-Framework-Launcher conf/training/grok/grok1_proxy.yaml, with
# the benchmark's launch overrides): Megatron-Core's GPT with Transformer Engine, sequence
# parallelism, no userbuffers overlap (ub_tp_comm_overlap: false), no recomputation, the
# distributed optimizer with its gradients synced in bf16 (grad_sync_dtype=bf16), the
# all-to-all token dispatcher with every expert's input padded to its capacity at factor 1
# (moe_pad_expert_input_to_capacity: the experts' work balanced), one GEMM per expert
# (moe_grouped_gemm=False), each expert split over the tensor-parallel ranks (no
# expert-tensor-parallel size: unfolded, etp=0). Its model: Grok-1's blocks with the Llama 3
# tokenizer's 128,256 tokens, the output not tied to the embedding.
_GROK1_SOFTWARE = dict(recompute="none", tp_comm_overlap=False, grad_reduce="compute")


def _dgxc_grok1() -> list[dict]:
    """Grok-1 314B, a mixture of 8 experts (2 per token), on 8 to 2,048 H100s: every row of
    the DGX Cloud benchmarking recipe's BF16 and FP8 tables, step seconds converted to model
    TFLOP/s per GPU with paracube's FLOP count."""
    out = []
    for n, seq, layers, tp, pp, cp, ep, dp, vp, B, *steps in GROK1_TABLE:
        name = "grok-1" if layers == 64 else f"grok-1 ({layers} blocks)"
        cfg = preset("grok-1", vocab_size=128256, tie_embeddings=False, seq_len=seq,
                     n_layers=layers).replace(name=name)  # fmt: skip
        fixed = dict(tp=tp, pp=pp, cp=cp, dp=ep * dp, ep=ep, etp=0, micro_batch=1, zero=1,
                     sequence_parallel=True, attention="fused", **MEGATRON_CORE,
                     **_GROK1_SOFTWARE)  # fmt: skip
        if vp > 1:
            fixed.update(schedule="interleaved-1f1b", chunks=vp)
        for precision, step in zip(("bf16", "fp8"), steps):
            published = round(B * seq * model_flops_per_token(cfg) / step / n / 1e12, 1)
            out.append(_run(f"DGX Cloud benchmarking, MoE ({precision.upper()})", cfg, "h100",
                            n, B, precision, fixed, "model", published))  # fmt: skip
    return out


def _qwen3_moe() -> list[dict]:
    """Qwen3-30B-A3B (128 experts of 768, 8 per token) and Qwen3-235B-A22B (128 of 1,536)
    on H100: Megatron-Bridge's rows (expert-tensor-parallel size 1, the larger one folded
    over TP × DP) and NeMo AutoModel's FSDP2 row; tokens/s per GPU converted with paracube's
    FLOP count."""
    cfg = preset("qwen3-30b-a3b")
    # the recipes' common configs: gradients reduced in bf16; FP8 with current scaling (the
    # 25.11 table's "FP8-CS"; the 26.02 table's "FP8" on H100, where the repository's only
    # FP8 recipe is QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS, qwen3_workload_base_configs.py)
    bridge = dict(tp=1, pp=2, cp=1, dp=8, ep=8, etp=1, zero=1, attention="fused",
                  schedule="interleaved-1f1b", fp8_scaling="current", grad_reduce="compute",
                  **MEGATRON_CORE)  # fmt: skip
    # Qwen3-30B-A3B's H100 recipe dispatches with the flex dispatcher (qwen3_llm_pretrain.py,
    # qwen3_30b_a3b_pretrain_config_h100: moe_token_dispatcher_type "flex", DeepEP or its
    # HybridEP branch as the base config names): each token once to each rank it reaches;
    # Qwen3-235B-A22B's H100 recipe keeps the all-to-all dispatcher. Neither recomputes
    # (set_qwen3_common_configs: recompute_granularity None)
    small = dict(bridge, ep_dispatch="deepep", recompute="none")
    out = [
        _run(f"Megatron-Bridge {container}, MoE (FP8)", cfg, "h100", 16, B, "fp8",
             dict(small, micro_batch=b, chunks=vp), "model",
             round(tokens * model_flops_per_token(cfg) / 1e12, 1))
        # container, global batch, micro-batch, virtual stages, tokens/s per GPU
        for container, B, b, vp, tokens in [("25.11", 512, 2, 24, 5275), ("26.02", 1024, 1, 12, 5113)]
    ]  # fmt: skip
    # Qwen3-235B-A22B on 256 GPUs: TP 2 × PP 8 × VP 4, EP 32 folded over TP × DP at
    # expert-tensor-parallel size 1, micro-batch 1, no recomputation, 94 blocks split with
    # the embedding and the loss as a block each (96 over 32 virtual stages); 25.11: global
    # batch 2,048 (the recipe's; the table's row lost that column), userbuffers' TP overlap
    # on (its CommOverlapConfig of the time), 1,575 tokens/s per GPU; 26.02: the V2 recipe,
    # global batch 8,192, TP overlap off and the all-to-alls overlapped (moe_a2a_overlap),
    # 1,633 tokens/s per GPU
    big = preset("qwen3-235b-a22b")
    folded = dict(bridge, tp=2, pp=8, dp=16, ep=32, etp=1, micro_batch=1, recompute="none",
                  sequence_parallel=True, schedule="interleaved-1f1b", chunks=4,
                  split="even-ends")  # fmt: skip
    for container, B, software, tokens in [
        ("25.11", 2048, dict(tp_comm_overlap=True), 1575),
        ("26.02", 8192, dict(tp_comm_overlap=False, ep_comm_overlap=True), 1633),
    ]:
        out.append(_run(f"Megatron-Bridge {container}, MoE (FP8)", big, "h100", 256, B, "fp8",
                        dict(folded, **software), "model",
                        round(tokens * model_flops_per_token(big) / 1e12, 1)))  # fmt: skip
    # AutoModel's recipe (examples/benchmark/configs/qwen3_moe_30b_te_deepep.yaml):
    # activation_checkpointing true — its MoE parallelizer wraps every block whole in
    # torch's checkpoint_wrapper (nemo_automodel/components/moe/parallelizer.py, apply_ac) —,
    # DeepEP's dispatch (enable_deepep true) and the fake balanced gate (fake_balanced_gate
    # true: token i to experts 8i … 8i + 7 mod 128, all on one rank of the 8) — and pure bf16
    # training: built from its config, the model is cast to bf16 as its weights are
    # initialised (Checkpointer.initialize_model_weights → Qwen3MoeForCausalLM.
    # initialize_weights, dtype bfloat16 by default → cast_model_to_dtype) and stepped by the
    # yaml's torch.optim.Adam — its default multi-tensor path, an op per pass —, whose moments
    # take the parameters' dtype: no fp32 copy (choices.MASTER_WEIGHTS "none")
    fsdp = dict(FSDP2, tp=1, pp=1, cp=1, dp=8, ep=8, zero=3, micro_batch=4, recompute="full",
                ep_dispatch="deepep", router="round-robin", attention="fused",
                master_weights="none", optimizer_kernel="multi-op")  # fmt: skip
    out.append(_run("NeMo AutoModel, MoE", cfg, "h100", 8, 512, "bf16", fsdp, "model",
                    round(12040 * model_flops_per_token(cfg) / 1e12, 1)))  # fmt: skip
    return out


def _deepseek_v3() -> list[dict]:
    """DeepSeek-V3 on 1,024 H100s as Megatron-Bridge ran it (its performance summary's 25.09
    table, DGX-H100: "DeepSeekV3 (dropless)", 1,297 tokens/s per GPU — FP8: the table's
    parenthesised 330 beside its 338 TFLOP/s is the H100's other quantisation granularity,
    128 × 128 blocks, so the first is FP8 with current scaling, the recipes' FP8-CS); tokens/s
    converted with paracube's FLOP count, which counts the multi-token prediction module."""
    cfg = preset("deepseek-v3")
    # scripts/performance/configs/deepseek/deepseek_workload_base_configs.py,
    # DEEPSEEK_V3_PRETRAIN_CONFIG_H100_V1 (its BF16, FP8-CS and FP8-SC alike): TP 2 × PP 8 ×
    # VP 4, EP 64 at expert-tensor-parallel size 1 (folded over TP × DP), micro-batch 1,
    # global batch 8,192, the flex dispatcher (each token once to each rank or node it
    # reaches), the all-to-alls not overlapped (moe_a2a_overlap False), the layout
    # "Et|(tt|)*30mL"; deepseek_v3_llm_pretrain.py's H100 configs: the gradient reduce not
    # overlapped; the recipe (src/megatron/bridge/recipes/deepseek/deepseek_v3.py): bf16
    # gradient reduction, no userbuffers' TP overlap, sequence parallel, the distributed
    # optimizer with bf16 moments (use_precision_aware_optimizer, exp_avg(_sq)_dtype bf16),
    # one MTP module; the selective recomputation of the latent attention's up projections
    # and the three dense blocks' MLPs (recompute_modules ["mla_up_proj", "mlp"])
    fixed = dict(tp=2, pp=8, cp=1, dp=64, ep=64, etp=1, zero=1, micro_batch=1, chunks=4,
                 schedule="interleaved-1f1b", sequence_parallel=True, recompute="selective",
                 recompute_modules=("mla_up_proj", "mlp"),
                 attention="fused", fp8_scaling="current", grad_reduce="compute",
                 ep_dispatch="deepep", tp_comm_overlap=False, overlap_grad_reduce=False,
                 moments="bf16", **{**MEGATRON_CORE, "split": "Et|(tt|)*30mL"})  # fmt: skip
    return [
        _run("Megatron-Bridge 25.09, MoE (FP8)", cfg, "h100", 1024, 8192, "fp8", fixed, "model",
             round(1297 * model_flops_per_token(cfg) / 1e12, 1))
    ]  # fmt: skip


def _gpt_oss() -> list[dict]:
    """GPT-OSS-120B on 64 H100s as Megatron-Bridge ran it (its performance summary's 26.02
    table, DGX-H100, BF16: global batch 1,280, micro-batch 1, PP 4 × EP 8, 5,993 tokens/s
    per GPU); tokens/s converted with paracube's FLOP count, which counts each windowed
    block's attention over the keys its 128-token window keeps (NeMo's GPT-OSS count)."""
    cfg = preset("gpt-oss-120b")
    # scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py,
    # GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V2 (V1's at global batch 1,280): 64 GPUs, EP 8
    # at expert-tensor-parallel size 1, PP 4 (no virtual stages), micro-batch 1, the
    # recomputation of the norms and the experts' activation (recompute_modules
    # ["layernorm", "moe_act"]); the model provider's all-to-all dispatcher; the recipes'
    # bf16 gradient reduction, as Qwen3's
    fixed = dict(tp=1, pp=4, cp=1, dp=16, ep=8, etp=1, zero=1, micro_batch=1, schedule="1f1b",
                 attention="fused", grad_reduce="compute", **NORM_ACT, **MEGATRON_CORE)  # fmt: skip
    return [
        _run("Megatron-Bridge 26.02, MoE (BF16)", cfg, "h100", 64, 1280, "bf16", fixed, "model",
             round(5993 * model_flops_per_token(cfg) / 1e12, 1))
    ]  # fmt: skip


# Megatron-Core's MoE team's Qwen3-235B-A22B runs on 256 H100s in BF16 (yanring/Megatron-MoE-
# ModelZoo, best_practice/Qwen3/readme.md: "NVLink 4th Generation, InfiniBand 8x50 GB/s",
# sequence 4,096, global batch 2,048, micro-batch 1, step seconds): (label, layout, DeepEP's
# dispatch, the 1F1B pairing of one micro-batch's all-to-alls with another's compute, step
# seconds). Its model config (model_configs/benchmarking/
# Qwen3-235B-A22B.yaml): the distributed optimizer with the gradient reduce and the parameter
# gather overlapped, sequence parallelism, expert-tensor-parallel size 1, the embedding and
# the loss counted in the pipeline split, bf16 (Megatron's gradients reduced in fp32), no
# userbuffers overlap. "norm, act" recomputes the norms and the experts' activation only
# (Megatron's --recompute-modules layernorm moe_act: planned so, recompute_modules); the
# tp 4 row states no recomputation. Left
# out: the intra-node row under Megatron-FSDP (its own sharding of the expert data-parallel
# group), and Qwen3-Next-80B-A3B (its gated DeltaNet blocks have no planner block).
NORM_ACT = dict(recompute="selective", recompute_modules=("layernorm", "moe_act"))
MOE_MODEL_ZOO_QWEN3: list[tuple[str, dict[str, object], bool, bool, float]] = [
    ("cross-node EP", dict(tp=2, pp=8, dp=16, ep=32, chunks=4, **NORM_ACT), True, False, 19.7),
    ("cross-node EP, 1F1B overlap", dict(tp=2, pp=8, dp=16, ep=32, chunks=4, **NORM_ACT), True,
     True, 17.6),
    ("intra-node EP, all-to-all", dict(tp=2, pp=32, dp=4, ep=8, chunks=3, **NORM_ACT), False,
     False, 24.2),
    ("intra-node EP, tp 4", dict(tp=4, pp=8, dp=8, ep=8, chunks=4), True, False, 29.0),
]


# the long-context table: tokens, context parallelism, TFLOPS per GPU dropless and under
# forced balance (Megatron-LM's count); the runs are the dropless ones
MOE_MODEL_ZOO_LONG = [(16384, 1, 237, 295), (32768, 2, 277, 335), (65536, 4, 320, 368),
                      (131072, 8, 357, 389)]  # fmt: skip


def megatron_causal_flops_per_token(cfg: ModelConfig) -> float:
    """Model FLOPs per token as Megatron-LM's ``num_floating_point_operations`` counts them
    since it halves the attention core for the causal mask: paracube's count less half the
    core's, forward and backward."""
    core = 3 * cfg.n_layers * shapes.attention_core_flops_per_token(cfg)
    return model_flops_per_token(cfg) - core / 2


def _zoo_fixed(layout: dict, deepep: bool, overlap: bool) -> dict:
    """The model zoo's software around a row's sizes (and its recomputation where it states
    one): Megatron-Core with the distributed optimizer, fused attention, interleaved
    stages cut with the embedding and the loss in a block's place, experts at etp 1."""
    fixed = dict(cp=1, etp=1, zero=1, micro_batch=1, sequence_parallel=True,
                 attention="fused", schedule="interleaved-1f1b", recompute="none",
                 ep_dispatch="deepep" if deepep else "alltoall", ep_comm_overlap=overlap,
                 **{**MEGATRON_CORE, "split": "even-ends"})  # fmt: skip
    return {**fixed, **layout}


def _moe_model_zoo() -> list[dict]:
    """Qwen3-235B-A22B on 256 H100s in BF16, as Megatron-Core's MoE model zoo ran it: step
    seconds converted to model TFLOP/s per GPU with paracube's FLOP count; its long-context
    rows' TFLOPS converted from Megatron's causal count to paracube's."""
    cfg = preset("qwen3-235b-a22b")
    out = []
    for _label, layout, deepep, overlap, step in MOE_MODEL_ZOO_QWEN3:
        published = round(2048 * cfg.seq_len * model_flops_per_token(cfg) / step / 256 / 1e12, 1)
        out.append(_run("Megatron-MoE-ModelZoo", cfg, "h100", 256, 2048, "bf16",
                        _zoo_fixed(layout, deepep, overlap), "model", published))  # fmt: skip
    for seq, cp, dropless, _forced in MOE_MODEL_ZOO_LONG:
        long = cfg.replace(seq_len=seq)
        layout = dict(tp=4, pp=8, cp=cp, dp=8 // cp, ep=8, chunks=4, recompute="selective",
                      recompute_modules=("layernorm", "moe"))  # fmt: skip
        published = round(
            dropless * model_flops_per_token(long) / megatron_causal_flops_per_token(long), 1
        )
        out.append(_run("Megatron-MoE-ModelZoo", long, "h100", 256, 256, "bf16",
                        _zoo_fixed(layout, True, False), "model", published))  # fmt: skip
    return out


def _nemo_long_sequence() -> list[dict]:
    """NeMo 24.03's long-sequence table: Llama 2 7B on DGX-H100 in FP8, 4K–1M tokens."""
    out = []
    # thousands of tokens, GPUs, global batch, tp, pp, cp, dp, TFLOP/s per GPU
    for k, n, B, tp, pp, cp, dp, tflops in [
        (4, 4, 1024, 1, 1, 1, 4, 768), (8, 8, 512, 1, 2, 1, 4, 730),
        (16, 16, 256, 2, 1, 1, 8, 660), (32, 32, 128, 2, 1, 2, 8, 610),
        (64, 64, 64, 4, 1, 2, 8, 574), (128, 128, 32, 4, 1, 4, 8, 555),
        (256, 256, 16, 4, 1, 8, 8, 549), (512, 512, 8, 8, 1, 16, 4, 549),
        (1024, 1024, 4, 8, 1, 32, 4, 536),
    ]:
        cfg = replace(preset("llama2-7b"), seq_len=k * 1024)
        fixed = dict(tp=tp, pp=pp, cp=cp, dp=dp, micro_batch=1, zero=1,
                     sequence_parallel=tp > 1, attention="fused", **MEGATRON_CORE)
        out.append(_run("NeMo long sequence (FP8)", cfg, "h100", n, B, "fp8", fixed, "model",
                        tflops))
    return out


def internlm_7b() -> ModelConfig:
    """InternLM-7B as its scaling tests trained it (InternLM/InternLM ``configs/7B_sft.py``):
    32 blocks of 4,096 with 32 heads, SwiGLU of 8/3 · 4,096 rounded up to 256 — 11,008 —,
    RMSNorm, rotary positions, a 103,168-token vocabulary, untied head; the linear layers'
    biases (the attention's) left out, under 0.1 % of its FLOPs."""
    return ModelConfig(n_layers=32, hidden=4096, n_heads=32, vocab_size=103168, seq_len=2048,
                       ffn_hidden=11008, activation="swiglu", norm="rmsnorm", position="rope",
                       tie_embeddings=False, bias=False, name="InternLM-7B")


# The FLOPS tables: packed samples (pack_sample_into_one True, attention over the whole
# 2,048), tp 1, ZeRO-1 within each node (zero1=8); per row (GPUs, micro-batch, micro-batches
# a step, tokens/s per GPU, the table's TFLOPS), with and without activation checkpointing
INTERNLM_FLOPS = {
    True: [(8, 8, 1, 3314, 193), (16, 8, 1, 3268, 191), (32, 8, 1, 3323, 188),
           (64, 8, 1, 3217, 188), (128, 8, 1, 3260, 187), (256, 8, 1, 3215, 187),
           (512, 8, 1, 3199, 186), (1024, 8, 1, 3163, 184), (512, 4, 1, 2963, 173),
           (1024, 2, 1, 2341, 136), (1024, 4, 1, 2796, 160)],
    False: [(8, 2, 4, 4103, 183), (16, 2, 4, 3939, 177), (32, 2, 4, 3919, 176),
            (64, 2, 4, 3944, 174), (128, 2, 4, 3928, 173), (256, 2, 4, 3920, 173),
            (512, 2, 4, 3900, 173), (1024, 2, 4, 3625, 160), (512, 2, 2, 3084, 139),
            (1024, 2, 1, 2346, 105), (1024, 2, 2, 2817, 124)],
}
# The throughput table's other layouts (checkpointing off, pack_sample_into_one False),
# tokens/s per GPU on 8 … 1,024 GPUs: (tp, ZeRO-1 group: 0 = every data-parallel rank,
# zero1=-1), micro-batch 2 (tp 1) or 4 (tp 2), 4 micro-batches a step
INTERNLM_THROUGHPUT = {
    (1, 0): [4062, 3842, 3752, 3690, 3571, 3209, 2861, 2271],
    (2, 0): [3822, 3595, 3475, 3438, 3308, 3094, 2992, 2785],
    (2, 4): [3761, 3658, 3655, 3650, 3651, 3653, 3589, 3486],
}


def _internlm() -> list[dict]:
    """InternLM-7B on 8 to 1,024 A100 80GB over four 100 Gb/s RoCE ports a node (InternLM's
    scaling tables): ZeRO-1 over every data-parallel rank or within a node, its parameters
    synced by broadcasts (:data:`~paracube.planner.stacks.INTERNLM`)."""
    cfg = internlm_7b()
    per_token = model_flops_per_token(cfg)
    out = []

    def row(n: int, tp: int, group: int, b: int, m: int, ckpt: bool, tokens: float) -> None:
        dp = n // tp
        fixed = dict(dp=dp, tp=tp, pp=1, zero=1, micro_batch=b, sequence_parallel=False,
                     recompute="full" if ckpt else "none",
                     shard=group if 1 < group < dp else 0, **INTERNLM)
        out.append(_run("InternLM", cfg, "a100-80gb", n, dp * b * m, "bf16", fixed, "model",
                        round(tokens * per_token / 1e12, 1), inter="roce-4x100"))

    for ckpt, rows in INTERNLM_FLOPS.items():
        for n, b, m, tokens, _ in rows:
            row(n, 1, 8, b, m, ckpt, tokens)
    for (tp, group), tokens_per_gpu in INTERNLM_THROUGHPUT.items():
        for n, tokens in zip((8, 16, 32, 64, 128, 256, 512, 1024), tokens_per_gpu):
            row(n, tp, group, 2 * tp, 4, False, tokens)
    return out


def _megatron_bridge_fp8() -> list[dict]:
    """Megatron-Bridge's dense FP8 pre-training rows on DGX-H100 (sequence 8192): 25.11's,
    and 26.02's larger-batch runs of the same recipes."""
    # the recipes: gradients reduced in bf16 (the performance scripts' common configs set
    # grad_reduce_in_fp32 False), userbuffers' TP overlap (CommOverlapConfig tp_comm_overlap
    # True); 405B counts the embedding and the loss as blocks in its pipeline split
    software = dict(fp8_scaling="current", grad_reduce="compute", tp_comm_overlap=True)
    out = []
    # container, preset, GPUs, global batch, tp, pp, cp, vp, ZeRO (FSDP = 1: 3; else the
    # distributed optimizer: 1), split, tokens/s per GPU; micro-batch 1 in every row
    for container, name, n, B, tp, pp, cp, vp, zero, split, tokens in [
        ("25.11", "llama3-8b", 8, 128, 1, 1, 1, 1, 3, "even", 14451),
        ("25.11", "llama3-70b", 64, 128, 4, 8, 1, 5, 1, "even", 1602),
        ("25.11", "llama3-405b", 1024, 512, 8, 8, 2, 8, 1, "even-ends", 292),
        ("26.02", "llama3-70b", 64, 256, 4, 8, 1, 5, 1, "even", 1621),
        ("26.02", "llama3-405b", 1024, 1536, 8, 8, 2, 8, 1, "even-ends", 311),
    ]:
        cfg = preset(name)
        fixed = dict(tp=tp, pp=pp, cp=cp, dp=n // (tp * pp * cp), micro_batch=1, zero=zero,
                     sequence_parallel=tp > 1, attention="fused",
                     **{**MEGATRON_CORE, **software, "split": split})
        if vp > 1:
            fixed.update(schedule="interleaved-1f1b", chunks=vp)
        published = round(tokens * model_flops_per_token(cfg) / 1e12, 1)
        out.append(_run(f"Megatron-Bridge {container} (FP8)", cfg, "h100", n, B, "fp8", fixed,
                        "model", published))
    return out
# fmt: on


def evaluate(row: dict) -> dict:
    key = row["gpu"]
    fixed = {"offload": False, **row["fixed"]}  # no published run moved its optimizer to the host
    cluster = Cluster(
        hw.gpu(key),
        8,
        hw.interconnect(hw.DEFAULT_INTRA[key]),
        hw.interconnect(row["inter"]),
    )
    result = search(
        row["cfg"],
        cluster,
        row["gpus"],
        row["batch"],
        precision=row["precision"],
        fixed=fixed,
        top=1,
    )
    note = ""
    if result.ranked:
        best = result.ranked[0]
    elif result.smallest_misfit is not None:
        # The run happened, so it fit: time the layout the planner would choose were its
        # memory model not stricter than the run — the fastest of those the paper allows —
        # and say so.
        best = max(
            (
                Candidate(
                    layout,
                    peak_memory(row["cfg"], layout, row["precision"]),
                    estimate(row["cfg"], layout, cluster, row["precision"]),
                )
                for layout in candidate_layouts(
                    row["cfg"], row["gpus"], cluster.gpus_per_node, row["batch"], fixed, {}
                )
            ),
            key=lambda c: c.time.tokens_per_s,
        )
        note = f"memory model: {best.memory.total / 1e9:.0f} GB > {cluster.gpu.memory_bytes / 1e9:.0f} GB"
    else:
        raise ValueError(
            f"{row['source']} {row['cfg'].name}: the planner finds no layout ({result.rejected})"
        )
    cfg, L = row["cfg"], best.layout
    per_token = (
        hardware_flops_per_token(
            cfg, L.recompute, replay=L.recompute_replay, modules=L.recompute_modules
        )
        if row["counting"] == "hardware"
        else model_flops_per_token(cfg)
    )
    predicted = row["batch"] * cfg.seq_len * per_token / best.time.step_time / row["gpus"] / 1e12
    return {
        "source": row["source"],
        "stack": STACKS[row["source"]],
        "model": cfg.name,
        "gpu": row["gpu"],
        "gpus": row["gpus"],
        "batch": row["batch"],
        "layout": f"{L.tp}×{L.pp}×{L.dp}"
        + (f" (cp {L.cp})" if L.cp > 1 else "")
        + (f" (ZeRO in groups of {L.shard})" if L.shard else ""),
        "seq_len": cfg.seq_len,
        "recompute": L.recompute
        + (
            ""
            if L.recompute_blocks is None
            else f" ({L.recompute_blocks} blocks"
            + (" a stage)" if L.recompute_scope == "stage" else ")")
        ),
        "micro_batch": L.micro_batch,
        "schedule": L.schedule,
        "chunks": L.chunks,
        "counting": row["counting"],
        "published_tflops": row["published"],
        "predicted_tflops": round(predicted, 1),
        "ratio": round(predicted / row["published"], 3),
        "bubble_share": round(best.time.bubble / best.time.step_time, 3),
        "note": note,
    }


# ResNet-50 v1.5 as NVIDIA measured it (module docstring): (system, GPU, precision as
# planned, per-GPU batch, {GPUs: images/s}). The V100 16GB rows run on the catalog's 32 GB
# V100: memory does not enter the step time.
RESNET50_RUNS = [
    ("DGX A100 80GB, TF32", "a100-80gb", "tf32", 256, {1: 938, 8: 7248}),
    ("DGX A100 80GB, AMP", "a100-80gb", "fp16", 256, {1: 2470, 8: 16621}),
    ("DGX-1 V100 16GB, FP32", "v100", "fp32", 112, {1: 367, 8: 2855}),
    ("DGX-1 V100 16GB, AMP", "v100", "fp16", 256, {1: 1200, 8: 8322}),
    ("DGX-1 V100 32GB, FP32", "v100", "fp32", 112, {1: 356, 8: 2766}),
    ("DGX-1 V100 32GB, AMP", "v100", "fp16", 256, {1: 1156, 8: 8056}),
]


def resnet50_images_per_s(gpu: str, precision: str, batch: int, gpus: int) -> float:
    """The planner's ResNet-50 images/s at ``batch`` per GPU, one micro-batch per step, data
    parallel over one node's NVLink (as :data:`RESNET50_RUNS` ran)."""
    from paracube.planner.generic import generic, search_generic

    cluster = Cluster(
        hw.gpu(gpu), 8, hw.interconnect(hw.DEFAULT_INTRA[gpu]), hw.interconnect("ib-hdr")
    )
    model = generic("resnet50")
    assert model is not None
    fixed = {"micro_batch": batch, "zero": 0}
    result = search_generic(model, cluster, gpus, batch * gpus, precision, fixed)
    return result.ranked[0].time.tokens_per_s  # samples/s for a model without tokens


def resnet50_checks(tensor_cores: bool | None = None) -> list[dict]:
    """Every run of :data:`RESNET50_RUNS` beside the planner's images/s for it — the rows of
    ``benchmarks/bench_planner_resnet50.py`` and the check ``paracube plan --model resnet50``
    prints. ``tensor_cores``: only the runs on tensor cores (fp16, tf32: True) or on CUDA
    cores (fp32: False); None, all."""
    rows = []
    for system, gpu, precision, batch, measured in RESNET50_RUNS:
        if tensor_cores is not None and (precision != "fp32") != tensor_cores:
            continue
        for gpus, images in measured.items():
            rate = resnet50_images_per_s(gpu, precision, batch, gpus)
            rows.append(
                {"system": system, "gpu": gpu, "precision": precision, "batch_per_gpu": batch,
                 "gpus": gpus, "published": images, "predicted": round(rate),
                 "ratio": round(rate / images, 3)}
            )  # fmt: skip
    return rows
