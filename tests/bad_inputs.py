"""Every refusal of the command line: the input, the line it must get (exit status 2).

One table, read by ``tests/test_bad_inputs.py`` (which runs each case and checks the
line) and rendered into ``docs/bad-inputs.md`` with the messages as they really are
(``PARACUBE_WRITE_DOCS=1 pytest tests/test_bad_inputs.py`` rewrites it; a test fails
when the committed page differs). ``{tmp}`` in an argument is a fresh temporary folder
holding the files :func:`prepare` writes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SCHEDULE = ["schedule", "--pp", "2", "--microbatches", "4"]

# (group, argv, a fragment the one line must contain)
# a mixed-cluster plan: MIXED[4] is the --gpus value
MIXED = ["plan", "--model", "gpt3-350m", "--gpus", "8xa100-80gb,8xv100", "--global-batch", "64"]

CASES: list[tuple[str, list[str], str]] = [
    # -- layout ----------------------------------------------------------------------
    ("layout", ["train", "--dp", "0"], "--dp must be a positive integer, got 0"),
    ("layout", ["train", "--tp", "-1"], "--tp must be a positive integer, got -1"),
    ("layout", ["train", "--pp", "0"], "--pp must be a positive integer, got 0"),
    ("layout", ["train", "--dp", "x"], "argument --dp: invalid int value: 'x'"),
    ("layout", ["train", "--tp", "3"], "attention heads (n_heads=4) is not divisible by --tp 3"),
    ("layout", ["train", "--tp", "8", "--dp", "2", "--gpus-per-node", "4"],
     "--tp 8 is larger than a node (4 ranks per node)"),
    ("layout", ["train", "--sequence-parallel"], "--sequence-parallel needs --tp > 1"),
    ("layout", ["train", "--pp", "2"],
     "1f1b needs at least as many micro-batches as stages: --microbatches 1 < --pp 2"),
    ("layout", ["train", "--pp", "2", "--microbatches", "4", "--schedule", "zigzag"],
     "unknown schedule 'zigzag'"),
    ("layout", ["train", "--pp", "4", "--microbatches", "6", "--schedule", "interleaved-1f1b",
                "--chunks", "2"], "6 is not a multiple of 4"),
    ("layout", ["train", "--pp", "8", "--microbatches", "8", "--model", "nano"], "5 pipeline layers"),
    ("layout", ["train", "--model", "mixtral-8x7b"],
     "a mixture of experts is planned (paracube plan), not trained: paracube train builds dense models"),
    ("layout", ["train", "--schedule", "gpipe"], "--schedule gpipe needs --pp > 1"),
    ("layout", ["train", "--chunks", "2"], "--chunks 2 needs --pp > 1"),
    ("layout", ["train", "--balance", "flops"], "--balance flops needs --pp > 1"),
    ("layout", ["train", "--compress", "gzip"], "unknown --compress 'gzip'"),
    ("layout", ["train", "--compress", "topk:0"], "--compress topk:0: RATIO must be a number in (0, 1]"),
    ("layout", ["train", "--compress", "topk:1.5"], "--compress topk:1.5: RATIO must be a number in (0, 1]"),
    ("layout", ["train", "--compress", "topk:nan"], "--compress topk:nan: RATIO must be a number in (0, 1]"),
    ("layout", ["train", "--compress", "powersgd:0"], "--compress powersgd:0: RANK must be an integer ≥ 1"),
    ("layout", ["train", "--compress", "powersgd:128"], "RANK must be an integer in [1, 127]"),
    ("layout", ["train", "--compress", "powersgd:x"], "--compress powersgd:x: RANK must be an integer ≥ 1"),
    ("layout", ["train", "--dp", "2", "--zero", "2", "--compress", "topk:0.01"],
     "--compress topk with --zero 2 is not supported"),
    ("layout", ["train", "--no-error-feedback"], "--no-error-feedback applies to --compress topk"),
    ("layout", ["train", "--dp", "2", "--dp-mode", "gossip"], "unknown --dp-mode 'gossip'"),
    ("layout", ["train", "--dp", "2", "--dp-mode", "local-sgd:0"], "--dp-mode local-sgd:0: H must be an integer ≥ 1"),
    ("layout", ["train", "--dp-mode", "diloco:4"], "--dp-mode diloco:4 is not supported with --dp 1"),
    ("layout", ["train", "--dp", "2", "--zero", "1", "--dp-mode", "local-sgd:4"],
     "--dp-mode local-sgd:4 is not supported with --zero 1"),
    ("layout", ["train", "--dp", "2", "--compress", "bf16", "--dp-mode", "local-sgd:4"],
     "is not supported with --compress"),
    ("layout", ["train", "--dp", "2", "--dp-mode", "diloco:4", "--save-dir", "{tmp}/ck"],
     "--dp-mode diloco:4 is not supported with checkpoints"),
    ("layout", ["train", "--dp", "2", "--dp-mode", "stale:-1"], "--dp-mode stale:-1: S must be an integer ≥ 0"),
    ("layout", ["train", "--dp", "2", "--zero", "2", "--dp-mode", "stale:1"],
     "--dp-mode stale:1 is not supported with --zero 2"),
    ("layout", ["train", "--dp", "2", "--precision", "fp16", "--dp-mode", "stale:1"],
     "--dp-mode stale:1 is not supported with --precision fp16"),
    ("layout", ["train", "--dp", "2", "--dp-mode", "ps:x"], "--dp-mode ps:x: S must be an integer ≥ 0"),
    ("layout", ["train", "--dp", "2", "--tp", "2", "--dp-mode", "ps"],
     "--dp-mode ps is not supported with --tp 2 --pp 1"),
    ("layout", ["train", "--dp", "2", "--zero", "1", "--dp-mode", "ps:2"],
     "--dp-mode ps:2 is not supported with --zero 1"),
    ("layout", ["train", "--offload", "optimizer"], "this machine has no GPU, so there is nothing to offload"),
    ("layout", ["train", "--offload", "nvme"], "unknown --offload 'nvme': choose one of none, optimizer"),
    ("layout", ["train", "--dp", str(10**20)], "ranks on this machine's"),
    ("layout", ["train", "--dp", "2", "--nnodes", "2"], "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
    ("layout", ["train", "--dp", "3", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29500"],
     "dp×tp×pp = 3 ranks do not split evenly over --nnodes 2"),
    ("layout", ["train", "--rdzv-endpoint", "127.0.0.1:29500"], "--rdzv-endpoint needs --nnodes > 1"),
    ("layout", ["train", "--dp", "2", "--nnodes", "2", "--rdzv-endpoint", "host:port"],
     "--rdzv-endpoint host:port: write it as HOST:PORT"),
    ("layout", ["train", "--nnodes", "0"], "--nnodes must be a positive integer, got 0"),
    ("layout", ["train", "--dp", "2", "--dp-balance", "1"], "--dp-balance 1: 1 weights for --dp 2: give one per rank"),
    ("layout", ["train", "--dp", "2", "--dp-balance", "1,x"], "give even, auto or one weight per data-parallel rank"),
    ("layout", ["train", "--dp", "2", "--dp-balance", "0,1"],
     "--dp-balance 0,1: every weight must be a finite number > 0"),
    ("layout", ["train", "--dp", "2", "--dp-balance", "1,100"],
     "a global batch of 16 leaves a rank less than one window per micro-step (of 1 a step): "
     "use --global-batch ≥ 101"),
    ("layout", ["train", "--dp-balance", "auto"], "--dp-balance auto needs --dp > 1"),
    ("layout", ["train", "--dp", "2", "--pp", "2", "--microbatches", "2", "--dp-balance", "1,3"],
     "--dp-balance 1,3 with --pp > 1 is not supported yet"),
    # -- batch and steps -------------------------------------------------------------
    ("batch", ["train", "--dp", "2", "--micro-batch", "3", "--global-batch", "10"],
     "--global-batch 10 is not divisible"),
    ("batch", ["train", "--grad-accum", "2", "--global-batch", "16"],
     "--grad-accum and --global-batch both set the micro-batches per step"),
    ("batch", ["train", "--pp", "2", "--grad-accum", "2", "--microbatches", "4"],
     "--grad-accum and --microbatches both set the micro-batches per step"),
    ("batch", ["train", "--pp", "2", "--microbatches", "0"], "--microbatches must be a positive integer, got 0"),
    ("batch", ["train", "--grad-accum", "0"], "--grad-accum must be a positive integer, got 0"),
    ("batch", ["train", "--steps", "0"], "--steps must be a positive integer"),
    ("batch", ["train", "--count-activations-every", "0"],
     "--count-activations-every must be a positive integer"),
    # -- numbers ---------------------------------------------------------------------
    ("numbers", ["train", "--lr", "inf"], "--lr must be a finite number > 0, got inf"),
    ("numbers", ["train", "--lr", "nan"], "--lr must be a finite number > 0, got nan"),
    ("numbers", ["train", "--lr", "0"], "--lr must be a finite number > 0, got 0.0"),
    ("numbers", ["train", "--lr", "1e-3", "--min-lr", "1e-2"], "--min-lr 0.01 is above --lr 0.001"),
    ("numbers", ["train", "--weight-decay", "nan"], "--weight-decay must be a finite number >= 0, got nan"),
    ("numbers", ["train", "--weight-decay", "-1"], "--weight-decay must be a finite number >= 0, got -1.0"),
    ("numbers", ["train", "--warmup-steps", "-1"], "--warmup-steps must be a non-negative integer, got -1"),
    ("numbers", ["train", "--eval-every", "-5"], "--eval-every must be a non-negative integer, got -5"),
    ("numbers", ["train", "--grad-clip", "inf"], "--grad-clip must be a finite number > 0, got inf"),
    ("numbers", ["train", "--val-fraction", "0.9"], "--val-fraction must be a finite number > 0 and <= 0.5"),
    ("numbers", ["train", "--seed", str(2**70)], "--seed must be in [0, 2**32 - 1]"),
    ("numbers", ["train", "--seed", "-1"], "--seed must be in [0, 2**32 - 1], got -1"),
    ("numbers", ["train", "--timeout", "nan"], "--timeout must be a finite number > 0 and <= 86400, got nan"),
    ("numbers", ["train", "--timeout", "inf"], "--timeout must be a finite number > 0 and <= 86400, got inf"),
    ("numbers", ["train", "--timeout", "0"], "--timeout must be a finite number > 0"),
    ("numbers", ["train", "--threads", "0"], "--threads must be a positive integer"),
    ("numbers", ["train", "--threads", "100000"], "--threads 100000 is more than this machine's"),
    ("numbers", ["train", "--seq-len", "0"], "--seq-len must be a positive integer, got 0"),
    # -- memory and precision --------------------------------------------------------
    ("memory", ["train", "--zero", "4"], "unknown --zero 4: choose 0, 1, 2 or 3"),
    ("memory", ["train", "--zero", "two"], "unknown --zero 'two'"),
    ("memory", ["train", "--precision", "fp8"], "unknown --precision 'fp8'"),
    ("memory", ["train", "--recompute", "some"], "unknown --recompute 'some'"),
    ("memory", ["train", "--recompute", "full", "--recompute-blocks", "9"],
     "--recompute-blocks 9 is more than the model's"),
    ("memory", ["train", "--recompute-blocks", "1"], "--recompute-blocks needs --recompute selective or full"),
    ("memory", ["train", "--grad-reduce", "int8", "--precision", "bf16"], "unknown --grad-reduce 'int8'"),
    ("memory", ["train", "--grad-reduce", "compute"], "--grad-reduce compute is for --precision bf16 or fp16"),
    ("memory", ["train", "--zero", "3", "--pp", "2", "--microbatches", "2"],
     "--zero 3 with --pp > 1 is not supported"),
    ("memory", ["train", "--precision", "fp16", "--loss-scale", "none"], "--precision fp16 without loss scaling"),
    ("memory", ["train", "--precision", "fp16", "--loss-scale", "-3"],
     "--loss-scale must be 'dynamic' or a number in [1, 2**24], got '-3'"),
    ("memory", ["train", "--precision", "fp16", "--loss-scale", "1e30"],
     "--loss-scale must be 'dynamic' or a number in [1, 2**24], got '1e30'"),
    ("memory", ["train", "--precision", "bf16", "--loss-scale", "1024"], "--loss-scale is for --precision fp16"),
    ("memory", ["train", "--model", "gpt3-175b"], "--model gpt3-175b needs at least"),
    ("memory", ["train", "--model", "nano", "--seq-len", "200000"], "one step of nano at --seq-len 200000"),
    ("memory", ["train", "--on-nan", "ignore"], "unknown --on-nan 'ignore': choose one of stop, skip, continue"),
    # -- model and data --------------------------------------------------------------
    ("data", ["train", "--model", "gpt5"], "unknown --model 'gpt5': give a preset"),
    ("data", ["train", "--model", "hf:{tmp}/emptydir"], "no config.json at"),
    ("data", ["plan", "--model", "hf:{tmp}/hf-gpt-neox", "--gpus", "8", "--global-batch", "8"],
     "model_type 'gpt_neox' is not a supported architecture (not modelled: its parallel "
     "attention and MLP (use_parallel_residual) beside partial rotary positions)"),
    ("data", ["plan", "--model", "hf:{tmp}/hf-gpt-oss-irregular", "--gpus", "8", "--global-batch", "8"],
     "gpt_oss config: layer_types puts full attention in blocks [1, 2]…: planned where every "
     "N-th block attends fully and the others locally (GPT-OSS: every 2nd, Llama 4: every 4th)"),
    ("data", ["train", "--model", "hf:{tmp}/hf-mistral-window", "--seq-len", "64"],
     "hf:mistral: a sliding window of 32 tokens < --seq-len 64 — planned (paracube plan), not "
     "trained: paracube trains full attention; use --seq-len ≤ 32"),
    ("data", ["plan", "--model", "hf:{tmp}/hf-gemma3-relu", "--gpus", "8", "--global-batch", "8"],
     "gemma3_text config: hidden_activation 'relu' is not supported (planned as Gemma's GeGLU: "
     "use 'gelu_pytorch_tanh')"),
    ("data", ["plan", "--model", "hf:{tmp}/hf-gemma2-cap0", "--gpus", "8", "--global-batch", "8"],
     "gemma2 config: final_logit_softcapping 0 must be a positive number (null: none)"),
    ("data", ["train", "--model", "hf:{tmp}/hf-gemma2-short"],
     "hf:gemma2: post_norms (four norms a block), attention_softcap=50, logit_softcap=30 (logit "
     "soft-capping) — planned (paracube plan), not trained: paracube's GPT builds none of them"),
    ("data", ["plan", "--model", "hf:{tmp}/hf-llama4-step0", "--gpus", "8", "--global-batch", "8"],
     "llama4 config: interleave_moe_layer_step 0 must be a positive integer"),
    ("data", ["plan", "--model", "hf:{tmp}/hf-deepseek-v3", "--gpus", "8", "--global-batch", "8"],
     "deepseek_v3 config: no integer 'n_routed_experts': a config transformers wrote gives "
     "n_routed_experts, num_experts_per_tok"),
    ("data", ["train", "--model", "hf:{tmp}/hf-bert"],
     "model_type 'bert' is not a supported architecture: supported are llama, mistral, qwen2, qwen3, gpt2"),
    ("data", ["train", "--model", "hf:{tmp}/hf-bad-weights", "--seq-len", "32"],
     "tensor 'model.layers.1.mlp.up_proj.weight' has shape (8, 64) but the config gives (176, 64)"),
    ("data", ["train", "--model", "hf:{tmp}/hf-lost-shard", "--seq-len", "32"],
     "names model-00002-of-00002.safetensors, which is not in {tmp}/hf-lost-shard: copy every shard (2 files)"),
    ("data", ["train", "--model", "hf:{tmp}/hf-qwen3-moe", "--seq-len", "32"],
     "hf:qwen3_moe: experts=4 — a mixture of experts is planned (paracube plan), not trained"),
    ("data", ["plan", "--model", "hf:{tmp}/hf-qwen3-moe-all-dense", "--seq", "32", "--gpus", "8",
              "--global-batch", "8"],
     "qwen3_moe config: mlp_only_layers [0, 1] and decoder_sparse_step 1 leave every one of "
     "its 2 blocks dense: plan it as a dense model (qwen3)"),
    ("data", ["train", "--model", "hf:{tmp}/hf-partial-stretch"],
     "config.json: its rotary stretch 'llama3' gives no number for 'low_freq_factor'"),
    ("data", ["train", "--model", "hf:{tmp}/hf-llama", "--tp", "4"],
     "key/value heads (n_kv_heads=2) is not divisible by --tp 4"),
    ("data", ["train", "--model", "hf:{tmp}/hf-llama", "--seq-len", "512"],
     "--seq-len 512 is longer than the model's context 256"),
    ("data", ["train", "--model", "hf:{tmp}/hf-llama", "--recompute", "selective"],
     "--recompute selective needs paracube's own attention"),
    ("data", ["train", "--model", "hf:{tmp}/hf-llama", "--data", "{tmp}/tokens-short", "--seq-len", "16"],
     "its tokenizer's vocabulary (300) is larger than the model's (256)"),
    ("data", ["train", "--model", "nosuchpackage.models:build"], "cannot import it"),
    ("data", ["train", "--model", "os:getcwd"], "returned str, not a paracube.models.ModelSpec"),
    ("data", ["train", "--model", "tests.factories:chain_without_the_norm"],
     "parameter norm.weight is in none of the chain's modules"),
    ("data", ["train", "--data", "/no/such/file.txt"], "--data /no/such/file.txt: no such file or folder"),
    ("data", ["train", "--data", ""], "--data is empty: give a text file or folder"),
    ("data", ["train", "--data", "{tmp}/empty.txt"], "no text in it (empty)"),
    ("data", ["train", "--data", "{tmp}/utf16.txt"], "is UTF-16 text; convert it to UTF-8"),
    ("data", ["train", "--data", "{tmp}/blob.bin"], "looks binary (NUL bytes), not text"),
    ("data", ["train", "--data", "{tmp}/binaries"], "the folder holds no text files (2 binary skipped)"),
    ("data", ["train", "--data", "{tmp}/short.txt"], "is too short for sequence length 128"),
    ("data", ["train", "--data", "{tmp}/tokens-corrupt"], "index.json is unreadable or corrupt"),
    ("data", ["train", "--data", "{tmp}/tokens-truncated"],
     "train.bin is 10 bytes, the index says 400 uint16 tokens (800 bytes)"),
    ("data", ["train", "--data", "{tmp}/tokens-short", "--seq-len", "64"],
     "the val split holds 40 tokens, fewer than one window of seq_len + 1 = 65"),
    ("data", ["data", "prepare", "{tmp}/short.txt", "--tokenizer", "bpe:100", "--out", "{tmp}/new"],
     "--tokenizer bpe:100: VOCAB must be an integer in [257, 1048576]"),
    ("data", ["data", "prepare", "{tmp}/short.txt", "--tokenizer", "{tmp}/no-tokenizer", "--out", "{tmp}/new"],
     "no such tokenizer.json (nothing is downloaded)"),
    ("data", ["data", "prepare", "{tmp}/short.txt", "--tokenizer", "bpe:512", "--out", "{tmp}/binaries"],
     "--out {tmp}/binaries exists and is not empty"),
    # -- outputs ---------------------------------------------------------------------
    ("outputs", ["train", "--metrics", "{tmp}"], "is a folder: give a file path inside it"),
    ("outputs", ["train", "--metrics", "/dev/full"], "--metrics /dev/full is not a regular file"),
    ("outputs", ["train", "--metrics", "/proc/paracube.jsonl"],
     "--metrics /proc/paracube.jsonl: cannot write in /proc"),
    ("outputs", ["train", "--metrics", "{tmp}/old.jsonl"], "exists: choose another path, or pass --metrics-mode"),
    ("outputs", ["train", "--metrics", ""], "--metrics is empty: give a file path"),
    ("outputs", ["train", "--metrics", "{tmp}/m.jsonl", "--metrics-mode", "keep"],
     "unknown --metrics-mode 'keep': choose one of new, append, overwrite"),
    ("outputs", ["train", "--predict"], "calibration file"),
    # -- checkpoints -----------------------------------------------------------------
    ("checkpoints", ["train", "--save-every", "2"], "--save-every needs --save-dir"),
    ("checkpoints", ["train", "--async-save"], "--async-save needs --save-dir"),
    ("checkpoints", ["train", "--save-dir", "{tmp}/ck", "--save-every", "0"],
     "--save-every must be a positive integer, got 0"),
    ("checkpoints", ["train", "--save-dir", "{tmp}/ck", "--keep-last", "0"],
     "--keep-last must be a positive integer, got 0"),
    ("checkpoints", ["train", "--save-dir", "/proc/ck"], "--save-dir /proc/ck: cannot write in /proc"),
    ("checkpoints", ["train", "--save-dir", "{tmp}/old.jsonl"], "--save-dir {tmp}/old.jsonl is not a folder"),
    ("checkpoints", ["train", "--resume", "{tmp}/nothing"], "--resume {tmp}/nothing: no such folder"),
    ("checkpoints", ["train", "--resume", "{tmp}/emptydir"], "no checkpoint: no paracube.json in it"),
    ("checkpoints", ["train", "--resume", "{tmp}/.step-00000002.partial"],
     "a partial checkpoint (never completed)"),
    ("checkpoints", ["train", "--resume", "auto"], "--resume auto needs --save-dir"),
    ("checkpoints", ["train", "--resume", "auto", "--save-dir", "{tmp}/emptydir"],
     "--resume auto: no complete checkpoint in {tmp}/emptydir"),
    ("checkpoints", ["train", "--model", "nano", "--resume", "{tmp}/other-model"],
     "embed.tok.weight is (10, 4) in the checkpoint but (256, 64) in this model"),
    ("checkpoints", ["train", "--model", "nano", "--resume", "{tmp}/corrupt"], "its tensor metadata is unreadable"),
    ("checkpoints", ["train", "--model", "nano", "--resume", "{tmp}/nano-step-5", "--steps", "5"],
     "the checkpoint is at step 5, which --steps 5 has already reached"),
    ("checkpoints", ["train", "--init-from", "{tmp}/none.safetensors"],
     "--init-from {tmp}/none.safetensors: no such file"),
    ("checkpoints", ["train", "--init-from", "{tmp}/old.jsonl"], "--init-from {tmp}/old.jsonl: not a safetensors file"),
    ("checkpoints", ["train", "--init-from", "{tmp}/w.safetensors", "--resume", "auto", "--save-dir", "{tmp}"],
     "--resume and --init-from both set where the weights come from"),
    ("checkpoints", ["export", "{tmp}/nothing", "--out", "{tmp}/w2.safetensors"],
     "export {tmp}/nothing: no such folder"),
    ("checkpoints", ["export", "{tmp}/emptydir", "--out", "{tmp}/w2.safetensors"], "no checkpoint: no paracube.json"),
    ("checkpoints", ["export", "{tmp}/nano-step-5", "--out", "{tmp}/w.bin"],
     "{tmp}/nano-step-5: its paracube.json names no model: not a checkpoint"),
    ("checkpoints", ["export", "{tmp}/odd-shape", "--out", "{tmp}/hf-out"],
     "--out {tmp}/hf-out is a folder, for a Hugging Face model: paracube's GPT with layernorm, "
     "swiglu, rope positions, biases and 2 of 2 key heads is no Hugging Face architecture"),
    ("checkpoints", ["export", "{tmp}/nano-step-5", "--out", "{tmp}/emptydir"], "exists: give a new folder"),
    ("checkpoints", ["export", "{tmp}/nano-step-5", "--out", "{tmp}/w.safetensors"],
     "--out {tmp}/w.safetensors exists: choose another path, or remove it first"),
    ("checkpoints", ["import", "tiny", "--out", "{tmp}/i.safetensors"],
     "paracube import tiny: give a Hugging Face model directory, hf:DIR"),
    ("checkpoints", ["import", "hf:{tmp}/hf-llama", "--out", "{tmp}/i.bin"],
     "--out {tmp}/i.bin: give a .safetensors file name"),
    ("checkpoints", ["import", "hf:{tmp}/hf-llama", "--out", "{tmp}/w.safetensors"],
     "--out {tmp}/w.safetensors exists: choose another path, or remove it first"),
    ("checkpoints", ["import", "hf:{tmp}/hf-llama", "--out", "{tmp}/i.safetensors"],
     "paracube import: no model.safetensors (or model.safetensors.index.json and its shards) in {tmp}/hf-llama"),
    ("checkpoints", ["import", "hf:{tmp}/hf-bad-weights", "--out", "{tmp}/i.safetensors"],
     "tensor 'model.layers.1.mlp.up_proj.weight' has shape (8, 64) but the config gives (176, 64)"),
    ("checkpoints", ["import", "hf:{tmp}/hf-lost-shard", "--out", "{tmp}/i.safetensors"],
     "model.safetensors.index.json names model-00002-of-00002.safetensors, which is not in"),
    ("checkpoints", ["import", "hf:{tmp}/hf-yarn", "--out", "{tmp}/i.safetensors"],
     "its rotary positions are stretched by 'yarn', which paracube's GPT does not build"),
    ("checkpoints", ["import", "hf:{tmp}/hf-gemma", "--out", "{tmp}/i.safetensors"],
     "paracube import: gemma cannot be paracube's GPT: its MLP gates with tanh GELU (GeGLU), "
     "its norms scale by 1 + w and its embedding by √hidden"),
    ("checkpoints", ["import", "hf:{tmp}/hf-gpt-oss", "--out", "{tmp}/i.safetensors"],
     "paracube import: gpt_oss cannot be paracube's GPT: it is a mixture of experts"),
    ("checkpoints", ["import", "hf:{tmp}/hf-qwen3-biased", "--out", "{tmp}/i.safetensors"],
     "this qwen3 biases its attention's projections but not its MLP's, or the other way "
     "round, and paracube's GPT biases every linear or q, k and v alone"),
    # -- diagnosis and injected faults ----------------------------------------------
    ("diagnose", ["diagnose", "{tmp}/no-run.jsonl"], "{tmp}/no-run.jsonl does not exist: give the --metrics file"),
    ("diagnose", ["diagnose", "{tmp}/empty.txt"], "holds no step records"),
    ("diagnose", ["diagnose", "{tmp}/garbage.jsonl"], "line 1 is not JSON: not a paracube metrics file"),
    ("diagnose", ["diagnose", "{tmp}/emptydir"], "holds 0 metrics files (*.jsonl): give one of them"),
    ("diagnose", ["diagnose", "{tmp}/before-ranks.jsonl"],
     "has no per-rank timings (written by an older paracube): re-run the job"),
    ("diagnose", ["diagnose", "{tmp}/nano-dp2.jsonl", "--baseline", "{tmp}/small-dp1.jsonl"],
     "trained another model (small, 4 layers) than"),
    ("diagnose", ["diagnose", "{tmp}/nano-dp2.jsonl", "--baseline", "{tmp}/nano-dp2.jsonl"],
     "ran on 2 ranks: give a one-rank run"),
    ("diagnose", ["diagnose", "{tmp}/nano-dp2.jsonl", "--plot", "{tmp}/p.pdf"], "the file must end in .png"),
    ("diagnose", ["diagnose", "{tmp}/nano-dp2.jsonl", "--trace", "/proc/t.json"], "--trace /proc/t.json: cannot write"),
    ("diagnose", ["diagnose", "{tmp}/nano-dp2.jsonl", "--trace", "{tmp}/t.json"], "recorded no step timeline"),
    ("diagnose", ["train", "--inject", "slow-disk=1"], "--inject slow-disk=1: unknown kind 'slow-disk'"),
    ("diagnose", ["train", "--dp", "2", "--inject", "slow-rank=5:2"], "rank 5 is outside the job's 2 ranks (0-1)"),
    ("diagnose", ["train", "--inject", "slow-rank=0:0"], "factor 0 must be in [1, 100]"),
    ("diagnose", ["train", "--inject", "slow-rank=0:-2"], "factor -2 must be in [1, 100]"),
    ("diagnose", ["train", "--inject", "slow-rank=x:2"], "'x' is not a rank R"),
    ("diagnose", ["train", "--inject", "data-delay=x"], "--inject data-delay=x: 'x' is not seconds"),
    ("diagnose", ["train", "--inject", "comm-delay=nan"], "'nan' is not seconds"),
    ("diagnose", ["train", "--inject", "comm-delay=1000"], "1000 s must be in [0, 60]"),
    ("diagnose", ["train", "--data-workers", "-1"], "--data-workers must be an integer in [0, 64], got -1"),
    ("diagnose", ["train", "--prefetch", "1000"], "--prefetch must be an integer in [0, 64], got 1000"),
    ("diagnose", ["train", "--straggler-threshold", "0"], "--straggler-threshold must be a finite number > 0"),
    ("diagnose", ["scale", "--points", "4,2"], "--points 4,2: give distinct positive sizes in ascending order"),
    ("diagnose", ["scale", "--points", "1,x"], "--points '1,x': give data-parallel sizes as N,N"),
    ("diagnose", ["scale", "--points", "0,2"], "--points 0,2: give distinct positive sizes"),
    ("diagnose", ["scale", "--dp", "2"], "--dp 2: scale sets the data-parallel size itself; give --points"),
    ("diagnose", ["scale", "--metrics", "{tmp}/m.jsonl"], "scale writes one file per point; give --runs-dir"),
    ("diagnose", ["scale", "--plot", "{tmp}/s.svg"], "--plot {tmp}/s.svg: the file must end in .png"),
    ("diagnose", ["scale", "--points", "1,2", "--tp", "3"], "attention heads (n_heads=4) is not divisible by --tp 3"),
    ("diagnose", ["train", "--profile", "x"], "--profile 'x': give a step N or steps A-B (3-5)"),
    ("diagnose", ["train", "--profile", "5-3"], "--profile 5-3: give steps A-B with 0 <= A <= B"),
    ("diagnose", ["train", "--profile", "0-40"], "--profile 0-40: at most 20 steps"),
    ("diagnose", ["train", "--steps", "5", "--profile", "5"], "--profile 5-5: the run has steps 0-4"),
    ("diagnose", ["train", "--steps", "5", "--profile", "1", "--profile-dir", "/proc/prof"],
     "--profile-dir /proc/prof/rank0-step0.json: cannot write in /proc"),
    # -- schedule --------------------------------------------------------------------
    ("schedule", ["schedule", "--pp", "0", "--microbatches", "4"], "--pp must be a positive integer, got 0"),
    ("schedule", ["schedule", "--pp", "4", "--microbatches", "2"],
     "1f1b needs at least as many micro-batches as stages"),
    ("schedule", ["schedule", "--pp", str(10**7), "--microbatches", str(10**7)], "stage passes per step"),
    ("schedule", [*SCHEDULE, "--chunks", "0"], "--chunks must be ≥ 1, got 0"),
    ("schedule", [*SCHEDULE, "--costs", "1,x"], "--costs '1,x': give F,B or F,I,W"),
    ("schedule", [*SCHEDULE, "--costs", "0,0"],
     "a forward (F=0) and a backward (I + W = 0) must each cost more than 0"),
    ("schedule", [*SCHEDULE, "--costs", "nan,1"],
     "give F,B or F,I,W as finite non-negative numbers"),
    ("schedule", [*SCHEDULE, "--costs", "1,inf"],
     "give F,B or F,I,W as finite non-negative numbers"),
    ("schedule", [*SCHEDULE, "--costs", "{tmp}/missing.jsonl"], "no such file"),
    ("schedule", [*SCHEDULE, "--costs", "{tmp}/"], "not a file"),
    ("schedule", [*SCHEDULE, "--costs", "{tmp}/garbage.jsonl"], "not a metrics file"),
    ("schedule", [*SCHEDULE, "--costs", "{tmp}/list.jsonl"], "no pipeline step"),
    ("schedule", [*SCHEDULE, "--out", "t.pdf"], "must be a .png or .svg file"),
    ("schedule", [*SCHEDULE, "--out", "/proc/t.png"], "--out /proc/t.png: cannot write"),
    ("schedule", [*SCHEDULE, "--schedule", "magic"], "unknown schedule 'magic'"),
    # -- plan ------------------------------------------------------------------------
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8"], "--global-batch is required"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--gpu", "calibrated"],
     "calibration file"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", str(10**30), "--global-batch", "8"],
     "is more than 1,048,576"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "16", "--inter", "4x"],
     "unknown interconnect '4x': choose one of"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "16", "--inter", "0x100"],
     "or a node's ports × Gb/s each as PORTSxGBPS"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "16", "--intra", "4x100"],
     "PORTSxGBPS is a network between nodes: give it to --inter"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--gpus-per-node", "3", "--global-batch", "8"],
     "--gpus 8 is not a whole number of nodes of --gpus-per-node 3"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--zero", "7"],
     "unknown --zero 7: choose one of 0, 1, 2, 3"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--schedule", "foo"],
     "unknown --schedule 'foo'"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--recompute", "foo"],
     "unknown --recompute 'foo'"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--micro-batch", "0"],
     "--micro-batch must be a positive integer, got 0"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--chunks", "0"],
     "--chunks must be a positive integer, got 0"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "16", "--layout", "dp=1,tp=16,pp=1"],
     "--layout tp=16 is larger than a node (8 GPUs)"),
    # a mixed cluster that plans, but not with the layout fixed: the layout is named
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16xv100,1xh200", "--global-batch", "128",
              "--layout", "pp=2"],
     "fits no plan on 16 × V100 SXM2 32GB + 1 × H200 SXM with --layout pp=2"),
    # a batch too small to give every GPU of a mixed cluster work: the larger one that plans
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8xa100-40gb,1xa100-80gb", "--global-batch", "8"],
     "too little work to share over 9 GPUs by speed"),
    # a batch that splits into no whole micro-batches over a mixed cluster: the nearest that does
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "1xh200,24xh800", "--global-batch", "128",
              "--precision", "fp32"],
     "it does not split into whole micro-batches over 25 GPUs by speed"),
    # per-head q/k norms are RMSNorms, in a block of RMSNorms
    ("plan", ["plan", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq",
              "64", "--qk-norm", "--gpus", "1", "--global-batch", "1"],
     "qk_norm with norm='layernorm': the per-head q and k norms are RMSNorms"),
    ("plan", ["plan", "--layers", "4", "--hidden", "64", "--heads", "4", "--head-size", "0",
              "--vocab", "100", "--seq", "16", "--gpus", "1", "--global-batch", "1"],
     "--head-size must be a positive integer, got 0"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "1", "--global-batch", "8", "--layout", "tp=8"],
     "--layout tp=8 is more GPUs than --gpus 1: choose a tp that divides them"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--layout", "dp=x"],
     "write it as dp=N,tp=N,pp=N"),
    ("plan", ["plan", "--layers", "0", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq", "64",
              "--gpus", "8", "--global-batch", "8"], "--layers must be a positive integer, got 0"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--precision", "fp4"],
     "unknown --precision 'fp4'"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--precision", "fp8"],
     "--precision fp8: A100 80GB has no FP8 tensor cores (Hopper and later)"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "64",
              "--micro-batch", "3"],
     "--micro-batch 3 does not divide the per-rank batch (64 ÷ dp) (10 layouts)"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--gpu", "v100", "--global-batch", "8",
              "--precision", "bf16"],
     "--precision bf16: V100 SXM2 32GB has no bfloat16 tensor cores (Ampere and later); plan it in fp16"),
    # a model that fits no layout there: the precision is the first thing wrong, and said so
    ("plan", ["plan", "--model", "llama3-8b", "--gpus", "2", "--gpu", "v100", "--global-batch", "32",
              "--precision", "bf16"],
     "--precision bf16: V100 SXM2 32GB has no bfloat16 tensor cores (Ampere and later); plan it in fp16"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--fp8-scaling", "current"],
     "--fp8-scaling current under --precision bf16: nothing is FP8"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--gpu", "h100",
              "--precision", "fp8", "--fp8-scaling", "tensorwise"],
     "unknown --fp8-scaling 'tensorwise': choose one of delayed, current"),
    ("plan", ["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "8", "--elementwise", "unfused"],
     "unknown --elementwise 'unfused': choose one of fused, eager"),
    ("plan", ["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "8", "--elementwise", "eager",
              "--activations", "compiled"],
     "elementwise='eager' with activations='compiled': torch.compile fuses the blocks' element-wise ops"),
    ("plan", ["plan", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100", "--global-batch", "64",
              "--elementwise", "eager"],
     "eager element-wise traffic is counted for dense blocks"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--layers", "8"],
     "--layers with --model gpt3-1.3b: a model's shape is its own"),
    ("plan", ["plan", "--model", "resnet50", "--gpus", "8", "--global-batch", "8", "--seq", "8"],
     "--seq with --model resnet50: it is not a transformer and its shape is fixed"),
    ("plan", ["plan", "--model", "resnet50", "--gpus", "8", "--global-batch", "64", "--compress", "topk:0.01"],
     "compress='topk:0.01': resnet50 is described without layers"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--layout", "cp=3"],
     "--layout cp=3 does not divide --gpus 8"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--chunks", "1",
              "--schedule", "interleaved-1f1b"],
     "--chunks 1: interleaved-1f1b runs 2 or more chunks per stage"),
    ("plan", ["plan", "--model", "resnet50", "--gpus", "16", "--global-batch", "1000"],
     "--global-batch 1000 does not divide over --gpus 16: resnet50 is planned data parallel only "
     "(one replica per GPU); use 992 or 1008"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--epochs", "-1"],
     "--epochs must be positive, got -1"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--epochs", "2"],
     "--epochs 2: needs --train-samples N (samples per epoch)"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--train-tokens", "3x"],
     "argument --train-tokens: must be a positive token count such as 2e12, 300B or 15T, got '3x'"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--train-tokens", "0"],
     "argument --train-tokens: must be a positive token count such as 2e12, 300B or 15T, got '0'"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--train-tokens", "1T", "--epochs", "2"],
     "--train-tokens 1T with --epochs: give one training budget, tokens or epochs"),
    ("plan", ["plan", "--model", "resnet50", "--gpus", "8", "--global-batch", "256",
              "--train-tokens", "1T"],
     "--train-tokens 1T: resnet50 takes samples, not tokens; give its budget in --epochs"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--train-samples", "1000"],
     "--train-samples 1000 without --epochs"),
    ("plan", ["plan", "--model", "gpt3-175b", "--gpus", "24", "--global-batch", "64", "--layout", "tp=6"],
     "--layout tp=6 does not divide --gpus-per-node 8: some tensor-parallel groups would span two nodes"),
    ("plan", ["plan", "--model", "llama3-70b", "--gpus", "64", "--global-batch", "128", "--layout", "dp=3"],
     "--layout dp=3 does not divide --gpus 64: choose degrees whose product does"),
    ("plan", ["plan", "--model", "llama3-70b", "--gpus", "64", "--global-batch", "128", "--layout", "tp=4,pp=5"],
     "--layout tp=4,pp=5 (product 20) does not divide --gpus 64"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--layout", "cp=2",
              "--emit", "torchrun"],
     "paracube train does not run context parallelism"),
    ("plan", ["plan", "--model", "mixtral-8x7b", "--seq", "4096", "--gpus", "64", "--global-batch", "256",
              "--layout", "dp=64,ep=3"],
     "--layout ep=3 does not divide dp=64: expert parallelism spreads the experts over data-parallel ranks"),
    ("plan", ["plan", "--model", "qwen3-235b-a22b", "--gpus", "256", "--global-batch", "2048",
              "--layout", "tp=4,pp=8,dp=8,ep=2,etp=1"],
     "--layout ep=2 × etp=1 is below tp=4: experts replicated across tensor-parallel ranks"),
    ("plan", ["plan", "--model", "qwen3-235b-a22b", "--gpus", "256", "--global-batch", "2048",
              "--layout", "tp=4,pp=8,dp=8,ep=8,etp=2"],
     "--layout etp=2 with tp=4: experts split over some of the tensor-parallel ranks"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--layout", "ep=2",
              "--emit", "torchrun"],
     "paracube train builds dense models and runs no expert parallelism"),
    ("plan", ["plan", "--model", "mixtral-8x7b", "--seq", "4096", "--gpus", "8xh100,8xa100-80gb",
              "--global-batch", "64"],
     "mixtral-8x7b is a mixture of experts on a mixed cluster: expert parallelism is not planned over device types"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--layout", "ep=2"],
     "--layout ep=2: expert parallelism spreads a mixture of experts, and gpt3-1.3b is dense"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--layout", "etp=1"],
     "--layout etp=1: expert parallelism spreads a mixture of experts, and gpt3-1.3b is dense"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--ep-dispatch", "deepep"],
     "--ep-dispatch deepep: how a mixture of experts dispatches its tokens, and gpt3-1.3b is dense"),
    ("plan", ["plan", "--model", "mixtral-8x7b", "--seq", "4096", "--gpus", "16", "--global-batch", "64",
              "--ep-dispatch", "flex"],
     "unknown --ep-dispatch 'flex': choose one of alltoall, deepep"),
    ("plan", ["plan", "--model", "mixtral-8x7b", "--seq", "4096", "--gpus", "16", "--global-batch", "64",
              "--router", "round-robin", "--emit", "megatron"],
     "--router round-robin with --emit megatron: Megatron-LM runs its router's top k"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--master-weights", "fp32"],
     "unknown --master-weights 'fp32': choose one of optimizer, parameters, none"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--master-weights", "none",
              "--emit", "megatron"],
     "--master-weights none with --emit megatron: Megatron-LM runs fp32 main weights in its optimizer"),
    ("plan", ["plan", "--model", "mixtral-8x7b", "--seq", "4096", "--gpus", "64", "--global-batch", "256",
              "--emit", "torchrun"],
     "--emit torchrun: mixtral-8x7b: experts=8 — a mixture of experts is planned (paracube "
     "plan), not trained: paracube train builds dense models; train a dense one"),
    ("plan", ["plan", "--layers", "2", "--hidden", "256", "--heads", "4", "--vocab", "512", "--seq", "128",
              "--experts", "8", "--gpus", "8", "--global-batch", "8"],
     "experts_per_token=0: each token goes to 1 to experts=8 of them"),
    ("plan", ["plan", "--layers", "2", "--hidden", "256", "--heads", "4", "--vocab", "512", "--seq", "128",
              "--shared-expert-ffn", "512", "--gpus", "8", "--global-batch", "8"],
     "shared_expert_ffn=512 without experts: shared experts sit beside a mixture's routed ones"),
    ("plan", ["plan", "--layers", "2", "--hidden", "256", "--heads", "4", "--vocab", "512", "--seq", "128",
              "--experts", "8", "--experts-per-token", "2", "--shared-expert-ffn", "-4", "--gpus", "8",
              "--global-batch", "8"],
     "shared_expert_ffn=-4: the shared experts' MLP width is a positive integer (0: none)"),
    ("plan", ["plan", "--layers", "2", "--hidden", "256", "--heads", "4", "--vocab", "512", "--seq", "128",
              "--first-dense-blocks", "1", "--gpus", "8", "--global-batch", "8"],
     "dense_layers without experts: dense blocks sit among a mixture's"),
    ("plan", ["plan", "--layers", "2", "--hidden", "256", "--heads", "4", "--vocab", "512", "--seq", "128",
              "--experts", "8", "--experts-per-token", "2", "--first-dense-blocks", "2", "--gpus", "8",
              "--global-batch", "8"],
     "dense_layers names all 2 blocks: that is a dense model; drop the experts instead"),
    ("plan", ["plan", "--layers", "2", "--hidden", "256", "--heads", "4", "--vocab", "512", "--seq", "128",
              "--experts", "8", "--experts-per-token", "2", "--first-dense-blocks", "-1", "--gpus", "8",
              "--global-batch", "8"],
     "--first-dense-blocks must be 0 or more (the first K blocks dense), got -1"),
    ("plan", ["plan", "--layers", "2", "--hidden", "256", "--heads", "4", "--vocab", "512", "--seq", "128",
              "--experts", "8", "--experts-per-token", "2", "--dense-ffn", "1024", "--gpus", "8",
              "--global-batch", "8"],
     "dense_ffn=1024 without dense_layers: name the dense blocks (--first-dense-blocks K for the first K)"),
    ("plan", ["plan", "--layers", "8", "--hidden", "1024", "--heads", "8", "--vocab", "1000", "--seq", "512",
              "--experts", "8", "--experts-per-token", "2", "--route-groups", "3", "--route-group-topk", "1",
              "--gpus", "8", "--global-batch", "8"],
     "route_groups=3, route_group_topk=1: group-limited routing takes a mixture's experts (8) in groups"),
    ("plan", ["plan", "--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "1000",
               "--seq", "1024", "--full-attention-every", "2", "--gpus", "8", "--global-batch", "8"],
     "full_attention_every=2 without a window or chunk: it names the blocks that keep full "
     "attention among local ones; give attention_window (--attention-window) or "
     "attention_chunk (--attention-chunk)"),
    ("plan", ["plan", "--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "1000",
              "--seq", "1024", "--attention-window", "128",
              "--attention-chunk", "256", "--gpus", "8", "--global-batch", "8"],
     "attention_window=128 with attention_chunk=256: a block attends over a sliding window or "
     "within its chunk; give one"),
    ("plan", ["plan", "--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "1000",
              "--seq", "1024", "--attention-window", "-4", "--gpus", "8", "--global-batch",
              "8"],
     "attention_window=-4: the sliding window (GPT-OSS: 128, Mistral 7B: 4096) is a positive "
     "number of tokens (0: full attention)"),
    ("plan", ["plan", "--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "1000",
              "--seq", "1024", "--attention-window", "128", "--full-attention-every",
              "1",
              "--gpus", "8", "--global-batch", "8"],
     "full_attention_every=1 keeps every block at full attention: drop the window instead"),
    ("plan", ["plan", "--model", "gemma3-1b", "--gpus", "8", "--gpu", "h100", "--global-batch", "64"],
     "gemma3-1b fits no layout on 8 × H100 SXM: the leanest (dp=2 tp=1 pp=4 b=1 m=32 1f1b zero2 "
     "recompute=full) needs 111.6 GB per GPU, 1.3× the 85 GB; use a loss computed in place "
     "(--loss fused, Megatron's and llm-foundry's; it fits as dp=8"),
    ("plan", ["plan", "--model", "gemma2-2b", "--seq", "2048", "--gpus", "8", "--gpu", "h100",
              "--global-batch", "64", "--emit", "torchrun"],
     "--emit torchrun: gemma2-2b: post_norms (four norms a block), attention_softcap=50, "
     "logit_softcap=30 (logit soft-capping) — planned (paracube plan), not trained: "
     "paracube's GPT builds none of them"),
    ("plan", ["plan", "--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "1000",
              "--seq", "1024", "--router-score", "sigmoid", "--gpus", "8", "--global-batch", "8"],
     "router_score, router_renorm, router_expert_bias and router_scale weigh a mixture's "
     "experts: give experts and experts_per_token"),
    ("plan", ["plan", "--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "1000",
              "--seq", "1024", "--qkv-bias", "--gpus", "8", "--global-batch", "8"],
     "qkv_bias=True with bias=True: bias already biases every linear, q, k and v among them; "
     "qkv_bias biases those three alone (Qwen2's): set bias=False (--no-bias)"),
    ("plan", ["plan", "--model", "hf:{tmp}/hf-qwen3-moe-scale", "--gpus", "8", "--global-batch",
              "8"],
     "qwen3_moe config: routed_scaling_factor None must be a positive number"),
    ("plan", ["plan", "--model", "hf:{tmp}/hf-llama-theta", "--gpus", "8", "--global-batch", "8",
              "--emit", "megatron"],
     "--emit megatron: hf:llama's rotary base 10000.5 is not a whole number, which Megatron's "
     "--rotary-base takes; plan it without --emit megatron"),
    ("plan", ["plan", "--model", "llama3-8b", "--gpus", "8", "--gpu", "a100-80gb", "--global-batch",
              "64", "--attention", "fused-v3"],
     "attention=fused-v3: FlashAttention-3 runs on Hopper GPUs (H100, H200, H800), not A100 80GB; "
     "use attention=fused (FlashAttention-2)"),
    ("plan", ["plan", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100", "--global-batch",
              "64", "--attention", "fused-v3", "--precision", "tf32"],
     "attention=fused-v3 with --precision tf32: FlashAttention-3 takes 16-bit (or FP8) operands; "
     "plan bf16, or attention=fused"),
    ("plan", ["plan", "--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "1000",
              "--seq", "1024", "--logit-softcap", "-30", "--gpus", "8", "--global-batch", "8"],
     "logit_softcap=-30.0: the soft cap c of c·tanh(x/c) is a positive number (Gemma 2: 50 on "
     "the attention scores, 30 on the logits; 0: none)"),
    ("plan", ["plan", "--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "1000",
              "--seq", "1024", "--attention-softcap", "50", "--gpus", "8", "--global-batch", "8",
              "--emit", "megatron"],
     "--emit megatron: custom's logit soft-capping (Gemma 2's) has no pretrain_gpt.py argument; "
     "plan it without --emit megatron"),
    ("plan", ["plan", "--model", "gpt-oss-20b", "--gpus", "8", "--gpu", "h100", "--global-batch", "8",
              "--layout", "cp=2"],
     "cp=2 with a sliding window of 128 tokens: context parallelism over local attention is not "
     "planned"),
    ("plan", ["plan", "--model", "llama4-scout", "--seq", "32768", "--gpus", "64", "--gpu", "h100",
              "--global-batch", "64", "--emit", "megatron"],
     "--emit megatron: llama4-scout's chunked attention (attention_chunk=8192) has no "
     "Megatron-Core argument paracube emits; plan it without --emit megatron, or at --seq 8192 "
     "or less, where one chunk is the whole sequence"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--pipeline-split", "uniform"],
     "unknown --pipeline-split 'uniform': choose one of engine, even, even-ends"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--recompute-modules", "router"],
     "--recompute-modules 'router': give distinct modules among core_attn, mla_up_proj, mlp, moe_act"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--recompute-modules", "mlp",
              "--recompute", "full"],
     "--recompute-modules with --recompute full: the modules are a selective recomputation's"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--moments", "fp8"],
     "unknown --moments 'fp8': choose one of fp32, bf16"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--moments", "bf16",
              "--master-weights", "none"],
     "moments='bf16' with master_weights='none' and optimizer_kernel='fused': bf16 moments are planned"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--pipeline-split", "Et|(t|*L"],
     "--pipeline-split 'Et|(t|*L': a '(' is not closed; write Megatron's layout"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--pipeline-split", "Et|tL"],
     "--pipeline-split 'Et|tL': the pipeline layout holds 2 blocks (t) and the model has 24"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--pipeline-split", "even",
              "--emit", "torchrun"],
     "paracube train cuts its stages by --balance"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "4xa100-80gb,4xv100", "--global-batch", "8",
              "--pipeline-split", "even"],
     "--pipeline-split even: a mixed cluster's stages are cut by each pool's speed"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "64", "--global-batch", "256",
              "--layout", "dp=2,tp=1,pp=32"],
     "pp=32 is more pipeline stages than the model's 24 layers"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--zero", "3",
              "--layout", "dp=4,tp=1,pp=2"],
     "--zero 3 with --pp > 1 is not supported"),
    # hybrid sharding's ZeRO-3 on one GPU: nothing to shard over, said so (it said nothing)
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "1", "--global-batch", "8",
              "--shard-group", "8"],
     "--zero 3 shards over data-parallel ranks: this layout has one (dp × cp = 1)"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--schedule", "interleaved-1f1b", "--layout", "dp=8,tp=1,pp=1"],
     "--schedule interleaved-1f1b needs a pipeline (pp > 1)"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--sequence-parallel", "--layout", "dp=8,tp=1,pp=1"],
     "--sequence-parallel needs tensor parallelism (tp > 1)"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--loss", "fused",
              "--emit", "torchrun"],
     "loss='fused': another stack's software"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--grad-accumulation", "fusion"],
     "unknown --grad-accumulation 'fusion': choose one of buffer, fused, bf16-optimizer, side-stream"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--grad-accumulation", "fused", "--emit", "torchrun"],
     "grad_accumulation='fused': another stack's software"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--stack", "deepspeed"],
     "unknown --stack 'deepspeed': choose one of paracube, megatron-core, nemo, megatron-bridge, "
     "megatron-lm-2021, fsdp, fsdp1, torchtitan, composer"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--param-gather", "chunked"],
     "unknown --param-gather 'chunked': choose one of flat, per-parameter"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--param-gather", "per-parameter", "--emit", "torchrun"],
     "param_gather='per-parameter': another stack's software"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--optimizer-kernel", "apex"],
     "unknown --optimizer-kernel 'apex': choose one of fused, multi-op"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--clip-scale", "always", "--emit", "torchrun"],
     "clip_scale='always': another stack's software"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--logit-metrics", "-1"],
     "--logit-metrics must be 0 or more (metrics computed over the logits), got -1"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--logit-metrics", "2", "--emit", "torchrun"],
     "logit_metrics=2: another stack's software"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--recompute-replay", "sometimes"],
     "unknown --recompute-replay 'sometimes': choose one of early-stop, whole"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--recompute", "full", "--recompute-replay", "whole", "--emit", "torchrun"],
     "recompute_replay='whole': another stack's software"),
    ("plan", ["plan", "--model", "resnet50", "--gpus", "8", "--global-batch", "64",
              "--logit-metrics", "2"],
     "resnet50 is described without layers"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--optimizer-kernel", "multi-op", "--offload", "optimizer"],
     "--optimizer-kernel multi-op with --offload optimizer: the offloaded step runs on the host"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--stack", "megatron-core", "--emit", "torchrun"],
     "--stack megatron-core with --emit torchrun: paracube train runs its own software"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--recompute", "op", "--emit", "torchrun"],
     "--recompute op with --emit torchrun: paracube train recomputes none, selective or full"),
    # --emit megatron: what Megatron-LM does not run, refused before the search
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--zero", "2", "--emit", "megatron"],
     "--zero 2 with --emit megatron: Megatron-LM runs ZeRO 0, 1 (its distributed optimizer) "
     "or 3 (torch FSDP2); drop one"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--stack", "nemo", "--emit", "megatron"],
     "--stack nemo with --emit megatron: the command is Megatron-LM's"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--precision", "tf32", "--emit", "megatron"],
     "--precision tf32 with --emit megatron: plan Megatron-LM in bf16, fp16, fp8 or fp32"),
    ("plan", ["plan", "--model", "resnet50", "--gpus", "8", "--global-batch", "256",
              "--emit", "megatron"],
     "--emit megatron with --model resnet50: Megatron-LM's pretrain_gpt.py trains transformers"),
    ("plan", [*MIXED, "--emit", "megatron"],
     "--emit megatron on a mixed cluster: Megatron-LM gives every rank the same share"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--recompute", "op", "--stack", "composer"],
     "--recompute op with --stack composer: it runs recompute none or full"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--recompute", "op", "--attention", "unfused"],
     "recompute=op keeps the fused attention kernel's output"),
    ("plan", ["plan", "--model", "gpt3-13b", "--gpus", "64", "--global-batch", "512",
              "--stack", "megatron-core", "--schedule", "zb-h1"],
     "--schedule zb-h1 with --stack megatron-core: it runs schedule 1f1b or interleaved-1f1b"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "64",
              "--stack", "composer", "--layout", "tp=2"],
     "--layout tp=2 with --stack composer: it runs tp 1"),
    ("plan", [*MIXED, "--stack", "megatron-core"],
     "--stack megatron-core (Megatron's even pipeline split): a mixed cluster's stages are cut "
     "by each pool's speed"),
    ("plan", ["plan", "--model", "resnet50", "--gpus", "8", "--global-batch", "256",
              "--stack", "megatron-core"],
     "--stack megatron-core with --model resnet50: it is described without layers"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--zero", "3",
              "--compress", "powersgd:4"],
     "--compress powersgd with --zero 3 is not supported"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--schedule", "1f1b",
              "--chunks", "2"],
     "--chunks 2 needs an interleaved schedule, not 1f1b"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--loss", "xent"],
     "unknown --loss 'xent': choose one of torch, fused"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--recompute-blocks", "99"],
     "--recompute-blocks 99 is more than the model's 24 blocks"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--recompute-blocks", "3", "--recompute", "selective"],
     "--recompute-blocks with --recompute selective"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8",
              "--norm", "rmsnorm"],
     "--norm with --model gpt3-1.3b: a model's shape is its own"),
    ("plan", ["plan", "--layers", "4", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq", "64",
              "--gpus", "8", "--global-batch", "8", "--activation", "relu"],
     "unknown activation 'relu': choose one of gelu, swiglu"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--offload", "disk"],
     "unknown --offload 'disk'"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--compress", "topk:2"],
     "--compress topk:2: RATIO must be a number in (0, 1]"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--grad-reduce", "int8"],
     "unknown --grad-reduce 'int8'"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "8", "--precision", "tf32",
              "--grad-reduce", "compute"],
     "--grad-reduce compute is for --precision bf16 or fp16"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--shard-group", "8", "--zero", "2"],
     "--shard-group 8 with --zero 2: hybrid sharding shards ZeRO-3's states or ZeRO-1's"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--param-sync", "scatter"],
     "unknown --param-sync 'scatter': choose one of all-gather, broadcast"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--param-sync", "broadcast", "--zero", "3"],
     "--param-sync broadcast with --zero 3: the parameter sync after the step is ZeRO-1/2's"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--param-sync", "broadcast", "--emit", "torchrun"],
     "param_sync='broadcast'"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--grad-bucket", "25MiB"],
     "unknown --grad-bucket '25MiB': choose one of ddp, megatron, internlm"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--grad-bucket", "megatron", "--emit", "torchrun"],
     "grad_bucket='megatron': another stack's software"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--grad-bucket", "ddp", "--emit", "megatron"],
     "--grad-bucket ddp with --emit megatron: Megatron-LM runs its own buckets"),
    ("plan", ["plan", "--model", "resnet50", "--gpus", "8", "--global-batch", "192",
              "--micro-batch", "5"],
     "--micro-batch 5 does not divide the 24 samples per GPU (192 ÷ 8)"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--grad-sync", "scatter"],
     "unknown --grad-sync 'scatter': choose one of all-reduce, reduce-scatter"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--grad-sync", "reduce-scatter", "--zero", "3"],
     "--grad-sync reduce-scatter with --zero 3: the choice is ZeRO-1's"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--grad-sync", "reduce-scatter", "--zero", "1", "--shard-group", "8"],
     "grad_sync='reduce-scatter' with shard=8"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--grad-sync", "reduce-scatter", "--emit", "torchrun"],
     "grad_sync='reduce-scatter'"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--zero3-pipeline", "sometimes"],
     "unknown --zero3-pipeline 'sometimes': choose one of none, per-step"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--zero3-pipeline", "per-step", "--zero", "1"],
     "--zero3-pipeline per-step with --zero 1: it is how ZeRO-3 runs under a pipeline"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--zero3-pipeline", "per-step", "--zero", "3", "--layout", "dp=4,tp=2,pp=2",
              "--shard-group", "2"],
     "hybrid sharding under a pipeline is not planned"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--zero3-pipeline", "per-step", "--emit", "torchrun"],
     "zero3_pipeline='per-step'"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--shard-group", "0"],
     "--shard-group must be a positive integer, got 0"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--layout", "dp=8,tp=2", "--shard-group", "3"],
     "--shard-group 3 does not divide the data-parallel group of --layout (dp × cp = 8)"),
    ("plan", ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
              "--shard-group", "8", "--emit", "torchrun"],
     "--shard-group 8 with --emit torchrun: paracube train shards ZeRO over the whole"),
    # -- plan on a mixed cluster ----------------------------------------------------------
    ("plan", [*MIXED[:4], "8xa100-80gb,8xtpu9", *MIXED[5:]], "unknown device type 'tpu9'"),
    ("plan", [*MIXED[:4], "8a100,8xv100", *MIXED[5:]], "'8a100' is not COUNTxTYPE"),
    ("plan", [*MIXED[:4], "8xa100-80gb,12xv100", *MIXED[5:]],
     "12xv100 is not whole nodes of --gpus-per-node 8"),
    ("plan", [*MIXED[:4], "8xv100", *MIXED[5:]], "one device type is not a mixed cluster"),
    ("plan", [*MIXED[:4], "8xv100,8xV100", *MIXED[5:]], "v100 is listed twice"),
    ("plan", [*MIXED[:4], "8xa100-80gb,4xv100", *MIXED[5:], "--layout", "tp=8"],
     "tp=8 cannot stay within one device type"),
    ("plan", [*MIXED, "--model", "resnet50"], "mixed clusters are planned for transformer models"),
    ("plan", [*MIXED, "--shard-group", "8"],
     "--shard-group 8: hybrid sharding is planned on one device type"),
]  # fmt: skip


def prepare(tmp: Path) -> None:
    """The files the cases name under ``{tmp}``."""
    (tmp / "empty.txt").write_text("")
    (tmp / "short.txt").write_text("too short")
    (tmp / "utf16.txt").write_bytes("hello world, in UTF-16\n".encode("utf-16"))
    (tmp / "blob.bin").write_bytes(b"\x7fELF\0\0\0" + os.urandom(64))
    (tmp / "binaries").mkdir()
    for name in ("a.so", "b.o"):
        (tmp / "binaries" / name).write_bytes(b"\0\1\2\3" * 64)
    _tokens(tmp / "tokens-corrupt", 400, 40)
    (tmp / "tokens-corrupt" / "index.json").write_text("{not json")
    _tokens(tmp / "tokens-truncated", 400, 40)
    (tmp / "tokens-truncated" / "train.bin").write_bytes(b"\0" * 10)
    _tokens(tmp / "tokens-short", 400, 40)
    (tmp / "old.jsonl").write_text('{"step": 0}\n')
    (tmp / "garbage.jsonl").write_text("this is {not json\n")
    (tmp / "list.jsonl").write_text("[1, 2, 3]\n")
    (tmp / "calibration.json").write_text('{"matmul_flops_per_thread": "fast"}')
    (tmp / "emptydir").mkdir()
    (tmp / ".step-00000002.partial").mkdir()
    _checkpoint(tmp / "other-model", {"embed.tok.weight": (10, 4)}, step=1)
    _checkpoint(tmp / "corrupt", {}, step=1)
    (tmp / "corrupt" / ".metadata").write_bytes(b"not a pickle")
    from paracube.models.gpt import GPT
    from paracube.models.presets import preset

    shapes = {n: tuple(p.shape) for n, p in GPT(preset("nano")).named_parameters()}
    _checkpoint(tmp / "nano-step-5", shapes, step=5)
    odd = dict(n_layers=1, hidden=8, n_heads=2, vocab_size=16, seq_len=8, norm="layernorm",
               activation="swiglu", position="rope")  # fmt: skip
    _checkpoint(tmp / "odd-shape", {"embed.tok.weight": (16, 8)}, step=1, model=odd)
    (tmp / "w.safetensors").write_bytes(b"")
    _hf_models(tmp)
    step = {"step": 0, "step_time": 0.1, "tokens_per_s": 1000.0}
    (tmp / "before-ranks.jsonl").write_text(json.dumps(step) + "\n")
    for name, model, layers, world in (("nano-dp2", "nano", 2, 2), ("small-dp1", "small", 4, 1)):
        ranks = {"step_time": [0.1] * world, "compute": [0.08] * world}
        run = {"model": {"name": model, "n_layers": layers}, "micro_batch": 4}
        (tmp / f"{name}.jsonl").write_text(json.dumps({**step, "ranks": ranks, "run": run}) + "\n")


def _hf_models(tmp: Path) -> None:
    """The shipped tiny Llama config; a BERT config; and the Llama's weights with one
    tensor of another shape."""
    import shutil

    import torch
    from safetensors.torch import save_file

    llama = Path(__file__).parent.parent / "examples" / "models" / "llama-tiny" / "config.json"
    for name in ("hf-llama", "hf-bad-weights"):
        (tmp / name).mkdir()
        shutil.copy(llama, tmp / name / "config.json")
    (tmp / "hf-lost-shard").mkdir()  # an index whose second shard was not copied
    shutil.copy(llama, tmp / "hf-lost-shard" / "config.json")
    shards = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
              "lm_head.weight": "model-00002-of-00002.safetensors"}  # fmt: skip
    (tmp / "hf-lost-shard" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": shards})
    )
    (tmp / "hf-lost-shard" / "model-00001-of-00002.safetensors").write_bytes(b"")
    (tmp / "hf-partial-stretch").mkdir()
    (tmp / "hf-partial-stretch" / "config.json").write_text(
        '{"model_type": "llama", "rope_parameters": {"rope_type": "llama3", "factor": 8.0}}'
    )
    (tmp / "hf-yarn").mkdir()
    (tmp / "hf-yarn" / "config.json").write_text(
        '{"model_type": "llama", "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}'
    )
    qwen3_moe = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                 "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
                 "vocab_size": 256, "max_position_embeddings": 128}  # fmt: skip
    for name, dense in (("hf-qwen3-moe", []), ("hf-qwen3-moe-all-dense", [0, 1])):
        (tmp / name).mkdir()
        (tmp / name / "config.json").write_text(json.dumps({**qwen3_moe, "mlp_only_layers": dense}))
    for kind in ("gemma", "gpt-oss"):  # refused by their model type, before any weight
        (tmp / f"hf-{kind}").mkdir()
        (tmp / f"hf-{kind}" / "config.json").write_text(
            json.dumps({"model_type": kind.replace("-", "_")})
        )
    (tmp / "hf-qwen3-biased").mkdir()  # q, k, v and o biased (attention_bias), the MLP not
    (tmp / "hf-qwen3-biased" / "config.json").write_text(
        '{"model_type": "qwen3", "attention_bias": true}'
    )
    small = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
             "max_position_embeddings": 128}  # fmt: skip
    for name, config in (
        ("hf-mistral-window", {"model_type": "mistral", "sliding_window": 32, **small}),
        ("hf-gemma3-relu", {"model_type": "gemma3_text", "hidden_activation": "relu", **small}),
        ("hf-llama4-step0", {"model_type": "llama4_text", "interleave_moe_layer_step": 0, **small}),
        ("hf-gemma2-cap0", {"model_type": "gemma2", "final_logit_softcapping": 0, **small}),
        ("hf-gemma2-short", {"model_type": "gemma2", "sliding_window": 128, **small}),
        ("hf-llama-theta", {"model_type": "llama", "rope_theta": 10000.5, **small}),
        ("hf-qwen3-moe-scale", {**qwen3_moe, "routed_scaling_factor": None}),
    ):
        (tmp / name).mkdir()
        (tmp / name / "config.json").write_text(json.dumps(config))
    (tmp / "hf-gpt-neox").mkdir()
    (tmp / "hf-gpt-neox" / "config.json").write_text('{"model_type": "gpt_neox"}')
    (tmp / "hf-gpt-oss-irregular").mkdir()
    irregular = ["sliding_attention", "full_attention", "full_attention", "sliding_attention"]
    (tmp / "hf-gpt-oss-irregular" / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gpt_oss",
                "num_hidden_layers": 4,
                "sliding_window": 128,
                "layer_types": irregular,
                "max_position_embeddings": 4096,
            }
        )
    )
    (tmp / "hf-deepseek-v3").mkdir()
    (tmp / "hf-deepseek-v3" / "config.json").write_text('{"model_type": "deepseek_v3"}')
    (tmp / "hf-bert").mkdir()
    (tmp / "hf-bert" / "config.json").write_text('{"model_type": "bert", "hidden_size": 64}')
    from transformers import AutoModelForCausalLM

    from paracube.models.hf import hf_config_object

    hf = AutoModelForCausalLM.from_config(hf_config_object(str(tmp / "hf-llama")))
    state = {n: p.detach().clone() for n, p in hf.named_parameters()}
    state["model.layers.1.mlp.up_proj.weight"] = torch.zeros(8, 64)
    save_file(state, str(tmp / "hf-bad-weights" / "model.safetensors"))


def _tokens(path: Path, train: int, val: int) -> None:
    """A tokenized dataset of ``train`` and ``val`` uint16 tokens (vocabulary 300)."""
    path.mkdir()
    index = {"format": "paracube-tokens", "version": 1, "dtype": "uint16", "vocab_size": 300,
             "eot_id": 0, "splits": {"train": {"tokens": train}, "val": {"tokens": val}}}  # fmt: skip
    (path / "index.json").write_text(json.dumps(index))
    (path / "train.bin").write_bytes(b"\1\0" * train)
    (path / "val.bin").write_bytes(b"\1\0" * val)


def _checkpoint(path: Path, shapes: dict, step: int, model: dict | None = None) -> None:
    """A DCP checkpoint of zero tensors of ``shapes`` at ``step`` (no process group needed),
    naming ``model`` (ModelConfig's fields) where given."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    state = {f"model/{n}": torch.zeros(s) for n, s in shapes.items()} or {"x": torch.zeros(1)}
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": yes
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(path), no_dist=True)
    (path / "paracube.json").write_text(
        json.dumps({"step": step, **({"model": model} if model else {})})
    )


def argv_for(argv: list[str], tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) for a in argv]
