"""The planner's formulas reproduce the published worked figures (pure math)."""

from __future__ import annotations

import pytest

from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models.presets import preset
from paracube.models.shapes import parameter_count
from paracube.pipeline.schedules import SCHEDULES
from paracube.planner.flops import (
    flops_with_full_recompute,
    model_flops,
    model_flops_per_token,
    narayanan_params,
    training_days,
)
from paracube.planner.hardware import gpu
from paracube.planner.memory import activation_bytes_per_layer, model_state_bytes


def test_zero_worked_example():
    """Rajbhandari et al. 2020: Ψ = 7.5B, N_d = 64 → 120 / 31.4 / 16.6 / 1.9 GB per device."""
    got = [model_state_bytes(7.5e9, stage, 64).total / 1e9 for stage in range(4)]
    assert [round(x, 1) for x in got] == [120.0, 31.4, 16.6, 1.9]


def test_zero_stages_shard_what_they_say():
    s = model_state_bytes(1e9, 2, 8, weight_bytes=4, grad_bytes=4, optimizer_bytes=8)
    assert (s.weights, s.gradients, s.optimizer) == (4e9, 4e9 / 8, 8e9 / 8)
    with pytest.raises(ConfigError, match="unknown ZeRO stage 4"):
        model_state_bytes(1e9, 4, 8)


def test_korthikanti_selective_recompute_saves_70_percent_for_gpt3():
    """Korthikanti et al. 2022: for GPT-3 175B (s 2048, h 12288, a 96, t 8) selective
    recompute cuts activation memory by ~70 %, and SP+selective is 34·s·b·h/t."""
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    tpsp = activation_bytes_per_layer(s, b, h, a, t=t, sequence_parallel=True)
    selective = activation_bytes_per_layer(
        s, b, h, a, t=t, sequence_parallel=True, recompute="selective"
    )
    assert selective == 34 * s * b * h / t
    assert 1 - selective / tpsp == pytest.approx(0.70, abs=0.01)
    assert activation_bytes_per_layer(s, b, h, a) == s * b * h * (34 + 5 * a * s / h)
    assert activation_bytes_per_layer(s, b, h, a, t=t) == s * b * h * (
        10 + 24 / t + 5 * a * s / (h * t)
    )
    assert activation_bytes_per_layer(s, b, h, a, recompute="full") == 2 * s * b * h


def test_in_flight_microbatches():
    assert SCHEDULES["gpipe"].in_flight(4, 16) == 16
    assert [SCHEDULES["1f1b"].in_flight(4, 16, stage=r) for r in range(4)] == [4, 3, 2, 1]
    assert SCHEDULES["interleaved-1f1b"].in_flight(4, 16, v=2) == pytest.approx(4 * (1 + 3 / 8))
    assert SCHEDULES["zb-h1"].in_flight(4, 16) == 4


def test_parameter_formula_against_gpt3_175b():
    """SC21 Eq. 2 with GPT-3's shape gives the published 175B; our exact count agrees."""
    assert narayanan_params(96, 12288, 50257, 2048) / 1e9 == pytest.approx(175, rel=0.005)
    assert parameter_count(preset("gpt3-175b", tie_embeddings=True)) == pytest.approx(
        narayanan_params(96, 12288, 50257, 2048), rel=1e-6
    )


def test_sc21_training_time_worked_example():
    """SC21 §5.7: GPT-3 175B on 300B tokens, 1024 A100s at 140 TFLOP/s → about 34 days."""
    assert training_days(300e9, 175e9, 1024, 140e12) == pytest.approx(34, abs=0.5)


def test_flops_formulas_relation():
    """Full recompute does 4/3 the model FLOPs' matmul work (an extra forward): 96 vs 72."""
    B, s, L, h, v = 1536, 2048, 96, 12288, 51200
    ratio = flops_with_full_recompute(B, s, L, h, v) / model_flops(B, s, L, h, v)
    assert ratio == pytest.approx(4 / 3, rel=0.01)


def test_gpu_catalog():
    assert gpu("A100-80GB").peak_flops == 312e12
    # memory as CUDA sees it: an "80GB" GPU holds 80 GiB less the driver's share, which our
    # H200 measured (its torch total_memory, benchmarks/results/gpu_h200/calibration.json)
    assert gpu("h200").memory_bytes == pytest.approx(150_109_880_320)
    assert 79 * 2**30 < gpu("a100-80gb").memory_bytes == gpu("h100").memory_bytes < 80 * 2**30
    with pytest.raises(ConfigError, match="unknown GPU 'tpu'"):
        gpu("tpu")


def test_layout_memory_answers_the_guides_questions():
    """'Memory runs out although the parameters fit': LLaMA-2 7B's bf16 weights (13.5 GB)
    fit an 80 GB A100, but weights + gradients + Adam states (16 bytes per parameter with
    bf16 gradients, 108 GB; 18 with the fp32 gradients paracube and Megatron reduce by
    default, 121 GB) do not; ZeRO-3 over 8 GPUs, or tp=4, makes it fit."""
    from paracube.planner.layout import Layout
    from paracube.planner.layout_memory import peak_memory

    cfg = preset("llama2-7b")
    a100 = gpu("a100-80gb").memory_bytes
    assert 2 * parameter_count(cfg) < a100
    alone = peak_memory(cfg, Layout(micro_batch=1, grad_reduce="compute"))
    assert alone.model_states == pytest.approx(16 * parameter_count(cfg), rel=0.01)
    assert alone.total > a100
    fp32_grads = peak_memory(cfg, Layout(micro_batch=1)).model_states
    assert fp32_grads == pytest.approx(18 * parameter_count(cfg), rel=0.01)
    assert peak_memory(cfg, Layout(dp=8, zero=3, micro_batch=1, recompute="selective")).total < a100
    assert peak_memory(cfg, Layout(tp=4, micro_batch=1, sequence_parallel=True)).total < a100


def test_layout_memory_pipeline_and_recompute():
    from paracube.planner.layout import Layout
    from paracube.planner.layout_memory import stage_memory

    cfg = preset("gpt3-13b")
    gpipe = Layout(pp=4, microbatches=16, micro_batch=1, schedule="gpipe")
    ofob = Layout(pp=4, microbatches=16, micro_batch=1, schedule="1f1b")
    first_g, first_1 = stage_memory(cfg, gpipe)[0], stage_memory(cfg, ofob)[0]
    assert first_g.activations > 3.5 * first_1.activations  # 16 vs 4 micro-batches in flight
    full = Layout(pp=4, microbatches=16, micro_batch=1, schedule="1f1b", recompute="full")
    assert stage_memory(cfg, full)[0].activations < 0.5 * first_1.activations
    last = stage_memory(cfg, ofob)[-1]
    assert last.stage == "last" and last.model_states > 0


def _a100_node(nodes_gpus=8):
    from paracube.planner.hardware import INTERCONNECTS
    from paracube.planner.time_model import Cluster

    return Cluster(gpu("a100-80gb"), nodes_gpus, INTERCONNECTS["nvlink3"], INTERCONNECTS["ib-hdr"])


def test_small_model_on_4_a100_scales_almost_linearly_with_data_parallel():
    """The guide's first scenario: a model under 3B on 4 × A100-80GB — data parallel,
    predicted speed-up above 3.6× at the same global batch."""
    from paracube.planner.layout import Layout
    from paracube.planner.time_model import estimate

    cfg, cluster = preset("gpt3-1.3b"), _a100_node(4)
    one = estimate(cfg, Layout(dp=1, micro_batch=4, microbatches=8), cluster)
    four = estimate(cfg, Layout(dp=4, micro_batch=4, microbatches=2), cluster)
    assert one.step_time / four.step_time > 3.6
    assert 0.3 < four.mfu <= four.mfu_ceiling < 1.0


def test_tensor_parallel_across_nodes_is_slower_than_within():
    from paracube.planner.layout import Layout
    from paracube.planner.time_model import estimate

    cfg = preset("gpt3-13b")
    inside = estimate(cfg, Layout(tp=8, micro_batch=1, microbatches=8), _a100_node(8))
    across = estimate(cfg, Layout(tp=8, micro_batch=1, microbatches=8), _a100_node(4))
    assert across.tp_comm > 5 * inside.tp_comm


def test_sequence_parallel_pays_the_links_gather_scatter_pair_ratio():
    """On NCCL an all-gather + reduce-scatter pair is the all-reduce (ratio 1): SP costs the
    layers' all-reduce time, plus the backward's two re-gathers of the inputs whose shards
    the attention's and the MLP's first linears keep — half a ring each, a quarter of the
    layers' four rings; on a link whose pair was measured slower, SP's TP time scales by it."""
    import dataclasses

    from paracube.planner.layout import Layout
    from paracube.planner.time_model import Cluster, estimate

    cfg, node = preset("gpt3-13b"), _a100_node(8)
    plain = estimate(cfg, Layout(tp=8, micro_batch=1, microbatches=8), node)
    sp = estimate(cfg, Layout(tp=8, micro_batch=1, microbatches=8, sequence_parallel=True), node)
    layer_part = plain.tp_comm - _extra(plain, cfg)
    assert 0 < layer_part < plain.tp_comm
    assert sp.tp_comm == pytest.approx(plain.tp_comm + layer_part / 4)
    slow = Cluster(
        node.gpu,
        node.gpus_per_node,
        dataclasses.replace(node.intra, pair_cost_ratio=2.5),
        node.inter,
    )
    plain_slow = estimate(cfg, Layout(tp=8, micro_batch=1, microbatches=8), slow)
    sp_slow = estimate(
        cfg, Layout(tp=8, micro_batch=1, microbatches=8, sequence_parallel=True), slow
    )
    assert plain_slow.tp_comm == pytest.approx(plain.tp_comm)
    # the layers' all-reduces became pairs (and re-gathers) at 2.5× the price; the
    # embedding/loss ones did not
    assert sp_slow.tp_comm - plain_slow.tp_comm == pytest.approx(
        (2.5 * 1.25 - 1) * layer_part, rel=1e-9
    )


def _extra(est, cfg):
    """tp_comm outside the layers (embedding, head input gradient, loss statistics)."""
    from paracube.planner.layout import Layout
    from paracube.planner.time_model import estimate

    one_layer = estimate(
        cfg.replace(n_layers=1), Layout(tp=8, micro_batch=1, microbatches=8), _a100_node(8)
    )
    two_layers = estimate(
        cfg.replace(n_layers=2), Layout(tp=8, micro_batch=1, microbatches=8), _a100_node(8)
    )
    per_layer = two_layers.tp_comm - one_layer.tp_comm
    return est.tp_comm - cfg.n_layers * per_layer


def test_pipeline_bubble_term_follows_the_schedule():
    from paracube.planner.layout import Layout
    from paracube.planner.time_model import estimate, layer_time, pass_costs

    cfg, cluster = preset("gpt3-13b"), _a100_node(8)
    base = dict(pp=4, micro_batch=1, microbatches=8)
    b1 = estimate(cfg, Layout(**base, schedule="1f1b"), cluster)
    bi = estimate(cfg, Layout(**base, schedule="interleaved-1f1b", chunks=2), cluster)
    zb = Layout(**base, schedule="zb-h1")
    bz = estimate(cfg, zb, cluster)
    assert b1.bubble / (b1.compute + b1.tp_comm) == pytest.approx(3 / 8)
    assert bi.bubble == pytest.approx(b1.bubble / 2)
    # ZB-H1's (p − 1)(F + I − W) against 1F1B's (p − 1)(F + I + W), at the block's own pass
    # costs: the weight-gradient matmuls are under half of the backward (it also runs the
    # attention core's and the element-wise backward), so more than the third equal costs
    # would give
    g = cluster.gpu
    fwd, bwd, _ = layer_time(cfg, zb, g)
    F, I, W = pass_costs(cfg, zb, g, 2, False, fwd, bwd, 0.0)
    assert W < I and bz.bubble == pytest.approx(b1.bubble * (F + I - W) / (F + I + W))
    assert 1 / 3 < bz.bubble / b1.bubble < 1 / 2


def test_interleaving_multiplies_the_stage_boundary_transfers_by_the_chunks():
    """SC21 §2.2.2: with v model chunks per rank each micro-batch crosses v times as many
    stage boundaries — "the amount of communication also increases by v"."""
    from paracube.planner.layout import Layout
    from paracube.planner.time_model import estimate

    cfg, cluster = preset("gpt3-13b"), _a100_node(8)
    base = dict(pp=4, micro_batch=1, microbatches=8)
    plain = estimate(cfg, Layout(**base, schedule="1f1b"), cluster)
    for v in (2, 5):
        inter = estimate(cfg, Layout(**base, schedule="interleaved-1f1b", chunks=v), cluster)
        assert plain.pp_comm > 0 and inter.pp_comm == pytest.approx(v * plain.pp_comm)


def test_predictions_track_published_megatron_runs():
    """Every Megatron-LM run of SC21 Table 1 and Korthikanti et al. Table 5 (18 runs, 1.7B to
    1T parameters, 8 to 3072 A100s; ``paracube.planner.published`` has the sources): the
    predicted TFLOP/s per GPU lands within ±15 % of the achieved figure. Nothing in the
    planner was set from these numbers; the run's software is described, not fitted."""
    from paracube.planner.published import evaluate, runs

    checked = [evaluate(r) for r in runs() if r["source"].startswith(("SC21", "Korthikanti"))]
    assert len(checked) == 18
    off = [(r["model"], r["source"], r["ratio"]) for r in checked if abs(r["ratio"] - 1) > 0.15]
    assert not off


def test_megatron_class_runs_stay_within_30_percent():
    """The runs of these sources of Megatron's software, DeepSpeed's pipeline engine and Meta's
    and NVIDIA's production stacks, A100 and H100 (Megatron-LM, MT-NLG, BLOOM, Megatron-Core's strong
    scaling on 96 and 4,608 H100s, Llama 3 405B, Nemotron-4 340B and 15B, NVIDIA's DGX Cloud
    benchmarking tables in BF16 and FP8 from 8 to 2,304 GPUs, Grok-1's mixture of experts
    among them, and the Zero Bubble paper's pipelines on Megatron-LM): none predicted beyond
    ±30 %, the bound the issue sets for every run, and the
    DGX Cloud tables' 70 dense runs at least nine in ten within ±15 %. (The FSDP-only stacks
    do not meet it yet, nor Megatron-Bridge's two Qwen3-30B-A3B rows: BENCHMARKS.md.)"""
    from paracube.planner.published import evaluate, runs

    sources = ("SC21", "Korthikanti", "MT-NLG", "BLOOM", "Llama 3", "Nemotron-4", "Megatron-Core")
    sources += ("DGX Cloud", "Zero Bubble")
    checked = [evaluate(r) for r in runs() if r["source"].startswith(sources)]
    assert {r["gpu"] for r in checked} == {"a100-80gb", "h100"} and len(checked) == 191
    assert all(abs(r["ratio"] - 1) <= 0.30 for r in checked), [r["ratio"] for r in checked]
    dense = ("DGX Cloud benchmarking (BF16)", "DGX Cloud benchmarking (FP8)")
    dgxc = [abs(r["ratio"] - 1) <= 0.15 for r in checked if r["source"] in dense]
    assert len(dgxc) == 70 and sum(dgxc) >= 63, sum(dgxc)


def test_four_in_five_published_runs_within_15_percent():
    """Across every published run paracube holds (627: Megatron-LM, MT-NLG, BLOOM, Llama 3,
    Nemotron-4 340B and 15B, Megatron-Core, llm-foundry's MPT tables, torchtitan, IBM's FMS
    FSDP, LLaMA, TinyLlama, OLMo-core, FlashAttention's GPT and the FlashAttention-2 paper,
    NeMo, NVIDIA's DGX Cloud benchmarking tables — Grok-1's mixture of experts among them —,
    Megatron-Bridge — the Qwen3 mixtures, DeepSeek-V3 and GPT-OSS among them —, NeMo AutoModel, Megatron-Core's MoE
    model zoo, InternLM, the Zero Bubble paper), predicted ÷ published lies within ±15 %
    for at least 80 % of
    them — the issue's bar. The FSDP-only A100 runs, as described (MPT's Triton
    FlashAttention), land within ±15 % in at least 90 % of cases.
    (The issue's second bar, none beyond ±30 %, is not met: BENCHMARKS.md lists them.)"""
    from paracube.planner.published import evaluate, runs

    checked = [evaluate(r) for r in runs()]
    assert len(checked) == 627
    within = [abs(r["ratio"] - 1) <= 0.15 for r in checked]
    assert sum(within) >= 0.8 * len(checked), sum(within)
    composer_a100 = [
        ok for ok, r in zip(within, checked) if r["stack"] == "FSDP-only: Composer (A100)"
    ]
    assert len(composer_a100) == 223 and sum(composer_a100) >= 0.9 * 223


def test_only_the_named_runs_lie_beyond_30_percent():
    """The issue's second bar, none beyond ±30 %, is not met by thirteen runs that
    BENCHMARKS.md names and discusses ("The thirteen beyond ±30 %"): four llm-foundry runs —
    MPT-30B at 8,192 tokens on 8 GPUs (H100 in two sweeps, A100 80GB), MPT-70B on 64 A100
    40GB —,
    InternLM's two smallest steps on 1,024 A100s (4,096 and 8,192 tokens a GPU, no
    checkpointing), whose gradient all-reduce the planner hides behind the backward,
    Megatron-Bridge's two Qwen3-30B-A3B runs on 16 H100s (128 experts of 768, 8 a token),
    whose published rate is half of the same layout's in the 25.09 table, the MoE model
    zoo's two Qwen3-235B-A22B runs with expert parallelism within each node (TP 2 × PP 32,
    TP 4 × PP 8), its slowest rows, run from another branch than its two cross-node ones,
    Megatron-Bridge's GPT-OSS-120B run on 64 H100s (128 experts, EP 8: the same
    fine-grained mixtures at 16 experts a rank as the Qwen3 ones), and
    torchtitan's two longest context-parallel runs (128K and 256K tokens over 4 and 8 H100s),
    whose attention costs half as much again per token pair as in its 32K and 64K runs. Every
    other published run stays inside the bound, so a change that pushes a further run past
    it fails here rather than only moving a count in the table."""
    from paracube.planner.published import evaluate, runs

    beyond = sorted(
        (r["source"], r["model"], r["seq_len"], r["gpus"])
        for r in map(evaluate, runs())
        if abs(r["ratio"] - 1) > 0.30
    )
    assert beyond == [
        ("InternLM", "InternLM-7B", 2048, 1024),
        ("InternLM", "InternLM-7B", 2048, 1024),
        ("Megatron-Bridge 25.11, MoE (FP8)", "qwen3-30b-a3b", 4096, 16),
        ("Megatron-Bridge 26.02, MoE (BF16)", "gpt-oss-120b", 4096, 64),
        ("Megatron-Bridge 26.02, MoE (FP8)", "qwen3-30b-a3b", 4096, 16),
        ("Megatron-MoE-ModelZoo", "qwen3-235b-a22b", 4096, 256),
        ("Megatron-MoE-ModelZoo", "qwen3-235b-a22b", 4096, 256),
        ("MosaicML (A100 40GB)", "MPT-70b", 2048, 64),
        ("MosaicML (A100 80GB)", "MPT-30b", 8192, 8),
        ("MosaicML (H100)", "MPT-30b", 8192, 8),
        ("MosaicML (H100, 2023)", "MPT-30b", 8192, 8),
        ("torchtitan (H100 500 W), compiled, FP8", "Llama 3.1 8B (128K)", 131072, 8),
        ("torchtitan (H100 500 W), compiled, FP8", "Llama 3.1 8B (256K)", 262144, 8),
    ], beyond


def test_the_model_zoo_counts_causal_attention_and_its_long_rows_are_converted():
    """The MoE model zoo's TFLOPS are Megatron-LM's count, the attention core halved for the
    causal mask: its main table gives each run's step and TFLOPS (245, 276, 200 and 167 TFLOPS
    for 19.7, 17.6, 24.2 and 29.0 s), which that count joins within 1 % (0.1–0.7 %: the
    table's rounding, and terms the two counts weigh apart, such as the router's) where
    paracube's full count is 13 % apart. The long-context rows, which give TFLOPS alone, are
    turned into paracube's count by the ratio of the two at their length."""
    from paracube.planner.flops import model_flops_per_token
    from paracube.planner.published import (
        MOE_MODEL_ZOO_LONG,
        MOE_MODEL_ZOO_QWEN3,
        megatron_causal_flops_per_token,
        runs,
    )

    cfg = preset("qwen3-235b-a22b")
    tokens = 2048 * cfg.seq_len
    for (*_, step), tflops in zip(MOE_MODEL_ZOO_QWEN3, (245, 276, 200, 167)):
        causal = tokens * megatron_causal_flops_per_token(cfg) / step / 256 / 1e12
        full = tokens * model_flops_per_token(cfg) / step / 256 / 1e12
        assert causal == pytest.approx(tflops, rel=0.01)
        assert full / tflops > 1.12
    long = [r for r in runs() if r["source"] == "Megatron-MoE-ModelZoo" and r["cfg"].seq_len > 4096]
    assert [(r["cfg"].seq_len, r["fixed"]["cp"], r["fixed"]["dp"]) for r in long] == [
        (16384, 1, 8), (32768, 2, 4), (65536, 4, 2), (131072, 8, 1)
    ]  # fmt: skip
    for row, (_, _, dropless, _) in zip(long, MOE_MODEL_ZOO_LONG):
        ratio = model_flops_per_token(row["cfg"]) / megatron_causal_flops_per_token(row["cfg"])
        assert row["published"] == pytest.approx(dropless * ratio, abs=0.05)


def test_bloom_row_is_its_logged_step_on_its_own_cluster():
    """BLOOM's row is its production log's iteration time (104.70 s for 2048 × 2048 tokens on
    384 GPUs) under paracube's hardware FLOP count — which reproduces the log's own TFLOPs
    figure, 149.77, so both count the same work; its pipeline split is Megatron-DeepSpeed's
    'type:transformer|embedding' as the README draws it ([embed | 5], 6 × 10, [5 | embed]);
    and its network is Jean Zay's four Omni-Path ports per node, an eighth of 50 GB/s a GPU."""
    from paracube.planner import hardware as hw
    from paracube.planner.layout import Layout
    from paracube.planner.published import runs
    from paracube.planner.stages import layout_shares
    from paracube.planner.time_model import Cluster

    (row,) = [r for r in runs() if r["source"] == "BLOOM"]
    assert row["published"] == pytest.approx(149.77, abs=0.05)
    layout = Layout(**row["fixed"])
    shares = layout_shares(row["cfg"], layout)
    assert [len(s.blocks) for s in shares] == [5] + [6] * 10 + [5]
    assert shares[0].embedding and shares[-1].head
    cluster = Cluster(
        hw.gpu("a100-80gb"), 8, hw.interconnect("nvlink3"), hw.interconnect(row["inter"])
    )
    assert cluster.inter.bandwidth == pytest.approx(4 * 12.5e9 / 8)


def test_dgxc_step_times_give_the_readmes_own_mfu_columns():
    """The DGX Cloud benchmarking rows hold each README's global batch and logged step
    time; with the READMEs' own model-FLOP formulas (their Notes: GPT-style 72·L·h² +
    12·L·h·s + 6·V·h per token, Llama-style 12·L·h²·(1 + groups/heads + s/h) + 18·L·f·h +
    6·V·h) those reproduce every MFU the tables print — a check of the transcription, row by
    row — and the Nemotron-4 report's 8.0 s for 2,304 sequences on 6,144 GPUs is its 41.0 %
    MFU in paracube's own count."""
    from paracube.planner.published import DGXC_405B_PROXIES, DGXC_TABLES, runs

    def gpt_style(L, h, s, V):  # nemo_megatron/README_175b.md, nemotron/README_*.md
        return s * (24 * L * h * h + 12 * L * h * s + 48 * L * h * h + 6 * V * h)

    def llama_style(L, h, s, V, groups, heads, f):  # llama3.1/README_*.md
        return s * (12 * L * h * h * (1 + groups / heads + s / h) + 18 * L * f * h + 6 * V * h)

    per_sequence = {  # the READMEs' own inputs (405B: 16 query groups, as its Notes take)
        "GPT-3 175B": gpt_style(96, 12288, 2048, 51200),
        "Nemotron-4 15B": gpt_style(32, 6144, 4096, 256000),
        "Nemotron-4 340B": gpt_style(96, 18432, 4096, 256000),
        "llama3-8b": llama_style(32, 4096, 8192, 128256, 8, 32, 14336),
        "llama3-70b": llama_style(80, 8192, 8192, 128256, 8, 64, 28672),
    }
    mfu_columns = {  # (BF16, FP8) percent, GPU counts ascending
        "GPT-3 175B": ([53.54, 52.91, 52.84, 52.63, 52.40], [39.52, 38.84, 38.51, 38.20, 37.30]),
        "Nemotron-4 15B": (
            [62.49, 62.23, 61.77, 61.47, 61.62, 61.12, 60.70, 60.87],
            [43.07, 42.92, 42.88, 42.65, 42.32, 41.43, 41.94, 41.43],
        ),
        "Nemotron-4 340B": (
            [55.38, 54.67, 54.32, 53.98, 52.75],
            [40.38, 39.75, 39.14, 38.20, 36.56],
        ),
        "llama3-8b": ([59.37, 58.96, 58.73, 58.60, 58.51], [39.63, 39.39, 39.31, 39.10, 39.02]),
        "llama3-70b": (
            [54.10, 54.06, 53.81, 53.48, 53.38, 53.38],
            [36.17, 36.43, 35.68, 35.62, 35.30, 34.96],
        ),
        "llama3-405b": ([55.78, 54.76, 54.45], [42.71, 42.45, 38.87]),
    }
    checked = 0
    tables = [(cfg.name, cfg.n_layers, scales) for cfg, *_, scales in DGXC_TABLES]
    tables += [
        ("llama3-405b", layers, [(n, B, bf16, fp8)])
        for layers, n, _, _, B, bf16, fp8 in DGXC_405B_PROXIES
    ]
    proxy_mfu = {7: (58.63, 44.77), 21: (56.17, 43.01), 42: (57.25, 44.07)}
    for name, layers, scales in tables:
        if name == "llama3-405b":
            flops = llama_style(layers, 16384, 8192, 128256, 16, 128, 53248)
        else:
            flops = per_sequence[name]
        for k, (n, B, *steps) in enumerate(scales):
            for p, (step, peak) in enumerate(zip(steps, (989e12, 1979e12))):
                if name == "llama3-405b" and layers < 126:
                    printed = proxy_mfu[layers][p]
                else:
                    printed = mfu_columns[name][p][k]
                mfu = 100 * B * flops / step / n / peak
                assert mfu == pytest.approx(printed, abs=0.15), (name, n, p)
                checked += 1
    dense = ("DGX Cloud benchmarking (BF16)", "DGX Cloud benchmarking (FP8)")
    assert checked == len([r for r in runs() if r["source"] in dense]) == 70

    (nemotron4,) = [r for r in runs() if r["source"] == "Nemotron-4 report"]
    assert nemotron4["published"] / 989 == pytest.approx(0.410, abs=0.002)
    # Nemotron-4 15B's batch ramp: each stage's MFU from its batch and iteration time, within
    # what the time's rounding to 10 ms moves it (±0.005 s of 0.57–0.64 s: under 0.9 %)
    stages = [r for r in runs() if r["source"] == "Nemotron-4 15B report"]
    printed = {768: (34.3, 0.57), 1536: (33.3, 0.58), 2304: (30.5, 0.64)}
    assert sorted(r["gpus"] for r in stages) == sorted(printed)
    for r in stages:
        mfu, seconds = printed[r["gpus"]]
        assert 100 * r["published"] / 989 == pytest.approx(mfu, rel=0.005 / seconds + 0.002)


def test_mpt_shapes_give_the_published_parameter_counts():
    """The MPT shapes paracube.planner.mosaic builds from llm-foundry's yamls give every
    parameter count of its H100 and A100 benchmark tables exactly (the position table grows
    with the sequence), so each MFU converts to throughput on the very model it measured."""
    from paracube.planner.mosaic import A100_80GB_PURE, FP8_TABLE, H100_PURE_2023, TABLES, mpt

    tables = [*TABLES.values(), FP8_TABLE, H100_PURE_2023, A100_80GB_PURE]
    rows = [row for table in tables for row in table]
    assert len(rows) == 52 + 59 + 78 + 10 + 22 + 86  # every row of the six tables
    for name, seq, *_, params in rows:
        assert parameter_count(mpt(name, seq)) == params, (name, seq)


def test_fp8_gain_over_bf16_is_the_one_llm_foundry_measured():
    """llm-foundry's 2023 H100 table measured nine runs twice, amp_bf16 and amp_fp8: FP8's
    gain on the same model, sequence, GPUs and micro-batch is a ratio of two published
    throughputs (1.02–1.30). The planner's gain — the same two evaluations' ratio — lies
    within 15 % of each, and, as measured, grows for every model as its sequence shortens
    (attention, which stays 16-bit, takes less of the step)."""
    from paracube.planner.published import evaluate, runs

    checked = [evaluate(r) for r in runs() if r["source"].startswith("MosaicML (H100")]

    def by_run(source: str) -> dict:
        return {
            (r["model"], r["seq_len"], r["micro_batch"]): r
            for r in checked
            if r["source"] == source
        }

    fp8, bf16 = by_run("MosaicML (H100 FP8)"), by_run("MosaicML (H100, 2023)")
    pairs = sorted(set(fp8) & set(bf16))
    assert len(pairs) == 9
    gains = {}
    for key in pairs:
        measured = fp8[key]["published_tflops"] / bf16[key]["published_tflops"]
        predicted = fp8[key]["predicted_tflops"] / bf16[key]["predicted_tflops"]
        assert predicted == pytest.approx(measured, rel=0.15), (key, measured, predicted)
        gains[key] = (measured, predicted)
    for model in {key[0] for key in pairs}:
        shortest_last = sorted((k for k in gains if k[0] == model), key=lambda k: -k[1])
        for which in (0, 1):  # measured, then predicted
            series = [gains[k][which] for k in shortest_last]
            assert series == sorted(series), (model, which, series)


def test_llama_and_tinyllama_rows_agree_with_their_sources_other_figures():
    """Each row's throughput agrees with the other figure its source gives: LLaMA 65B's 380
    tokens/s per GPU on 2,048 GPUs trains its 1.4T tokens "in approximately 21 days"; TinyLlama's
    24k tokens/s per A100 "translates to 56% model flops utilization" — paracube's FLOPs per
    token count its work as the README does. Both are predicted within ±15 %."""
    from paracube.planner.published import evaluate, runs

    rows = {r["source"]: r for r in runs() if r["source"] in ("LLaMA", "TinyLlama")}
    llama, tiny = rows["LLaMA"], rows["TinyLlama"]
    tokens_per_s = llama["published"] * 1e12 / model_flops_per_token(llama["cfg"])
    assert tokens_per_s == pytest.approx(380, rel=0.002)
    assert 1.4e12 / (tokens_per_s * llama["gpus"]) / 86400 == pytest.approx(21, abs=0.5)
    assert tiny["published"] * 1e12 / 312e12 == pytest.approx(0.56, abs=0.005)
    assert tiny["batch"] * tiny["cfg"].seq_len == 2 * 1024 * 1024  # "2 million tokens"
    assert tiny["fixed"]["micro_batch"] * tiny["cfg"].seq_len == 16 * 1024  # "16k tokens"
    for row in (llama, tiny):
        assert abs(evaluate(row)["ratio"] - 1) <= 0.15


def test_olmo_core_rows_do_not_hang_on_the_unstated_gpu_count():
    """OLMo-core's README does not say how many H100s its Llama 8B throughput was measured
    on; the rows take its launcher's default node (8 GPUs), and any count from 8 to 64 gives
    the same prediction within 2 % — the FSDP2 gathers hide behind the step at each — so the
    unstated fact does not decide the row, BF16 or FP8, both within ±15 %."""
    from paracube.planner.published import evaluate, runs

    rows = [r for r in runs() if r["cfg"].name == "Llama 8B (OLMo-core)"]
    assert [r["precision"] for r in rows] == ["bf16", "fp8"]
    for row in rows:
        ratios = [
            evaluate(row | {"gpus": n, "fixed": row["fixed"] | {"dp": n}})["ratio"]
            for n in (8, 16, 32, 64)
        ]
        assert max(ratios) - min(ratios) <= 0.02 * min(ratios), ratios
        assert all(abs(x - 1) <= 0.15 for x in ratios)


def test_flash_attention_gpt_rows_agree_with_their_readmes_other_figures():
    """FlashAttention's training README gives each run's tokens/s with its hours per billion
    tokens and batch in tokens; the 2.7B run is its "up to 189 TFLOPs/sec per A100" under the
    README's own count (Megatron-LM's §5.1 formula scaled by 3/4) and the 1.3B run trains
    "26B tokens in about 43 hours". Every row is predicted within ±15 %."""
    from paracube.planner.published import FLASH_ATTENTION_GPT, evaluate, runs

    rows = [r for r in runs() if r["source"] == "FlashAttention's GPT"]
    hours_per_billion = [0.21, 0.55, 1.13, 1.64, 3.27]  # the README's column
    batch_millions = [0.5, 0.5, 0.5, 1, 1]
    assert len(rows) == len(FLASH_ATTENTION_GPT) == 5
    for row, hours, millions in zip(rows, hours_per_billion, batch_millions, strict=True):
        cfg = row["cfg"]
        node_tokens = row["published"] * 1e12 / model_flops_per_token(cfg) * row["gpus"]
        assert round(1e9 / node_tokens / 3600, 2) == pytest.approx(hours)
        assert row["batch"] * cfg.seq_len == pytest.approx(millions * 2**20)
        assert abs(evaluate(row)["ratio"] - 1) <= 0.15
    big = rows[-1]["cfg"]
    l, h, s, v = big.n_layers, big.hidden, big.seq_len, big.vocab_size
    megatron = 96 * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))  # per sequence ÷ s
    per_gpu = rows[-1]["published"] * 1e12 / model_flops_per_token(big)
    assert 3 / 4 * megatron * per_gpu / 1e12 == pytest.approx(189, rel=0.01)
    assert 189 / 312 == pytest.approx(0.606, abs=0.001)
    xl = rows[3]
    xl_tokens = xl["published"] * 1e12 / model_flops_per_token(xl["cfg"]) * 8
    assert 26e9 / xl_tokens / 3600 == pytest.approx(43, abs=0.5)


def test_flash_attention_2_rows_are_its_table_and_its_gain():
    """FlashAttention-2's Table 1 counts 6·seqlen·params + 12·layers·hidden·seqlen² a
    sequence: its 225 TFLOP/s is the "72 % model FLOPs utilization" it states on the A100's
    312, and its FlashAttention 2k figure for GPT3-2.7B, 189, is the training README's
    85k tokens/s for the node (the 2.7B at head size 128) — the same runs. Its six further
    runs are predicted within ±15 %, and the planner's FlashAttention-2 gain over
    FlashAttention at 8k tokens is the table's within 5 % (1.29 for both models)."""
    from paracube.planner.published import (
        FLASH_ATTENTION_GPT,
        evaluate,
        flash_attention_2_paper_flops,
        runs,
    )

    assert 225 / 312 == pytest.approx(0.72, abs=0.005)
    name, layers, hidden, heads, _, _, _, node_tokens = FLASH_ATTENTION_GPT[-1]
    readme_2p7b = ModelConfig(
        n_layers=layers,
        hidden=hidden,
        n_heads=heads,
        vocab_size=50264,
        seq_len=2048,
        tie_embeddings=True,
        name=name,
    )
    paper_count = node_tokens / 8 * flash_attention_2_paper_flops(readme_2p7b) / 1e12
    assert paper_count == pytest.approx(189, rel=0.01)

    rows = [evaluate(r) for r in runs() if r["source"] == "FlashAttention-2 paper"]
    assert len(rows) == 6 and all(abs(r["ratio"] - 1) <= 0.15 for r in rows), rows
    by_key = {(r["model"], r["seq_len"], r["published_tflops"]): r for r in rows}
    for model in ("GPT3-1.3B", "GPT3-2.7B"):
        eight_k = sorted(
            (r for (m, s, _), r in by_key.items() if m == model and s == 8192),
            key=lambda r: r["published_tflops"],
        )
        v1, v2 = eight_k
        published_gain = v2["published_tflops"] / v1["published_tflops"]
        predicted_gain = v2["predicted_tflops"] / v1["predicted_tflops"]
        assert predicted_gain == pytest.approx(published_gain, rel=0.05), (model, predicted_gain)


def test_zero_bubble_rows_are_its_tables_sizes_and_orderings():
    """The Zero Bubble paper's four GPT-3-like models are its stated sizes, to their last digit,
    with a 32,000-token tied embedding — not with GPT-2's 50,257 (6.3B, 14.7B, 28.4B). Its 69
    runs of 1F1B (9 of them with no more micro-batches than stages), interleaved 1F1B and
    ZB-1p (planned as ZB-H1), 24 of them again at twice the micro-batch, are predicted within
    ±15 %, and doubling the micro-batch gains what it gained there within 5 %;
    in every setup the planner ranks ZB-1p above 1F1B as the paper measured, by the gain it
    measured within 5 % (4–15 %: ZB-H1's bubble at the blocks' own forward, input- and
    weight-gradient costs), and each schedule's throughput rises with the micro-batch count
    as it did there."""
    from paracube.planner.published import (
        ZERO_BUBBLE_MODELS,
        evaluate,
        runs,
        zero_bubble_model,
    )

    for name, layers, heads, hidden, *_ in ZERO_BUBBLE_MODELS:
        cfg = zero_bubble_model(name, layers, heads, hidden)
        assert f"{parameter_count(cfg) / 1e9:.1f}B" == name
        gpt2 = cfg.replace(vocab_size=50257)
        assert (f"{parameter_count(gpt2) / 1e9:.1f}B" == name) == (name == "1.5B")

    rows = [evaluate(r) for r in runs() if r["source"].startswith("Zero Bubble paper")]
    assert len(rows) == 69 and all(abs(r["ratio"] - 1) <= 0.15 for r in rows), rows
    for r in rows:
        if r["source"].endswith(", 2× micro-batch)"):
            one = next(
                o
                for o in rows
                if o["source"] == r["source"].replace(", 2× micro-batch", "")
                and (o["model"], o["batch"]) == (r["model"], r["batch"] // 2)
            )
            published = r["published_tflops"] / one["published_tflops"]
            predicted = r["predicted_tflops"] / one["predicted_tflops"]
            assert predicted == pytest.approx(published, rel=0.05), (r["source"], r["model"])
    by = {(r["source"], r["model"], r["batch"]): r for r in rows}
    for (source, model, batch), row in by.items():
        if source.endswith("(ZB-1p)"):
            one_f_one_b = by[("Zero Bubble paper (1F1B)", model, batch)]
            published = row["published_tflops"] / one_f_one_b["published_tflops"]
            predicted = row["predicted_tflops"] / one_f_one_b["predicted_tflops"]
            assert published > 1 and predicted > 1, (model, batch)
            assert predicted == pytest.approx(published, rel=0.05), (model, batch)
    for source in {s for s, _, _ in by}:
        for model in {m for _, m, _ in by}:
            runs_of = sorted((b, r) for (s, m, b), r in by.items() if (s, m) == (source, model))
            for key in ("published_tflops", "predicted_tflops"):
                rates = [r[key] for _, r in runs_of]
                assert rates == sorted(rates), (source, model, key, rates)


def test_a_stages_passes_are_the_zero_bubble_papers_profiled_times():
    """The Zero Bubble paper profiled each stage's passes (Table 6, ms a micro-batch): T_F, T_B
    (the input gradient) and T_W (the weight gradient). The planner's pass costs
    (``time_model.pass_costs``) for a middle stage's blocks: the weight-gradient pass ZB-H1
    defers within 10 %, the three together within 10 %. The split between forward and
    input gradient is not theirs: the planner's forward is 3–20 % short and its input
    gradient 17–30 % long (BENCHMARKS.md)."""
    from paracube.planner.layout import Layout
    from paracube.planner.published import ZERO_BUBBLE_MODELS, zero_bubble_model
    from paracube.planner.time_model import at_precision, layer_time, pass_costs, recompute_time

    profiled = {  # Table 6 at each model's fewest micro-batches: T_F, T_B, T_W in ms
        "1.5B": (18.522, 18.086, 9.337),
        "6.2B": (29.718, 29.444, 19.927),
        "14.6B": (11.347, 11.248, 8.132),
        "28.3B": (10.419, 10.207, 7.715),
    }
    g = at_precision(_a100_node(8), "fp16").gpu
    for name, layers, heads, hidden, gpus, b, _ in ZERO_BUBBLE_MODELS:
        cfg = zero_bubble_model(name, layers, heads, hidden)
        layout = Layout(pp=gpus, micro_batch=b, microbatches=gpus, schedule="zb-h1",
                        attention="unfused", recompute="selective", split="even-ends")  # fmt: skip
        fwd, bwd, _ = layer_time(cfg, layout, g)
        redo = recompute_time(cfg, layout, g, 2, False, fwd)
        blocks = (layers + 2) // gpus  # a middle stage's: the ends hold one fewer
        F, I, W = (blocks * x * 1e3 for x in pass_costs(cfg, layout, g, 2, False, fwd, bwd, redo))
        f, i, w = profiled[name]
        assert W == pytest.approx(w, rel=0.10), (name, W, w)
        assert F + I + W == pytest.approx(f + i + w, rel=0.10), (name, F + I + W, f + i + w)
        assert F < f and I > i, name  # the split the planner does not get


def test_torchtitan_rows_are_its_tables_and_scale_as_published():
    """torchtitan's A100 table is held whole (its eight rows: Llama 3 8B/70B and Llama 2
    13B/70B under each checkpointing it lists), and its H200 float8 runs of Llama 3.1 8B on
    32 and 64 GPUs are the tokens/s its benchmark states; twice the replicas cost the H200 run
    a little per GPU (10,938 → 10,753) and the planner too — never a speed-up. All within ±15 %."""
    from paracube.planner.published import evaluate, runs

    a100 = [r for r in runs() if r["source"] == "torchtitan"]
    assert len(a100) == 8
    assert [r["fixed"]["recompute"] for r in a100].count("op") == 3
    h200 = [r for r in runs() if r["source"] == "torchtitan (H200, FP8)"]
    tokens = [r["published"] * 1e12 / model_flops_per_token(r["cfg"]) for r in h200]
    assert [r["gpus"] for r in h200] == [32, 64]
    assert tokens == [pytest.approx(10938, rel=0.001), pytest.approx(10753, rel=0.001)]
    predicted = [evaluate(r)["predicted_tflops"] for r in h200]
    assert predicted[1] <= predicted[0]
    for row in a100 + h200:
        assert abs(evaluate(row)["ratio"] - 1) <= 0.15


def test_torchtitan_h100_tables_and_what_compiling_its_blocks_buys():
    """torchtitan's H100 benchmarks of December 2024 (Grand Teton, 500 W): Tables 1 and 3 (Llama
    3.1 8B with FSDP2 on 8 and 128 GPUs, eager, compiled, compiled with float8), Table 2 (8
    GPUs, FSDP × context parallel at 32K–256K tokens) and Table 4 (70B, FSDP 32 × TP 8,
    without and with async TP) are the tokens/s they state. The planner counts the eager
    blocks' element-wise ops op by op, so compiling them buys time — less than the published
    15.7 % and 16.2 % (it counts only the bytes eager ops move) — and float8 more; every run
    but the two longest context-parallel ones lands within ±20 %."""
    from paracube.planner.published import evaluate, runs

    rows = [r for r in runs() if r["source"].startswith("torchtitan (H100 500 W)")]
    tokens = [round(r["published"] * 1e12 / model_flops_per_token(r["cfg"])) for r in rows]
    stated = [5762, 6667, 8532, 5605, 6514, 8380, 3890, 2540, 1071, 548, 829, 876]
    assert tokens == [pytest.approx(t, rel=0.001) for t in stated]
    results = [evaluate(r) for r in rows]
    for first in (0, 3):  # eager, compiled, compiled + float8 on 8 and on 128 GPUs
        eager, compiled, float8 = (results[first + i]["predicted_tflops"] for i in range(3))
        published = [rows[first + i]["published"] for i in range(3)]
        assert 1.0 < compiled / eager < published[1] / published[0]
        assert float8 > compiled
    within = [abs(r["ratio"] - 1) <= 0.20 for r in results]
    assert within == [True] * 8 + [False, False] + [True] * 2


def test_published_table_covers_fsdp_only_stacks_and_h100():
    """At least 15 runs beyond the Megatron-LM A100 set are on H100 or FSDP-only stacks, each
    with its source and stack named, and every one is evaluated (a layout of the stated
    parallelism is timed)."""
    from paracube.planner.published import STACKS, evaluate, runs

    new = [r for r in runs() if r["gpu"] == "h100" or r["fixed"].get("zero") == 3]
    assert len(new) >= 15
    for row in new:
        result = evaluate(row)
        assert result["stack"] == STACKS[row["source"]] and result["predicted_tflops"] > 0


def test_model_flops_follow_the_shapes():
    """MFU's numerator: for GPT shapes exactly Korthikanti's Eq. 7, with full recomputation
    exactly SC21's Eq. 3; for LLaMA shapes (GQA, SwiGLU, untied head) the matmul weights are
    the parameter count less embeddings and norms."""
    from paracube.models.shapes import block_matrix_params as layer_matmul_params
    from paracube.planner.flops import hardware_flops_per_token, model_flops_per_token

    cfg = preset("gpt3-175b")
    B, s = 8, cfg.seq_len
    assert B * s * model_flops_per_token(cfg) == pytest.approx(
        model_flops(B, s, 96, 12288, 50257), rel=1e-12
    )
    assert B * s * hardware_flops_per_token(cfg, "full") == pytest.approx(
        flops_with_full_recompute(B, s, 96, 12288, 50257), rel=1e-12
    )
    llama = preset("llama3-70b")
    h, L, V = llama.hidden, llama.n_layers, llama.vocab_size
    norms = (2 * L + 1) * h
    assert L * layer_matmul_params(llama) == parameter_count(llama) - 2 * V * h - norms
    attention = 3 * L * 4 * llama.seq_len * h
    assert model_flops_per_token(llama) == pytest.approx(
        6 * L * layer_matmul_params(llama) + 6 * V * h + attention
    )


def test_wave_quantization():
    """A GEMM's output is cut into 128×256 tiles, one per SM per wave (NVIDIA's GEMM guide):
    108 tiles fill an A100's 108 SMs once; one tile more needs a second, nearly empty wave."""
    from paracube.planner.time_model import wave_efficiency

    assert wave_efficiency(128, 256 * 108, 108) == 1.0
    assert wave_efficiency(128, 256 * 109, 108) == pytest.approx(109 / (2 * 108))
    assert wave_efficiency(100, 256, 108) == pytest.approx(
        100 / (108 * 128)
    )  # one partial tile on 108 SMs
    assert wave_efficiency(123, 457, 0) == 1.0  # a calibrated CPU has no waves


def test_fused_attention_drops_the_score_tensors():
    """FlashAttention-style attention keeps no s×s tensors (Korthikanti's 5·a·s/h term) and
    skips the masked half of a causal product: less memory, less time than unfused attention,
    and selective recomputation then saves only the kernel's log-sum-exp."""
    from paracube.planner.layout import Layout
    from paracube.planner.layout_memory import stage_memory
    from paracube.planner.time_model import estimate

    cfg, node = preset("gpt3-13b"), _a100_node(8)
    s, b, h, a = cfg.seq_len, 1, cfg.hidden, cfg.n_heads
    assert (
        activation_bytes_per_layer(s, b, h, a, t=8, sequence_parallel=True, attention="fused")
        == 34 * s * b * h / 8
    )
    base = dict(tp=8, micro_batch=1, microbatches=8, sequence_parallel=True)
    fused, unfused = Layout(**base), Layout(**base, attention="unfused")
    assert stage_memory(cfg, fused)[0].activations < stage_memory(cfg, unfused)[0].activations
    assert estimate(cfg, fused, node).step_time < estimate(cfg, unfused, node).step_time
    selective = Layout(**base, recompute="selective")
    # selective recomputation can drop only the fused kernel's fp32 log-sum-exp per row and
    # head (4 bytes × b·s·a/t per block), as the engine does
    dropped = cfg.n_layers * 4 * b * s * a / 8
    assert stage_memory(cfg, fused)[0].activations - stage_memory(cfg, selective)[
        0
    ].activations == pytest.approx(dropped)
    with pytest.raises(ConfigError, match="unknown attention"):
        activation_bytes_per_layer(s, b, h, a, attention="paged")


def test_triton_flash_attention_runs_at_its_published_speed():
    """FlashAttention in Triton (MPT's ``attn_impl: triton``) stores what FlashAttention-2
    stores, and is timed at the FlashAttention-2 paper's comparison (§4.1): its forward
    takes 1.3-1.5× FlashAttention-2's, its backward about 2× — so a long-sequence layer's
    attention time grows by between those factors, and the whole layer by less."""
    from paracube.planner.layout import Layout
    from paracube.planner.layout_memory import stage_memory
    from paracube.planner.time_model import attention_core, layer_time

    cfg, g = preset("gpt3-1.3b"), gpu("h100")
    flash2, triton = (
        Layout(dp=8, micro_batch=1),
        Layout(dp=8, micro_batch=1, attention="fused-triton"),
    )
    forward2, flops2 = attention_core(cfg, flash2, g)
    forward3, flops3 = attention_core(cfg, triton, g)
    assert flops3 == flops2 and 1.3 <= forward3 / forward2 <= 1.5
    assert stage_memory(cfg, triton)[0].activations == stage_memory(cfg, flash2)[0].activations
    f2, b2, _ = layer_time(cfg, flash2, g)
    f3, b3, _ = layer_time(cfg, triton, g)
    # the backward's attention core: 2.5 × the forward's work at FlashAttention-2's backward
    # rate on this GPU, twice as slow as FlashAttention-2
    backward2 = 2.5 * forward2 * g.attention_rate / g.attention_backward_rate
    assert b3 - b2 == pytest.approx(backward2 * (2.0 - 1.0))
    assert f3 - f2 == pytest.approx(forward3 - forward2)
    assert 1.0 < (f3 + b3) / (f2 + b2) < 2.0


def test_first_flash_attention_runs_at_half_flash_attention_2s_rate():
    """FlashAttention's own first CUDA kernels (flash-attn before 2.0) reached "only 25-40% of
    the theoretical maximum FLOPs/s", which FlashAttention-2 speeds up "around 2×" (Dao 2023,
    abstract): at the bottom of each range the planner runs both passes at half
    FlashAttention-2's rate, with the same FLOPs and memory."""
    from paracube.planner.layout import Layout
    from paracube.planner.layout_memory import stage_memory
    from paracube.planner.time_model import attention_core, layer_time

    cfg, g = preset("gpt3-1.3b"), gpu("a100-80gb")
    flash2, flash1 = Layout(dp=8, micro_batch=4), Layout(dp=8, micro_batch=4, attention="fused-v1")
    (forward2, flops2), (forward1, flops1) = (
        attention_core(cfg, flash2, g),
        attention_core(cfg, flash1, g),
    )
    assert flops1 == flops2 and forward1 == pytest.approx(2 * forward2)
    assert forward2 == pytest.approx(flops2 / (0.50 * 312e12))  # FlashAttention-2 at 50 %
    assert stage_memory(cfg, flash1)[0].activations == stage_memory(cfg, flash2)[0].activations
    f2, b2, _ = layer_time(cfg, flash2, g)
    f1, b1, _ = layer_time(cfg, flash1, g)
    assert f1 - f2 == pytest.approx(forward2)
    assert b1 - b2 == pytest.approx(2.5 * forward2)  # the backward's 2.5× work, twice as slow


def test_a_fused_kernel_computes_a_head_at_the_size_it_is_compiled_for():
    """FlashAttention's kernels are compiled for a few head sizes and run a head on the
    smallest that holds it, their matmuls over the padding: a head of 96 costs FlashAttention
    1 (sizes 32, 64, 128) what a head of 128 costs — 4/3 of its own FLOPs' time — while
    FlashAttention-2, which has a 96 kernel, runs it at its FLOPs; Triton's pads 112 to 128.
    The FLOPs counted (MFU's) stay the model's; the backward follows the forward."""
    from paracube.planner.layout import Layout
    from paracube.planner.time_model import attention_core, attention_core_backward

    g = gpu("a100-80gb")
    head96 = preset("gpt3-1.3b").replace(hidden=1536, n_heads=16)  # GPT-3 760M's heads
    head128 = head96.replace(hidden=2048)
    assert (head96.head_dim, head128.head_dim) == (96, 128)

    def core(cfg, attention):
        layout = Layout(dp=8, micro_batch=2, attention=attention)
        forward, flops = attention_core(cfg, layout, g)
        return forward, flops, attention_core_backward(layout, forward, g)

    fa1_96, fa1_128 = core(head96, "fused-v1"), core(head128, "fused-v1")
    fa2_96, fa2_128 = core(head96, "fused"), core(head128, "fused")
    assert fa1_96[0] == pytest.approx(fa1_128[0]) and fa1_96[2] == pytest.approx(fa1_128[2])
    assert fa1_96[1] == pytest.approx(0.75 * fa1_128[1])  # the FLOPs are the model's own
    assert fa2_96[0] == pytest.approx(0.75 * fa2_128[0])
    head112 = preset("gpt3-1.3b").replace(hidden=1792, n_heads=16)
    triton_112, triton_128 = core(head112, "fused-triton"), core(head128, "fused-triton")
    assert triton_112[0] == pytest.approx(triton_128[0])
    assert core(head112, "fused")[0] == pytest.approx(core(head128, "fused")[0])


def test_gradient_reduction_after_backward_is_all_exposed():
    """Overlapped, the data-parallel all-reduce hides behind the last backward; reduced after
    it (Megatron-LM 2021, DeepSpeed's pipeline engine), all of it adds to the step."""
    from paracube.planner.collectives import ring
    from paracube.planner.dp_comm import dp_link
    from paracube.planner.layout import Layout
    from paracube.planner.time_model import estimate

    cfg, cluster = preset("gpt3-1.3b"), _a100_node(4)
    overlapped = estimate(cfg, Layout(dp=32, micro_batch=4, microbatches=1), cluster)
    layout = Layout(dp=32, micro_batch=4, microbatches=1, overlap_grad_reduce=False)
    after = estimate(cfg, layout, cluster)
    full = ring(4 * parameter_count(cfg), 32, dp_link(layout, cluster))  # fp32 gradients
    assert after.dp_exposed == pytest.approx(full) and overlapped.dp_exposed < full


def model_states_of(cfg):
    from paracube.engine import Trainer
    from paracube.mesh.mesh import ProcessMesh
    from tests.helpers import small_corpus

    trainer = Trainer(cfg, ProcessMesh(cfg.parallel), small_corpus())
    trainer.train_step()  # optimizer states exist after the first step
    return trainer.model_state_bytes()


@pytest.mark.parametrize("dp,tp,pp", [(2, 1, 1), (1, 2, 1), (2, 2, 1), (1, 4, 1), (1, 1, 2)])
def test_planner_memory_equals_counted_model_states(pools, dp, tp, pp):
    """fp32 AdamW: the planner's model-state bytes per rank (first stage) equal what the
    engine holds — weights, gradient buffers, Adam's m and v — exactly."""
    from paracube.config import ParallelConfig, TrainConfig
    from paracube.planner.layout import Layout
    from paracube.planner.layout_memory import stage_memory

    model = preset("nano", seq_len=32, n_layers=2)
    cfg = TrainConfig(
        model=model,
        parallel=ParallelConfig(dp=dp, tp=tp, pp=pp, sequence_parallel=tp > 1),
        micro_batch=8 // (dp * 2),
        grad_accum=2,
        progress=False,
    )
    counted = pools(dp * tp * pp).run(model_states_of, cfg)[0]
    layout = Layout(
        dp=dp, tp=tp, pp=pp, micro_batch=cfg.micro_batch, microbatches=2, sequence_parallel=tp > 1
    )
    predicted = stage_memory(model, layout, "fp32")[0]
    assert sum(counted.values()) == predicted.model_states


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("name", ["gpt3-125m", "llama2-7b"])
def test_layout_activations_are_the_engines_count(name, recompute):
    """One stage, no tensor parallelism, fused attention: the planner's activation bytes are
    the op-by-op count of paracube's own model (``model_saved_bytes``, which the engine's
    saved-tensor counter reproduces exactly) — not a published constant for another
    model's layer."""
    from paracube.models.shapes import model_saved_bytes
    from paracube.planner.layout import Layout
    from paracube.planner.layout_memory import stage_memory

    cfg = preset(name)
    layout = Layout(micro_batch=2, microbatches=4, recompute=recompute)
    for precision, elem in (("bf16", 2), ("fp32", 4)):
        planned = stage_memory(cfg, layout, precision)[0].activations
        assert planned == model_saved_bytes(cfg, 2, elem=elem, recompute=recompute)


def test_olmo_core_runs_fit_as_the_compiled_blocks_they_ran():
    """OLMo-core trains Llama 8B and OLMo 2 13B on one H100 node without activation
    checkpointing, its blocks torch.compile'd: counted as compiled blocks keep
    (shapes.block_saved_bytes, compiled — measured on paracube's block in
    test_saved_activations) the runs fit 80 GiB; counted as eager blocks they would not,
    and the rows would be planned as a layout the planner thinks cannot run."""
    from paracube.planner.published import evaluate, runs

    rows = [r for r in runs() if r["source"].startswith("OLMo-core")]
    assert len(rows) == 4 and all(r["fixed"]["activations"] == "compiled" for r in rows)
    for row in rows:
        assert evaluate(row)["note"] == ""
        eager = evaluate(row | {"fixed": row["fixed"] | {"activations": "paracube"}})
        assert eager["note"].startswith("memory model:")
