"""``paracube plan --emit megatron``: a planned layout as the Megatron-LM command that runs
it, every planned choice carried into its flags, and what Megatron-LM does not run refused."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from paracube.cli import main
from paracube.errors import ConfigError
from paracube.models.presets import preset
from paracube.planner.layout import Layout
from paracube.planner.megatron import megatron_args, megatron_refusal, model_refusal
from paracube.planner.stacks import stack

# Megatron-LM's flags the emitter writes, as megatron/training/arguments.py names them
# (checked against the file: _add_network_size_args, _add_distributed_args, _add_training_args,
# _add_mixed_precision_args, _add_transformer_engine_args, _add_moe_args, _add_data_args)
MEGATRON_FLAGS = {
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
    "--seq-length", "--max-position-embeddings", "--group-query-attention",
    "--num-query-groups", "--swiglu", "--normalization", "--position-embedding-type",
    "--kv-channels", "--qk-layernorm",
    "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--add-qkv-bias",
    "--num-experts",
    "--moe-router-topk", "--moe-token-dispatcher-type", "--attention-dropout",
    "--hidden-dropout", "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
    "--context-parallel-size", "--expert-model-parallel-size",
    "--num-virtual-stages-per-pipeline-rank", "--pipeline-model-parallel-layout",
    "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split", "--sequence-parallel", "--micro-batch-size",
    "--global-batch-size", "--use-distributed-optimizer", "--use-torch-fsdp2",
    "--overlap-grad-reduce", "--overlap-param-gather", "--optimizer-cpu-offload",
    "--use-precision-aware-optimizer", "--exp-avg-dtype", "--exp-avg-sq-dtype",
    "--tp-comm-overlap", "--recompute-granularity",
    "--recompute-method", "--recompute-num-layers", "--attention-backend", "--bf16", "--fp16",
    "--accumulate-allreduce-grads-in-fp32", "--fp8-format", "--fp8-recipe", "--mock-data",
    "--tokenizer-type", "--vocab-size", "--norm-epsilon", "--rotary-base", "--rope-type",
    "--use-rope-scaling", "--rope-scaling-factor", "--rotary-seq-len-interpolation-factor",
    "--moe-router-score-function", "--moe-router-pre-softmax", "--moe-router-enable-expert-bias",
    "--moe-router-topk-scaling-factor",
}  # fmt: skip


def parsed(args: list[str]) -> dict[str, str | bool]:
    """Megatron-LM's flags as a mapping: a flag to its value, or True when it takes none."""
    words = " ".join(args).split()
    flags: dict[str, str | bool] = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            value = (
                words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else True
            )
            flags[word] = value
    return flags


def layout(**fields) -> Layout:
    return Layout(**{**stack("megatron-core"), **fields})


def test_every_planned_choice_becomes_its_megatron_flag():
    """Llama 3 70B at TP 4 × PP 4 × CP 2 × VP 5 with the distributed optimizer, FP8 with
    current scaling, its embedding and loss counted in the split: each choice in the flags."""
    cfg = preset("llama3-70b")
    L = layout(dp=4, tp=4, pp=4, cp=2, micro_batch=1, microbatches=16, schedule="interleaved-1f1b",
               chunks=5, zero=1, sequence_parallel=True, split="even-ends", tp_comm_overlap=True,
               fp8_scaling="current")  # fmt: skip
    flags = parsed(megatron_args(L, cfg, "fp8", global_batch=64))
    assert set(flags) <= MEGATRON_FLAGS, set(flags) - MEGATRON_FLAGS
    expected = {
        "--num-layers": str(cfg.n_layers), "--hidden-size": str(cfg.hidden),
        "--ffn-hidden-size": str(cfg.ffn_hidden), "--num-attention-heads": str(cfg.n_heads),
        "--num-query-groups": str(cfg.n_kv_heads), "--seq-length": str(cfg.seq_len),
        "--vocab-size": str(cfg.vocab_size - 1),  # NullTokenizer adds its end-of-document id
        "--tensor-model-parallel-size": "4",
        "--pipeline-model-parallel-size": "4", "--context-parallel-size": "2",
        "--num-virtual-stages-per-pipeline-rank": "5", "--micro-batch-size": "1",
        "--global-batch-size": "64", "--fp8-recipe": "tensorwise", "--normalization": "RMSNorm",
        "--position-embedding-type": "rope",
    }  # fmt: skip
    assert {k: flags.get(k) for k in expected} == expected
    for flag in ("--swiglu", "--group-query-attention", "--sequence-parallel", "--bf16",
                 "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                 "--tp-comm-overlap", "--account-for-embedding-in-pipeline-split",
                 "--account-for-loss-in-pipeline-split", "--untie-embeddings-and-output-weights",
                 "--disable-bias-linear"):  # fmt: skip
        assert flags.get(flag) is True, flag
    assert "--recompute-granularity" not in flags  # nothing recomputed as planned


@pytest.mark.parametrize(
    ("fields", "flags"),
    [
        ({"recompute": "selective"}, {"--recompute-granularity": "selective"}),
        ({"recompute": "full"}, {"--recompute-granularity": "full", "--recompute-method": "uniform",
                                 "--recompute-num-layers": "1"}),
        ({"recompute": "full", "recompute_blocks": 5}, {"--recompute-method": "block",
                                                        "--recompute-num-layers": "5"}),
        ({"zero": 3}, {"--use-torch-fsdp2": True}),
        ({"zero": 1, "offload": True}, {"--optimizer-cpu-offload": True,
                                        "--use-precision-aware-optimizer": True}),
    ],
)  # fmt: skip
def test_recomputation_and_sharding_flags(fields, flags):
    """One stage (pp 1): the model's first N blocks are Megatron-LM's block method's N."""
    L = layout(dp=8, micro_batch=2, microbatches=4, **fields)
    got = parsed(megatron_args(L, preset("gpt3-1.3b"), "bf16", global_batch=64))
    assert {k: got.get(k) for k in flags} == flags
    if fields.get("zero") == 3:
        assert "--use-distributed-optimizer" not in got and "--overlap-grad-reduce" not in got


@pytest.mark.parametrize(
    ("fields", "precision", "reason"),
    [
        ({"zero": 2}, "bf16", "zero 2: Megatron-LM runs ZeRO 0, 1"),
        ({"pp": 2, "microbatches": 4, "recompute": "full", "recompute_blocks": 3,
          "recompute_scope": "model"}, "bf16",
         "Megatron-LM's --recompute-method block recomputes the first N of every stage's"),
        ({"pp": 2, "microbatches": 4, "schedule": "gpipe"}, "bf16", "schedule gpipe: Megatron-LM runs 1F1B"),
        ({"pp": 2, "microbatches": 4, "split": "engine"}, "bf16", "split engine: Megatron-LM runs even stages"),
        ({"recompute": "op"}, "bf16", "recompute op: Megatron-LM runs whole blocks"),
        ({"grad_reduce": "compute"}, "bf16", "Megatron-LM reduces bf16 gradients in fp32"),
        ({"attention": "fused-triton"}, "bf16", "attention fused-triton: Megatron-LM runs"),
        ({"offload": True}, "bf16", "the optimizer offloaded under ZeRO-0"),
    ],
)  # fmt: skip
def test_what_megatron_does_not_run_is_refused_with_the_reason(fields, precision, reason):
    L = layout(**{"dp": 2, "micro_batch": 1, "microbatches": 2, **fields})
    refusal = megatron_refusal(L, preset("gpt3-1.3b"), precision)
    assert refusal is not None and reason in refusal, refusal
    with pytest.raises(Exception, match="--emit megatron"):
        megatron_args(L, preset("gpt3-1.3b"), precision, global_batch=8)
    # the same layout with Megatron-Core's choice in place of the refused one is emitted
    runs = {
        "zero": 1,
        "recompute_blocks": None,
        "schedule": "1f1b",
        "split": "even",
        "recompute": "none",
        "grad_reduce": "fp32",
        "attention": "fused",
        "offload": False,
    }
    plain = replace(L, **{k: runs[k] for k in fields if k in runs})
    assert megatron_refusal(plain, preset("gpt3-1.3b"), precision) is None


def test_the_cli_plans_as_megatron_runs_and_prints_its_command(capsys):
    """--emit megatron plans with Megatron-Core's software (the header says so) and prints
    the torchrun command of the best layout: its nodes, and its layout's sizes."""
    argv = ["plan", "--model", "gpt3-13b", "--gpus", "32", "--global-batch", "256", "--top", "1"]
    assert main([*argv, "--emit", "megatron"]) == 0
    out = capsys.readouterr().out
    assert "as megatron-core runs it" in out
    row = next(line for line in out.splitlines() if line.startswith("| 1 |"))
    tp, pp = (int(x) for x in re.search(r"tp=(\d+) pp=(\d+)", row).groups())
    command = out.strip().splitlines()[-1]
    assert command.startswith("torchrun --nnodes 4 --nproc-per-node 8 ")
    assert " pretrain_gpt.py " in command
    flags = parsed(command.split(" pretrain_gpt.py ", 1)[1].split())
    assert flags["--tensor-model-parallel-size"] == str(tp)
    assert flags["--pipeline-model-parallel-size"] == str(pp)
    assert set(flags) <= MEGATRON_FLAGS


def test_when_megatron_cannot_run_the_best_the_command_runs_the_next_it_can(capsys, monkeypatch):
    """Where Megatron-LM cannot run the first-ranked layout as planned (here made so: the
    refusal stubbed for that one layout), the command runs the fastest it can, and the line
    before it says which, why, and what it costs; where it runs none, the plan is refused."""
    from paracube.planner import megatron

    argv = ["plan", "--model", "gpt3-13b", "--gpus", "32", "--global-batch", "256", "--top", "1",
            "--emit", "megatron"]  # fmt: skip
    assert main([*argv, "--json"]) == 0  # the ranking, without the command
    first = capsys.readouterr().out
    real = megatron.megatron_refusal
    best = __import__("json").loads(first)["candidates"][0]["layout"]

    def refusal(layout, cfg, precision):
        # JSON holds a tuple field (recompute_modules) as a list
        if all(
            getattr(layout, k) == (tuple(v) if isinstance(v, list) else v) for k, v in best.items()
        ):
            return "a refusal for the test"
        return real(layout, cfg, precision)

    monkeypatch.setattr(megatron, "megatron_refusal", refusal)
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    note, command = lines[-2], lines[-1]
    found = re.search(
        r"Megatron-LM does not run #1 .* — a refusal for the test; the command runs #(\d+) "
        r".*, ([\d.]+)% slower:$", note
    )  # fmt: skip
    assert found, note
    assert int(found.group(1)) == 2 and float(found.group(2)) >= 0
    assert command.startswith("torchrun ")
    monkeypatch.setattr(megatron, "megatron_refusal", lambda *a: "none runs")
    assert main(argv) == 2
    assert "--emit megatron: none of the" in capsys.readouterr().err


def test_megatrons_partial_recomputation_is_each_chunks_first_blocks():
    """Megatron's --recompute-method block recomputes the first N layers of every model chunk
    on every stage (recompute_scope="stage"); paracube's engine the model's first N. 32 blocks
    over 4 stages × 2 chunks (chunks of 4): N = 3 is 6 blocks on every rank against 3 on the
    first alone — the memory and the recomputation the planner charges follow the count."""
    from paracube.planner.layout_memory import stage_memory
    from paracube.planner.stages import layout_shares, recomputed_blocks

    cfg = preset("llama2-7b")  # 32 blocks
    base = dict(dp=1, pp=4, micro_batch=1, microbatches=8, schedule="interleaved-1f1b",
                chunks=2, recompute="full", recompute_blocks=3, split="even")  # fmt: skip
    stage = Layout(**base, recompute_scope="stage")
    model = Layout(**base)
    assert [recomputed_blocks(s, stage) for s in layout_shares(cfg, stage)] == [6, 6, 6, 6]
    assert [recomputed_blocks(s, model) for s in layout_shares(cfg, model)] == [3, 0, 0, 0]
    kept = Layout(**{**base, "recompute": "none", "recompute_blocks": None})
    saved = [
        a.activations - b.activations
        for a, b in zip(stage_memory(cfg, kept), stage_memory(cfg, stage), strict=True)
    ]
    assert all(s > 0 for s in saved)  # every stage keeps less, not only the first
    # the emitted command asks for it as Megatron runs it, under the pipeline
    flags = parsed(megatron_args(replace(stage, **stack("megatron-core")), cfg, "bf16", 8))
    assert (flags["--recompute-method"], flags["--recompute-num-layers"]) == ("block", "3")
    # and paracube train, which recomputes the model's first N, refuses it
    with pytest.raises(Exception, match="recompute_scope='stage'"):
        replace(stage, split="engine").to_args("bf16")


def test_a_qwen3_shape_states_its_head_size_and_qk_norms():
    """Heads of 128 over a hidden size of 5,120 (Qwen3-32B) and per-head q/k norms: the
    command says --kv-channels 128 (Megatron's default would be 5120 / 64 = 80) and
    --qk-layernorm; a coupled model says neither."""
    from paracube.config import ModelConfig

    qwen = ModelConfig(n_layers=64, hidden=5120, n_heads=64, n_kv_heads=8, head_size=128,
                       qk_norm=True, ffn_hidden=25600, vocab_size=151936, seq_len=4096,
                       norm="rmsnorm", activation="swiglu", position="rope", bias=False)  # fmt: skip
    L = layout(dp=8, tp=8, pp=1, micro_batch=1, microbatches=4, zero=1, sequence_parallel=True)
    flags = parsed(megatron_args(L, qwen, "bf16", global_batch=32))
    assert set(flags) <= MEGATRON_FLAGS
    assert flags["--kv-channels"] == "128" and "--qk-layernorm" in flags
    plain = parsed(megatron_args(L, qwen.replace(head_size=None, qk_norm=False), "bf16", 32))
    assert "--kv-channels" not in plain and "--qk-layernorm" not in plain


@pytest.mark.parametrize(
    ("changes", "wanted"),
    [
        ({"bias": True}, set()),  # every linear biased: Megatron's default
        ({}, {"--disable-bias-linear"}),
        ({"qkv_bias": True}, {"--disable-bias-linear", "--add-qkv-bias"}),  # Qwen2's
    ],
)
def test_the_command_biases_the_linears_the_model_biases(changes, wanted):
    """Megatron biases every linear unless told --disable-bias-linear, and q, k and v alone
    with --add-qkv-bias beside it (Qwen2's attention: the Qwen2.5 and Qwen2-MoE presets)."""
    cfg = preset("llama2-7b").replace(**changes)
    flags = parsed(megatron_args(layout(dp=8), cfg, "bf16", global_batch=64))
    assert {f for f in flags if "bias" in f} == wanted
    for name, L in (("qwen2-57b-a14b", layout(dp=16, ep=8)), ("qwen2.5-7b", layout(dp=8))):
        flags = parsed(megatron_args(L, preset(name), "bf16", 64))
        assert "--add-qkv-bias" in flags and "--disable-bias-linear" in flags, name


@pytest.mark.parametrize(
    ("name", "changes", "wanted"),
    [
        # Megatron's defaults (θ 10,000, ε 1e-5): no flag; learned positions: no rotary flag
        ("llama2-7b", {}, {}),
        ("gpt3-1.3b", {}, {}),
        ("llama3-8b", {}, {"--rotary-base": "500000"}),
        ("qwen3-30b-a3b", {}, {"--rotary-base": "1000000", "--norm-epsilon": "1e-06"}),
        # a latent attention takes YaRN unless told; DeepSeek-V3 trained at θ 10,000
        ("deepseek-v3", {}, {"--rope-type": "rope", "--norm-epsilon": "1e-06"}),
        ("llama3-8b", {"rope_scaling": "llama3", "rope_factor": 8.0},
         {"--rotary-base": "500000", "--use-rope-scaling": True, "--rope-scaling-factor": "8"}),
        ("llama2-7b", {"rope_scaling": "linear", "rope_factor": 4.0},
         {"--rotary-seq-len-interpolation-factor": "4"}),
    ],
)  # fmt: skip
def test_the_command_trains_the_planned_positions_and_norms(name, changes, wanted):
    """The rotary base, its stretch and the norms' epsilon reach Megatron-LM's flags where
    they differ from its defaults — else its command trains other positions (Llama 3's base
    500,000 at Megatron's 10,000) or norms than the planned model's."""
    cfg = preset(name).replace(**changes)
    flags = parsed(megatron_args(layout(dp=8), cfg, "bf16", global_batch=64))
    rope = {"--norm-epsilon", "--rotary-base", "--rope-type", "--use-rope-scaling",
            "--rope-scaling-factor", "--rotary-seq-len-interpolation-factor"}  # fmt: skip
    assert {k: v for k, v in flags.items() if k in rope} == wanted


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"rope_theta": 10000.5}, "rotary base 10000.5 is not a whole number"),
        ({"rope_scaling": "linear", "rope_factor": 2.5}, "linear rotary stretch by 2.5"),
        ({"rope_scaling": "llama3", "rope_factor": 8.0, "rope_original_context": 4096},
         "original context 4,096) is not the one Megatron-Core builds (1, 4, 8,192"),
    ],
)  # fmt: skip
def test_positions_megatron_cannot_state_are_refused(changes, reason):
    """A rotary base or stretch Megatron-LM's arguments cannot state is refused by name
    rather than emitted as another model."""
    cfg = preset("llama3-8b").replace(**changes)
    assert reason in model_refusal(cfg)
    with pytest.raises(ConfigError, match="--emit megatron"):
        megatron_args(layout(dp=8), cfg, "bf16", global_batch=64)


ROUTER_FLAGS = {"--moe-router-score-function", "--moe-router-pre-softmax",
                "--moe-router-enable-expert-bias", "--moe-router-topk-scaling-factor"}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "wanted"),
    [
        # DeepSeek-V3's and Kimi K2's config.json: sigmoid scores, the auxiliary-loss-free
        # bias, the k weights renormalised and scaled
        ({"scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
          "routed_scaling_factor": 2.5},
         {"--moe-router-score-function": "sigmoid", "--moe-router-enable-expert-bias": True,
          "--moe-router-topk-scaling-factor": "2.5"}),
        # DeepSeek-V2's: a softmax over every expert, its top k kept as scored
        ({"scoring_func": "softmax", "topk_method": "greedy", "norm_topk_prob": False,
          "routed_scaling_factor": 1.0},
         {"--moe-router-pre-softmax": True}),
        # the top k renormalised: Megatron's default, no flag
        ({"scoring_func": "softmax", "topk_method": "greedy", "norm_topk_prob": True,
          "routed_scaling_factor": 1.0}, {}),
    ],
)  # fmt: skip
def test_the_command_routes_as_the_config_does(config, wanted):
    """How a config's router weighs a token's experts reaches Megatron-LM's router flags —
    without them Megatron-Core would train DeepSeek-V3 with a softmax router and no expert
    bias."""
    from paracube.models.sources import hf_model_config

    base = {"model_type": "deepseek_v3", "hidden_size": 256, "intermediate_size": 512,
            "moe_intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 16,
            "num_experts_per_tok": 4, "first_k_dense_replace": 1, "q_lora_rank": 64,
            "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
            "v_head_dim": 32, "vocab_size": 1024}  # fmt: skip
    cfg = hf_model_config({**base, **config}, 256)
    flags = parsed(megatron_args(layout(dp=8, ep=8), cfg, "bf16", global_batch=64))
    assert {k: v for k, v in flags.items() if k in ROUTER_FLAGS} == wanted


def test_a_router_megatron_cannot_state_is_refused():
    """Sigmoid scores kept unrenormalised over k > 1 experts (Megatron-Core renormalises
    them) and an expert bias beside softmax scores (its TransformerConfig refuses it) are
    refused by name; Llama 4's one sigmoid-weighted expert is Megatron's own top-1."""
    cfg = preset("deepseek-v3")
    assert "keeps its 8 sigmoid scores unrenormalised" in model_refusal(
        cfg.replace(router_renorm=False)
    )
    assert "expert bias beside softmax scores" in model_refusal(cfg.replace(router_score="softmax"))
    llama4 = preset("llama4-scout")
    assert (llama4.router_score, llama4.router_renorm, llama4.experts_per_token) == (
        "sigmoid",
        False,
        1,
    )
    assert "router" not in model_refusal(llama4)  # refused for its chunked attention only


def test_a_custom_mixtures_router_flags_reach_the_command(capsys):
    """A custom shape's --router-score, --router-expert-bias, --router-scale and
    --router-keep-scores are the model's router, carried into Megatron-LM's flags; the
    default router asks for none."""
    shape = ["plan", "--layers", "8", "--hidden", "1024", "--heads", "8", "--vocab", "32000",
             "--seq", "2048", "--experts", "16", "--experts-per-token", "4", "--gpus", "8",
             "--gpu", "h100", "--global-batch", "64", "--top", "1", "--emit", "megatron"]  # fmt: skip

    def router(*extra: str) -> dict:
        assert main([*shape, *extra]) == 0
        command = capsys.readouterr().out.strip().splitlines()[-1]
        flags = parsed(command.split(" pretrain_gpt.py ", 1)[1].split())
        return {k: v for k, v in flags.items() if k in ROUTER_FLAGS}

    assert router() == {}
    assert router("--router-score", "sigmoid", "--router-expert-bias", "--router-scale", "2.5") == {
        "--moe-router-score-function": "sigmoid", "--moe-router-enable-expert-bias": True,
        "--moe-router-topk-scaling-factor": "2.5",
    }  # fmt: skip
    assert router("--router-keep-scores") == {"--moe-router-pre-softmax": True}
