"""A mixture of experts, planned: parameters and FLOPs of k experts of E, expert
parallelism out of the data-parallel ranks, the token dispatcher's all-to-alls, the
experts' states sharded over their own group, and the published Grok-1 runs (pure)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from paracube.choices import state_bytes_per_parameter
from paracube.cli import main
from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.models.presets import preset
from paracube.planner import hardware as hw
from paracube.planner.flops import model_flops_per_token
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import peak_memory
from paracube.planner.memory import model_state_bytes
from paracube.planner.mp_comm import ep_comm_time, moe_tp_rings
from paracube.planner.time_model import Cluster, estimate

H100 = Cluster(hw.gpu("h100"), 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))


def active_params(cfg: ModelConfig) -> float:
    """What one token passes: every block's attention, router and k experts, the norms, the
    embedding and the head."""
    head = 0 if cfg.tie_embeddings else shapes.head_params(cfg)
    blocks = sum(
        n * (shapes.block_active_matrix_params(kind) + 2 * shapes.norm_params(kind))
        for kind, n in cfg.kind_counts()
    )
    return blocks + shapes.embed_params(cfg) + shapes.norm_params(cfg) + head


def test_a_mixture_holds_every_expert_and_a_token_passes_k_of_them():
    """Mixtral 8x7B: "47B parameters, but only uses 13B active parameters during inference"
    (Jiang et al. 2024, abstract) — Mistral's announcement gives 46.7B and 12.9B; Mixtral
    8x22B "39B active parameters out of 141B" (Mistral's announcement). Grok-1: "314B
    parameter Mixture-of-Experts" (xai-org/grok-1 README). Qwen2-57B-A14B's model card: 57B
    with 14B activated — its shared expert passed by every token. Qwen3's model cards: 30.5B with
    3.3B activated (Qwen3-30B-A3B), 235B with 22B activated (Qwen3-235B-A22B)."""
    for name, total, active, places in [
        ("mixtral-8x7b", 46.7, 12.9, 1),
        ("mixtral-8x22b", 141, 39, 0),
        ("grok-1", 316, 84, 0),
        ("qwen3-30b-a3b", 30.5, 3.4, 1),  # 3.35B: the card rounds it down
        ("qwen3-235b-a22b", 235, 22, 0),
        ("qwen2-57b-a14b", 57, 14, 0),  # its model card: 57B, 14B activated (a shared expert)
    ]:
        cfg = preset(name)
        assert round(shapes.parameter_count(cfg) / 1e9, places) == total
        assert round(active_params(cfg) / 1e9, places) == active
    assert round(shapes.parameter_count(preset("grok-1")) / 1e9, -1) == 320  # 314B, ~1 %
    dense = dataclasses.replace(preset("mixtral-8x7b"), experts=0, experts_per_token=0)
    assert active_params(dense) == shapes.parameter_count(dense)  # one MLP: all of it passed


def test_grok1_model_flops_are_the_recipes_own():
    """NVIDIA's Grok-1 recipe: "The model flops for Grok 1 for GBS=1 per GPU for 2048 GPUs
    is 4.27E+15" (dgxc-benchmarking grok1/README_314b.md) — one 8,192-token sequence of its
    model (the Llama 3 tokenizer's 128,256 tokens, untied output), counting the causal half
    of the attention core. paracube counts the attention in full, as the papers' MFU does;
    the rest — k = 2 experts of 8 per token — is the recipe's count."""
    cfg = preset("grok-1", vocab_size=128256, tie_embeddings=False)
    per_token = model_flops_per_token(cfg)
    causal_half = 3 * cfg.n_layers * 4 * cfg.seq_len * cfg.n_heads * cfg.head_dim / 2
    assert (per_token - causal_half) * cfg.seq_len == pytest.approx(4.27e15, rel=0.005)


def test_grok1_step_times_give_the_readmes_own_mfu_columns():
    """Every row of the Grok-1 recipe's BF16 and FP8 tables as transcribed
    (published.GROK1_TABLE: GPUs, sequence, blocks, global batch, step seconds) gives the
    README's own MFU column to its printed 0.1 — global batch × model FLOPs a sequence ÷ step
    ÷ GPUs ÷ peak (989 and 1,979 TFLOP/s), its model FLOPs counting the causal half of the
    attention — the proxies with fewer blocks and 4,096 tokens too, which also confirms the
    global batch of 1,024 on 8 and 16 GPUs (512 and 256 micro-batches, not the GA column's
    128)."""
    from paracube.planner.published import GROK1_TABLE

    bf16 = [45.4, 44.9, 45.4, 44.5, 43.0, 42.1, 41.5, 41.1, 41.0]
    fp8 = [27.4, 28.3, 29.1, 28.3, 26.9, 26.3, 25.9, 25.6, 25.3]
    for row, printed in zip(GROK1_TABLE, zip(bf16, fp8)):
        n, seq, layers, *_, batch, step_bf16, step_fp8 = row
        cfg = preset("grok-1", vocab_size=128256, tie_embeddings=False, seq_len=seq,
                     n_layers=layers)  # fmt: skip
        causal_half = 3 * layers * 4 * seq * cfg.n_heads * cfg.head_dim / 2
        per_sequence = (model_flops_per_token(cfg) - causal_half) * seq
        for step, peak, mfu in zip((step_bf16, step_fp8), (989e12, 1979e12), printed):
            assert 100 * batch * per_sequence / step / n / peak == pytest.approx(mfu, abs=0.06)


def test_expert_parallelism_is_refused_where_it_cannot_run():
    """ep divides dp (it is carved out of the data-parallel ranks) and the experts; a dense
    model takes none; a mixture is not planned with the dense block's models (op-level
    checkpointing, gradient compression, unfused attention, hybrid sharding) nor with
    tensor parallelism but no sequence parallelism (Megatron-Core requires it); paracube's
    engine refuses a mixture, its layouts and its model alike."""
    with pytest.raises(ConfigError, match="ep=3 does not divide dp=8"):
        Layout(dp=8, ep=3)
    mixtral = preset("mixtral-8x7b")
    assert "is dense" in Layout(dp=8, ep=2).model_refusal(preset("gpt3-1.3b"))
    assert "does not divide the 8 experts" in Layout(dp=48, ep=6).model_refusal(mixtral)
    assert "not planned" in Layout(dp=8, ep=8, recompute="op").model_refusal(mixtral)
    assert "not planned" in Layout(dp=8, ep=8, compress="fp16").model_refusal(mixtral)
    assert "sequence parallelism" in Layout(dp=8, tp=2, ep=8).model_refusal(mixtral)
    assert Layout(dp=8, tp=2, ep=8, sequence_parallel=True).model_refusal(mixtral) == ""
    with pytest.raises(ConfigError, match="does not divide the 8 experts"):
        estimate(mixtral, Layout(dp=48, ep=6), H100)
    with pytest.raises(ConfigError, match="paracube train builds dense models"):
        Layout(dp=8, ep=8).to_args()
    with pytest.raises(ConfigError, match="experts_per_token=3: each token goes to 1 to experts=2"):
        ModelConfig(n_layers=2, hidden=64, n_heads=4, vocab_size=300, seq_len=16, experts=2,
                    experts_per_token=3)  # fmt: skip
    from paracube.models.gpt import GPT

    small = ModelConfig(n_layers=1, hidden=32, n_heads=2, vocab_size=300, seq_len=8, experts=4,
                        experts_per_token=1)  # fmt: skip
    with pytest.raises(ConfigError, match="planned .paracube plan., not built"):
        GPT(small)


def test_the_dispatcher_sends_each_token_to_its_experts_and_back_four_times():
    """Megatron-Core's all-to-all token dispatcher, per block and micro-batch: the k·N
    token slices out and back, forward and backward — four all-to-alls of k·N·h/tp 16-bit
    values, 1/ep of them to each other member: to those on the rank's node over NVLink,
    to the rest through the rank's own network port, a latency step per peer."""
    cfg = preset("mixtral-8x7b", seq_len=4096)
    n, k, h = 4096, 2, 4096

    def seconds(layout, cluster):
        return ep_comm_time(cfg, layout, cluster)

    # within one node: 8 ranks, tp 1 — NVLink for the 7 peers' shares
    inside = Layout(dp=8, ep=8)
    per_peer = k * n * h * 2 / 8
    expected = 7 * per_peer / H100.intra.bandwidth + 7 * H100.intra.latency
    assert seconds(inside, H100) == pytest.approx(4 * expected)
    # one rank a node: every peer through the network port
    apart = Cluster(H100.gpu, 1, H100.intra, H100.inter)
    expected = 7 * per_peer / H100.inter.bandwidth + 7 * H100.inter.latency
    assert seconds(inside, apart) == pytest.approx(4 * expected)
    # tensor parallel 2 (members two GPUs apart, four on a node): the slices are half as
    # wide; the remote half of the peers sets the time
    split = Layout(dp=8, tp=2, ep=8, sequence_parallel=True)
    per_peer = k * n * h * 2 / (2 * 8)
    local, remote = 3 * per_peer / H100.intra.bandwidth, 4 * per_peer / H100.inter.bandwidth
    assert seconds(split, H100) == pytest.approx(4 * (max(local, remote) + 7 * H100.inter.latency))
    assert seconds(Layout(dp=8), H100) == 0.0  # ep 1: nothing leaves the rank
    assert ep_comm_time(preset("gpt3-1.3b"), Layout(dp=8), H100) == 0.0


def test_deepep_sends_a_token_once_to_each_rank_holding_its_experts():
    """DeepEP's dispatch sends a token once to every rank holding any of its experts, where
    the all-to-all dispatcher sends a row per expert: each all-to-all carries, to a peer,
    the tokens that reach it. Counted here by enumeration — every choice of a token's k
    experts (the router's top k, at random) and every token of the round-robin gate's cycle
    — and the all-to-alls' seconds scale by it (latency set to zero to compare the bytes)."""
    from itertools import combinations
    from math import comb

    from paracube.planner.mp_comm import dispatched_rows

    def reach(cfg, ep, picks):
        """How often each token's picks include an expert of rank 1 (any peer: all alike)."""
        held = cfg.experts // ep
        return sum(any(e // held == 1 for e in p) for p in picks) / len(picks)

    for cfg, ep in [(preset("mixtral-8x7b", seq_len=4096), 4), (preset("qwen3-30b-a3b"), 8)]:
        E, k = cfg.experts, cfg.experts_per_token
        random = combinations(range(E), k) if comb(E, k) < 10**6 else None
        if random is not None:  # Mixtral: 28 pairs of 8 experts
            expected = reach(cfg, ep, list(random))
        else:  # Qwen3-30B-A3B: 1.4 × 10^12 choices — their count, in closed form
            expected = 1 - comb(E - E // ep, k) / comb(E, k)
        deepep = Layout(dp=ep, ep=ep, ep_dispatch="deepep")
        assert dispatched_rows(cfg, deepep) == pytest.approx(expected)
        assert dispatched_rows(cfg, Layout(dp=ep, ep=ep)) == pytest.approx(k / ep)
        cycle = [[(i * k + j) % E for j in range(k)] for i in range(E)]
        robin = Layout(dp=ep, ep=ep, ep_dispatch="deepep", router="round-robin")
        assert dispatched_rows(cfg, robin) == pytest.approx(reach(cfg, ep, cycle))
        # the bytes on the links: the all-to-alls' seconds in proportion
        still = dataclasses.replace(H100.intra, latency=0.0)
        cluster = Cluster(H100.gpu, 8, still, dataclasses.replace(H100.inter, latency=0.0))
        plain = ep_comm_time(cfg, Layout(dp=ep, ep=ep), cluster)
        assert ep_comm_time(cfg, deepep, cluster) == pytest.approx(plain * expected / (k / ep))
    # NeMo AutoModel's benchmark gate on Qwen3-30B-A3B over 8 ranks of 16 experts: a token's
    # 8 consecutive experts start at a multiple of 8, so they sit on one rank — 1/k the rows
    assert dispatched_rows(cfg, robin) == pytest.approx(1 / ep)


def test_deepep_sends_a_token_across_the_network_once_per_node_it_reaches():
    """Across nodes DeepEP's normal kernels send a token once to each node holding any of its
    experts and copy it to that node's ranks over NVLink; the all-to-all dispatcher sends a
    row to every expert. Mixtral's 8 experts over ep = 8 on two nodes of 4 (top 2): counted
    over the 28 pairs, the network carries the share of pairs that reach the other node, of
    the all-to-all's 4 · 2/8 rows a token — its seconds in proportion where the network is
    the slower link (latency zero to compare the bytes)."""
    from itertools import combinations

    from paracube.planner.mp_comm import dispatched_rows

    cfg = preset("mixtral-8x7b", seq_len=4096)
    pairs = list(combinations(range(cfg.experts), cfg.experts_per_token))
    other_node = sum(any(e >= 4 for e in p) for p in pairs) / len(pairs)  # ranks 4–7 there
    deepep = Layout(dp=8, ep=8, ep_dispatch="deepep")
    assert dispatched_rows(cfg, deepep, 4) == pytest.approx(other_node)
    assert dispatched_rows(cfg, Layout(dp=8, ep=8), 4) == pytest.approx(4 * 2 / 8)
    # four GPUs a node, NVLink far faster than the network: the seconds are the network's
    fast = dataclasses.replace(H100.intra, latency=0.0, bandwidth=1e15)
    cluster = Cluster(H100.gpu, 4, fast, dataclasses.replace(H100.inter, latency=0.0))
    plain = ep_comm_time(cfg, Layout(dp=8, ep=8), cluster)
    assert ep_comm_time(cfg, deepep, cluster) == pytest.approx(plain * other_node / (4 * 2 / 8))
    assert other_node < 4 * 2 / 8  # 22 of 28 pairs against a row an expert: 0.79 ≤ 1


def test_deepeps_dispatch_is_emitted_for_megatron_and_explained(capsys):
    """--ep-dispatch deepep is Megatron-Core's flex dispatcher with DeepEP's backend in the
    emitted command (the all-to-all dispatcher's flag otherwise), and --explain says what
    share of the per-expert rows its all-to-alls carry (dispatched_rows ÷ k/ep)."""
    from paracube.planner.mp_comm import dispatched_rows

    common = ["plan", "--model", "qwen3-30b-a3b", "--gpus", "8", "--gpu", "h100",
              "--global-batch", "512", "--layout", "dp=8,ep=8", "--micro-batch", "2"]  # fmt: skip
    for dispatch, flags in [("alltoall", "--moe-token-dispatcher-type alltoall"),
                            ("deepep", "--moe-token-dispatcher-type flex "
                                       "--moe-flex-dispatcher-backend deepep")]:  # fmt: skip
        assert main([*common, "--ep-dispatch", dispatch, "--emit", "megatron"]) == 0
        assert flags in capsys.readouterr().out
    assert main([*common, "--ep-dispatch", "deepep", "--explain"]) == 0
    share = dispatched_rows(preset("qwen3-30b-a3b"), Layout(dp=8, ep=8, ep_dispatch="deepep"))
    assert f"{share / (8 / 8):.0%} of the rows a copy per expert sends" in capsys.readouterr().out


def test_a_mixtures_tensor_parallel_collectives_are_the_dispatchers():
    """The attention's pair forward and backward and its input re-gathered (2.5 rings of
    b·s·h); the dispatcher's gather and scatter of the k·N rows (k half rings each way) and
    its two all-to-alls over the tp ranks (1/tp of a half ring each), forward and backward;
    a recomputed forward once more."""
    cfg = preset("mixtral-8x7b")
    assert moe_tp_rings(cfg, 4, full=False) == pytest.approx(2 * (1 + 2 + 1 / 4) + 0.5)
    assert moe_tp_rings(cfg, 4, full=True) == pytest.approx(3 * (1 + 2 + 1 / 4) + 0.5)


def test_the_experts_states_are_sharded_over_the_ranks_that_hold_them():
    """ZeRO-1 (Megatron-Core's distributed optimizer) over dp × cp ranks for the attention,
    router and ends, over dp × cp ÷ ep for the experts — each rank holds E/ep experts; the
    weights and gradients whole."""
    cfg = preset("mixtral-8x7b", seq_len=4096)
    layout = Layout(dp=16, pp=4, ep=8, zero=1, microbatches=16, split="even")
    memory = peak_memory(cfg, layout)
    blocks = cfg.n_layers // 4
    experts = blocks * shapes.expert_params(cfg, 1, 8)
    assert experts == blocks * 3 * 4096 * 14336  # one expert of each block
    first = blocks * shapes.block_params(cfg, 1, 8) + shapes.embed_params(cfg)
    w, g, o = state_bytes_per_parameter("bf16", layout.grad_reduce)  # 2, 4 (fp32), 12
    sizes = dict(weight_bytes=w, grad_bytes=g, optimizer_bytes=o)
    expected = (
        model_state_bytes(first - experts, 1, 16, **sizes).total
        + model_state_bytes(experts, 1, 2, **sizes).total
    )
    assert memory.stage == "first"
    assert memory.model_states == pytest.approx(expected)
    # expert parallelism is what makes the experts fit: all eight on every rank cost more
    assert peak_memory(cfg, Layout(dp=16, pp=4, ep=1, zero=1, microbatches=16,
                                   split="even")).total > memory.total + 30e9  # fmt: skip


def test_the_search_spreads_the_experts_and_a_dense_model_never():
    """Mixtral 8x7B on 32 H100s: the first choice spreads the experts (ep > 1, dividing
    dp and the 8 experts); no dense candidate has ep > 1."""
    from paracube.planner.search import search

    result = search(preset("mixtral-8x7b", seq_len=4096), H100, 32, 256, top=5)
    best = result.ranked[0].layout
    assert best.ep > 1 and best.dp % best.ep == 0 and 8 % best.ep == 0
    assert result.ranked[0].time.ep_comm > 0
    dense = search(preset("gpt3-1.3b"), H100, 16, 64, top=20)
    assert all(c.layout.ep == 1 for c in dense.ranked)


def test_a_stack_that_shards_in_groups_plans_a_mixture_without_them():
    """The stacks that also try hybrid sharding (Composer's HYBRID_SHARD, FSDP2's 2-D mesh)
    plan a mixture of experts with their whole-group ZeRO: the hybrid twins, which the
    planner does not model for experts, are set aside as refused, never raised — Mixtral on
    16 H100s under --stack composer had stopped on the first of them."""
    from paracube.planner.search import search
    from paracube.planner.stacks import search_options, stack

    options = search_options("composer", split_chosen=False)
    assert options["hybrid_shard"]  # the stack does try them
    result = search(preset("mixtral-8x7b", seq_len=4096), H100, 16, 32, fixed=stack("composer"),
                    top=3, **options)  # fmt: skip
    assert result.ranked and all(c.layout.shard == 0 for c in result.ranked)
    reason = "hybrid sharding is not planned for a mixture of experts"
    assert any(reason in why for why in result.rejected)


def test_the_published_grok1_runs_are_timed_as_the_recipe_ran(capsys):
    """NVIDIA's Grok-1 recipe on 512 to 2,048 H100s (TP 4 × PP 8 × VP 8 × CP 2 × EP 8, no
    recomputation): every row within ±15 % of its step in BF16 and FP8; and its layout
    given to ``paracube plan`` — the 512-GPU row, ep out of dp 8 — is evaluated as such."""
    from paracube.planner.published import evaluate, runs

    grok = [r for r in runs() if r["cfg"].name == "grok-1"]
    assert len(grok) == 6  # 512, 1,024 and 2,048 GPUs, BF16 and FP8
    for run in grok:
        assert evaluate(run)["ratio"] == pytest.approx(1, abs=0.15), run["gpus"]
    argv = ["plan", "--model", "grok-1", "--gpus", "512", "--gpu", "h100", "--global-batch",
            "1024", "--layout", "dp=8,tp=4,pp=8,cp=2,ep=8", "--stack", "nemo", "--explain"]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    best = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    assert "| dp=8 tp=4 pp=8 cp=2 ep=8 " in best
    assert "expert parallel 8 gives each rank 1 of every block's experts" in text
    assert "the attention's collectives and the token dispatcher's" in text


def test_a_hugging_face_mixtral_config_is_planned_with_its_experts(tmp_path):
    """A Mixtral config.json (model_type mixtral: Mistral's decoder, num_local_experts,
    num_experts_per_tok) is read as a mixture — planned; paracube train refuses it."""
    from paracube.models.sources import hf_model_config, read_hf_config

    config = {
        "model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 1000, "max_position_embeddings": 512, "num_local_experts": 4,
        "num_experts_per_tok": 2, "hidden_act": "silu", "sliding_window": None,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = hf_model_config(read_hf_config(str(tmp_path)), 128)
    assert (cfg.experts, cfg.experts_per_token, cfg.activation) == (4, 2, "swiglu")
    assert shapes.parameter_count(cfg) > shapes.parameter_count(
        dataclasses.replace(cfg, experts=0, experts_per_token=0)
    )
    from paracube.models.hf import build_hf

    with pytest.raises(ConfigError, match="paracube train builds dense models"):
        build_hf(str(tmp_path), cfg)


def test_a_shared_expert_is_a_dense_mlp_beside_the_routed_ones():
    """Shared experts (ModelConfig.shared_expert_ffn; DeepSeek's, Qwen2-MoE's) as
    Megatron-Core's SharedExpertMLP runs them: a dense MLP of that width every token passes —
    its weights split by tp and held by every expert-parallel rank (not divided by ep, and
    reduced with the attention's, outside the experts' parameters), its two GEMMs over all of
    a rank's tokens after the routed experts', its activations a dense MLP's, its
    tensor-parallel collectives a dense MLP's (a pair each way, the input re-gathered, its
    forward again under full recomputation) — and nothing of the routing changes."""
    base = preset("mixtral-8x7b", seq_len=4096)
    f = 2048
    shared = dataclasses.replace(base, shared_expert_ffn=f)
    mlp = dataclasses.replace(base, experts=0, experts_per_token=0, ffn_hidden=f)
    dense_mlp = shapes.expert_params(mlp, tp=2)  # a dense block's MLP on a rank of tp 2
    for ep in (1, 2, 8):
        added = shapes.block_params(shared, tp=2, ep=ep) - shapes.block_params(base, tp=2, ep=ep)
        assert added == dense_mlp
        assert shapes.expert_params(shared, tp=2, ep=ep) == shapes.expert_params(base, tp=2, ep=ep)
    h = base.hidden
    assert (shapes.block_active_matrix_params(shared) - shapes.block_active_matrix_params(base)
            == 3 * h * f)  # fmt: skip
    tokens = 8192
    gemms = shapes.block_gemms(shared, tokens, tp=2, ep=8)
    assert gemms[:-2] == shapes.block_gemms(base, tokens, tp=2, ep=8)
    assert gemms[-2:] == [(tokens, 2 * f / 2, h), (tokens, h, f / 2)]
    assert shapes.down_gemms(shared, tokens, 2, 8)[-1] == gemms[-1]
    for recompute in ("none", "selective"):
        kept = dict(tp=2, sequence_parallel=True, recompute=recompute)
        grown = shapes.block_saved_bytes(shared, 2, **kept) - shapes.block_saved_bytes(
            base, 2, **kept
        )
        dense_width = shapes.block_saved_bytes(mlp, 2, **kept) - shapes.block_saved_bytes(
            dataclasses.replace(mlp, ffn_hidden=1), 2, **kept
        )  # a dense block's bytes per unit of MLP width, times f − 1
        assert grown * (f - 1) == dense_width * f
    for full in (False, True):
        dense = 4 * (1.5 if full else 1.0) + 1  # a dense block's rings under SP: its MLP's half
        assert moe_tp_rings(shared, 2, full) - moe_tp_rings(base, 2, full) == dense / 2
    with pytest.raises(ConfigError, match="shared_expert_ffn=512 without experts"):
        dataclasses.replace(mlp, shared_expert_ffn=512)
    with pytest.raises(ConfigError, match="shared_expert_ffn=-1"):
        dataclasses.replace(base, shared_expert_ffn=-1)


def test_a_shared_expert_is_planned_and_emitted_for_megatron(capsys):
    """Qwen2-57B-A14B (64 experts of 2,560, 8 a token, a shared expert of 20,480): its step
    costs more than the same mixture's without the shared expert, `--explain` names it and
    the Megatron command carries --moe-shared-expert-intermediate-size; a custom shape takes
    --shared-expert-ffn."""
    cfg = preset("qwen2-57b-a14b")
    layout = Layout(dp=8, tp=2, ep=8, micro_batch=1, microbatches=8, sequence_parallel=True,
                    zero=1)  # fmt: skip
    with_shared = estimate(cfg, layout, H100)
    without = estimate(dataclasses.replace(cfg, shared_expert_ffn=0), layout, H100)
    assert with_shared.step_time > without.step_time
    assert (
        model_flops_per_token(cfg)
        - model_flops_per_token(dataclasses.replace(cfg, shared_expert_ffn=0))
        == cfg.n_layers * 6 * 3 * cfg.hidden * cfg.shared_expert_ffn
    )
    common = ["plan", "--model", "qwen2-57b-a14b", "--gpus", "16", "--gpu", "h100",
              "--global-batch", "64", "--layout", "tp=2,ep=8"]  # fmt: skip
    assert main([*common, "--emit", "megatron"]) == 0
    out = capsys.readouterr().out
    assert "--num-experts 64 --moe-router-topk 8" in out
    assert "--moe-shared-expert-intermediate-size 20480" in out
    assert main([*common, "--explain"]) == 0
    assert "a shared expert of 20,480 every token passes" in capsys.readouterr().out
    custom = ["plan", "--layers", "4", "--hidden", "512", "--heads", "8", "--vocab", "1000",
              "--seq", "512", "--experts", "8", "--experts-per-token", "2",
              "--shared-expert-ffn", "1024", "--gpus", "8", "--gpu", "h100",
              "--global-batch", "16", "--json"]  # fmt: skip
    assert main(custom) == 0
    assert json.loads(capsys.readouterr().out)["candidates"]
    # split by tp as a dense MLP: a width tp does not divide is refused, as the MLP's is
    odd = [a if a != "1024" else "1001" for a in custom]
    assert main([*odd, "--layout", "tp=2"]) == 2
    assert "heads or MLP size not divisible by tp" in capsys.readouterr().err


# Qwen/Qwen3-30B-A3B's config.json, the keys that shape the model
QWEN3_30B_A3B_CONFIG = {
    "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
    "max_position_embeddings": 40960, "hidden_act": "silu", "attention_bias": False,
    "tie_word_embeddings": False, "rope_theta": 1000000.0, "rope_scaling": None,
    "rms_norm_eps": 1e-06, "sliding_window": None, "use_sliding_window": False,
    "norm_topk_prob": True,
}  # fmt: skip


def test_a_hugging_face_qwen3_moe_config_is_planned_as_its_preset(tmp_path, capsys):
    """A Qwen3-MoE config.json (model_type qwen3_moe: Qwen3's decoder — heads of head_dim,
    per-head q/k norms — with num_experts experts of moe_intermediate_size, top
    num_experts_per_tok) is read as the mixture its preset plans: Qwen3-30B-A3B's gives the
    preset's shape and its model card's 30.5B parameters, and plans with expert
    parallelism. Training and import refuse it as a mixture; the blocks a config leaves
    dense (mlp_only_layers, decoder_sparse_step) are planned dense, each an MLP of
    intermediate_size, not as if every block were sparse."""
    from paracube.models.hf import build_hf
    from paracube.models.hf_convert import imported_config
    from paracube.models.sources import hf_model_config, read_hf_config

    (tmp_path / "config.json").write_text(json.dumps(QWEN3_30B_A3B_CONFIG))
    cfg = hf_model_config(read_hf_config(str(tmp_path)), 4096)
    same = dataclasses.replace(cfg, name="qwen3-30b-a3b")
    assert same == preset("qwen3-30b-a3b")
    assert round(shapes.parameter_count(cfg) / 1e9, 1) == 30.5
    with pytest.raises(ConfigError, match="paracube train builds dense models"):
        build_hf(str(tmp_path), cfg)
    with pytest.raises(ConfigError, match="qwen3_moe cannot be paracube's GPT"):
        imported_config(QWEN3_30B_A3B_CONFIG)
    argv = ["plan", "--model", f"hf:{tmp_path}", "--seq", "4096", "--gpus", "16", "--gpu",
            "h100", "--global-batch", "64", "--json"]  # fmt: skip
    assert main(argv) == 0
    best = json.loads(capsys.readouterr().out)["candidates"][0]["layout"]
    assert best["ep"] > 1
    for dense, blocks in (
        ({"mlp_only_layers": [0]}, (0,)),
        ({"decoder_sparse_step": 2}, tuple(range(0, 48, 2))),  # every other block a mixture
    ):
        (tmp_path / "config.json").write_text(json.dumps({**QWEN3_30B_A3B_CONFIG, **dense}))
        mixed = hf_model_config(read_hf_config(str(tmp_path)), 4096)
        assert (mixed.dense_layers, mixed.dense_ffn) == (blocks, 6144)
        # each dense block trades the 128 experts and the router for one 6,144-wide MLP
        dense_block = 3 * 2048 * 6144
        mixture_block = 128 * 3 * 2048 * 768 + 2048 * 128
        assert shapes.parameter_count(mixed) == shapes.parameter_count(cfg) - len(blocks) * (
            mixture_block - dense_block
        )
    (tmp_path / "config.json").write_text(
        json.dumps({**QWEN3_30B_A3B_CONFIG, "decoder_sparse_step": 49})
    )
    with pytest.raises(ConfigError, match="leave every one of its 48 blocks dense"):
        hf_model_config(read_hf_config(str(tmp_path)), 4096)


def test_a_hugging_face_qwen2_moe_config_is_planned_with_its_shared_expert(tmp_path):
    """A Qwen2-MoE config.json (model_type qwen2_moe: Qwen2's decoder, num_experts of
    moe_intermediate_size, top num_experts_per_tok, and a shared expert of
    shared_expert_intermediate_size) is read as its preset: Qwen2-57B-A14B's. Import
    refuses it as a mixture."""
    from paracube.models.hf_convert import imported_config
    from paracube.models.sources import hf_model_config, read_hf_config

    config = {
        "model_type": "qwen2_moe", "hidden_size": 3584, "intermediate_size": 18944,
        "moe_intermediate_size": 2560, "shared_expert_intermediate_size": 20480,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "num_experts": 64, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "vocab_size": 151936, "max_position_embeddings": 32768,
        "hidden_act": "silu", "tie_word_embeddings": False, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06, "use_sliding_window": False, "norm_topk_prob": False,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = hf_model_config(read_hf_config(str(tmp_path)), 4096)
    assert dataclasses.replace(cfg, name="qwen2-57b-a14b") == preset("qwen2-57b-a14b")
    with pytest.raises(ConfigError, match="qwen2_moe cannot be paracube's GPT"):
        imported_config(config)


def test_a_fixed_ep_alone_leaves_dp_to_the_search_and_an_ep_above_dp_is_folded(capsys):
    """``--layout ep=8`` fixes the expert-parallel size and leaves dp to the search, which
    keeps the layouts whose dp it divides (it was refused as "ep=8 does not divide dp=1", the
    default dp of the fixed choices' check). An ep above the data-parallel ranks is
    Megatron-Core's parallel folding (Megatron-Bridge's Qwen3-235B-A22B recipe on 256 H100s
    runs TP 2 × PP 8 with EP 32 at expert-tensor-parallel size 1): planned with etp=1 (here
    Qwen3-30B-A3B's EP 16 over TP 2 × DP 8, and its Megatron command says so), refused
    unfolded with the fix named."""
    argv = ["plan", "--model", "mixtral-8x7b", "--seq", "4096", "--gpus", "16",
            "--global-batch", "256", "--layout", "ep=8", "--json"]  # fmt: skip
    assert main(argv) == 0
    candidates = json.loads(capsys.readouterr().out)["candidates"]
    assert candidates and all(c["layout"]["ep"] == 8 for c in candidates)
    assert all(c["layout"]["dp"] % 8 == 0 or c["layout"]["etp"] == 1 for c in candidates)
    small = ["plan", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100",
             "--global-batch", "16"]  # fmt: skip
    assert main([*small, "--layout", "tp=2,pp=1,ep=16,etp=1", "--emit", "megatron"]) == 0
    out = capsys.readouterr().out
    assert "--expert-model-parallel-size 16" in out
    assert "--expert-tensor-parallel-size 1" in out
    common = ["plan", "--model", "qwen3-235b-a22b", "--gpus", "256", "--gpu", "h100",
              "--global-batch", "2048", "--precision", "fp8"]  # fmt: skip
    assert main([*common, "--layout", "tp=2,pp=8,dp=16,ep=32"]) == 2
    err = capsys.readouterr().err
    assert "ep=32 does not divide dp=16" in err and "etp=1" in err
    assert main([*common, "--layout", "tp=4,pp=8,dp=8,ep=2,etp=1"]) == 2
    assert "ep=2 × etp=1 is below tp=4" in capsys.readouterr().err
    # etp fixed alone leaves ep to the search, as ep alone leaves dp
    assert main([*small, "--layout", "tp=2,etp=1", "--json"]) == 0
    candidates = json.loads(capsys.readouterr().out)["candidates"]
    assert candidates and all(c["layout"]["etp"] == 1 for c in candidates)
    assert all(c["layout"]["ep"] >= 2 for c in candidates)


def test_folded_experts_do_the_same_work_in_other_groups():
    """Folding (etp=1 under tp=2) keeps each rank's expert work — k·N rows × f/tp columns,
    here as E/ep whole experts over ep·k·N/(tp·E) rows each — and moves the rest: the MLP has
    no tensor-parallel collective, the experts' gradient group is tp·dp/(ep·etp), a rank
    holds its E/ep experts whole, and the experts' inputs kept for backward are 1/tp as many
    rows."""
    cfg = preset("qwen3-30b-a3b")
    tokens, tp = 4096, 2
    unfolded = shapes.block_gemms(cfg, tokens, tp=tp, ep=8)
    folded = shapes.block_gemms(cfg, tokens, tp=tp, ep=16, etp=1)

    def expert_flops(gemms):
        return sum(m * n * k for m, n, k in gemms[3:])  # after qkv, o and the router

    assert expert_flops(folded) == pytest.approx(expert_flops(unfolded))
    assert len(folded) == 3 + 2 * cfg.experts // 16
    rows = 16 * 1 * cfg.experts_per_token * tokens / (tp * cfg.experts)
    assert folded[3] == (rows, 2 * cfg.ffn_hidden, cfg.hidden)  # SwiGLU's gate and up, whole
    assert moe_tp_rings(cfg, tp, False, etp=1) < moe_tp_rings(cfg, tp, False)
    assert moe_tp_rings(cfg, tp, False, etp=1) == 2.5  # the attention's alone
    layout = Layout(tp=tp, dp=16, ep=16, etp=1)
    assert layout.expert_grad_group == tp * 16 // 16
    one_expert = shapes.expert_params(cfg, tp=1, ep=cfg.experts)
    assert shapes.expert_params(cfg, tp=1, ep=16) == pytest.approx(8 * one_expert)
    kept = shapes.moe_routing_bytes(cfg, tokens, 2, tp, tp, etp=1)
    whole = shapes.moe_routing_bytes(cfg, tokens, 2, tp, tp)
    assert whole - kept == cfg.experts_per_token * tokens * cfg.hidden * 2 // tp


def test_overlapped_all_to_alls_wait_only_for_what_compute_cannot_cover():
    """--ep-comm-overlap (Megatron-Core's combined 1F1B): a block's all-to-alls beside a
    longer compute leave the slowdown of the covered part, beside a shorter one the excess
    too; the unpaired warm-up share waits in full; a plain 1F1B pipeline cannot host it."""
    from paracube.planner.collectives import OVERLAP_SLOWDOWN
    from paracube.planner.mp_comm import overlapped_ep_comm

    base = Layout(tp=2, pp=8, dp=16, ep=32, etp=1, microbatches=128, chunks=4,
                  schedule="interleaved-1f1b", sequence_parallel=True,
                  ep_comm_overlap=True)  # fmt: skip
    unpaired = (2 * 7 + 3 * 8) / (128 * 4)
    covered = overlapped_ep_comm(1.0, 3.0, base)
    assert covered == pytest.approx(unpaired + (1 - unpaired) * OVERLAP_SLOWDOWN)
    short = overlapped_ep_comm(3.0, 1.0, base)
    assert short == pytest.approx(unpaired * 3 + (1 - unpaired) * (2 + OVERLAP_SLOWDOWN))
    assert overlapped_ep_comm(1.0, 3.0, Layout(dp=8, ep=8, microbatches=4)) == pytest.approx(
        1 / 4 + 3 / 4 * OVERLAP_SLOWDOWN
    )
    cfg = preset("qwen3-235b-a22b")
    assert base.model_refusal(cfg) == ""
    assert "interleaved-1f1b only" in base.replace(schedule="1f1b", chunks=1).model_refusal(cfg)


def test_a_plans_track_record_is_of_its_own_kind_of_model(capsys):
    """The record a plan is read with (--json's track_record, --explain's line) holds the
    published runs of its stack, GPU and precision that are mixtures when the plan's model
    is one, dense ones when it is dense: FSDP2's BF16 rows on H100 hold NeMo AutoModel's
    Qwen3-30B-A3B beside the dense ones (OLMo-core's, AutoModel's Llama 3 70B)."""
    from paracube.planner.published import PLANNED_AS, STACKS, runs

    held = [
        r
        for r in runs()
        if STACKS[r["source"]] in PLANNED_AS["fsdp"]
        and (r["gpu"], r["precision"]) == ("h100", "bf16")
    ]
    mixtures = sum(r["cfg"].moe for r in held)
    assert mixtures == 1 and len(held) > mixtures
    common = ["--gpus", "8", "--gpu", "h100", "--stack", "fsdp"]
    argv = ["plan", "--model", "llama3-8b", "--global-batch", "64", *common, "--json"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)["track_record"]
    assert record["runs"] == len(held) - mixtures and record["moe"] is False
    assert main(["plan", "--model", "qwen3-30b-a3b", "--global-batch", "512", *common,
                 "--explain"]) == 0  # fmt: skip
    line = next(x for x in capsys.readouterr().out.splitlines() if "Track record" in x)
    assert "1 published run of fsdp's software on H100 SXM in bf16 of mixtures of experts" in line
    assert "(NeMo AutoModel, MoE)" in line


def test_under_fp8_the_experts_keep_their_inputs_as_fp8_copies():
    """Megatron-Core's blocks under FP8 keep every linear layer's input as the FP8 copy its
    weight gradient uses (Transformer Engine's saved input, 1 byte): the experts' first
    linear too. Beside the dense MLP's own saving, the routed k·n rows of the mixture's
    expert inputs drop from 2 bytes to 1 (n: the micro-batch's tokens; tp 1 here)."""
    from paracube.planner.memory import te_block_bytes

    moe = preset("qwen3-30b-a3b")
    dense = dataclasses.replace(moe, experts=0, experts_per_token=0)
    n = moe.seq_len

    def saving(cfg: ModelConfig) -> float:
        return te_block_bytes(cfg, 1) - te_block_bytes(cfg, 1, fp8=True)

    k, f = moe.experts_per_token, moe.ffn_hidden
    mlp_inputs = n * f  # the down projection's input, one byte fewer per value
    assert saving(moe) - k * mlp_inputs - (saving(dense) - mlp_inputs) == k * n * moe.hidden


def test_group_limited_routing_reaches_fewer_nodes():
    """DeepSeek-V3's node-limited routing (n_group 8, topk_group 4: a token's 8 experts from 4
    of 8 groups of 32): under DeepEP's dispatch at EP 64 over 8 nodes — a node's experts
    one group — a token reaches a node with chance 1 − C(7, 4)/C(8, 4) = 1/2 (any 8 of
    256: 1 − C(224, 8)/C(256, 8), 0.66), a rank of 4 experts 4/8 · (1 − C(28, 2)/C(32, 2));
    Megatron-Core's group top-k itself (the groups whose best two score highest, then the
    best 8 among them), run here on random scores as its forced balancing runs it, reaches
    about 4 groups a token — what the count assumes. The all-to-all's row per expert is
    not changed. The command carries the groups; bad groups are refused."""
    import math

    import torch

    from paracube.planner.megatron import megatron_args
    from paracube.planner.mp_comm import dispatched_rows
    from paracube.planner.stacks import stack

    cfg = preset("deepseek-v3")
    free = dataclasses.replace(cfg, route_groups=0, route_group_topk=0)
    deepep = Layout(dp=64, ep=64, ep_dispatch="deepep")
    assert dispatched_rows(cfg, deepep, 8) == pytest.approx(1 - math.comb(7, 4) / math.comb(8, 4))
    assert dispatched_rows(free, deepep, 8) == pytest.approx(
        1 - math.comb(224, 8) / math.comb(256, 8)
    )
    rank = 4 / 8 * (1 - math.comb(28, 2) / math.comb(32, 2))
    assert dispatched_rows(cfg, deepep) == pytest.approx(rank)
    alltoall = Layout(dp=64, ep=64)
    assert dispatched_rows(cfg, alltoall, 8) == dispatched_rows(free, alltoall, 8) == 8 * 8 / 64
    # Megatron-Core's group-limited top-k over random scores (tokens, 8 groups of 32)
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(20000, 8, 32, generator=gen)
    best_groups = scores.topk(2, dim=-1).values.sum(-1).topk(4, dim=-1).indices
    kept = torch.zeros(20000, 8, dtype=torch.bool).scatter_(1, best_groups, True)
    masked = scores.masked_fill(~kept.unsqueeze(-1), float("-inf")).view(20000, 256)
    reached = torch.zeros(20000, 8, dtype=torch.bool)
    reached.scatter_(1, masked.topk(8, dim=-1).indices // 32, True)
    assert reached.float().mean().item() == pytest.approx(0.5, abs=0.01)
    args = " ".join(megatron_args(Layout(dp=64, ep=64, **stack("megatron-core")), cfg, "bf16", 64))
    assert "--moe-router-num-groups 8 --moe-router-group-topk 4" in args
    for groups, chosen in ((6, 4), (8, 0), (8, 3), (8, 9)):
        with pytest.raises(ConfigError, match="route_group"):
            dataclasses.replace(cfg, route_groups=groups, route_group_topk=chosen)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"router_score": "softmax2"}, "router_score='softmax2': choose softmax or sigmoid"),
        ({"router_scale": 0}, "router_scale must be a finite number > 0, got 0"),
        ({"router_renorm": 1}, "router_renorm=1: True or False"),
    ],
)
def test_a_routers_weighing_is_checked(changes, match):
    """The router's weighing fields are checked where the config is made."""
    with pytest.raises(ConfigError, match=re.escape(match)):
        preset("mixtral-8x7b").replace(**changes)


def test_a_routers_weighing_is_a_mixtures_alone():
    """A dense model with a router's weighing is refused with the fix, and a mixture's
    dense blocks are planned without it."""
    with pytest.raises(ConfigError, match="weigh a mixture's experts: give experts"):
        preset("llama2-7b").replace(router_score="sigmoid")
    # DeepSeek-V3's dense first blocks are planned without its router's weighing
    kinds = {k.moe: k.router_score for k, _ in preset("deepseek-v3").kind_counts()}
    assert kinds == {True: "sigmoid", False: "softmax"}
