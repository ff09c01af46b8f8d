"""Megatron-Core's --recompute-modules in the planner (``Layout.recompute_modules`` under
``recompute="selective"``): each module drops what it makes again from a block's saved
bytes and adds its forward again to the block's recomputation — a latent attention's up
projections (mla_up_proj), a dense block's MLP (mlp), the attention core (core_attn,
paracube train's selective) — each figure derived from the block's own tensors and GEMMs."""

from __future__ import annotations

import pytest

from paracube.cli import main
from paracube.errors import ConfigError
from paracube.models.presets import preset
from paracube.planner import hardware as hw
from paracube.planner.flops import hardware_flops_per_token
from paracube.planner.layout import Layout
from paracube.planner.megatron import megatron_args
from paracube.planner.memory import te_block_bytes
from paracube.planner.stacks import stack
from paracube.planner.time_model import _gemm, attention_core, recompute_time

H100 = hw.gpu("h100")


def _kind(cfg, moe: bool):
    return next(kind for kind, _ in cfg.kind_counts() if kind.moe == moe)


def test_each_module_drops_what_it_makes_again():
    """Of a DeepSeek-V3 block at tp 2 with sequence parallelism, 4,096 tokens: core_attn the
    kernel's fp32 log-sum-exp (4 bytes a head and token), mla_up_proj the kernel's per-head
    queries, keys and values (d + d_r, d + d_r and d_v a head, 16-bit; its output stays, the
    output projection's input), mlp a dense block's first projection's output and the
    activation's (its input is the norm's output, kept either way)."""
    cfg = preset("deepseek-v3")
    moe, dense = _kind(cfg, True), _kind(cfg, False)
    n, t = 4096, 2

    def kept(kind, recompute="selective", modules=("core_attn",)):
        return te_block_bytes(kind, 1, t=t, sequence_parallel=True, recompute=recompute,
                              modules=modules)  # fmt: skip

    a = cfg.n_heads
    lse = 4 * n * a / t
    assert kept(moe, "none") - kept(moe) == pytest.approx(lse)
    qkv = n * a * (2 * cfg.qk_head_dim + cfg.v_dim) * 2 / t
    assert kept(moe) - kept(moe, modules=("core_attn", "mla_up_proj")) == pytest.approx(qkv)
    assert kept(moe, modules=("mla_up_proj",)) - kept(
        moe, modules=("core_attn", "mla_up_proj")
    ) == pytest.approx(lse)
    f = dense.ffn_hidden
    mlp = (2 * 2 * n * f + 2 * n * f) / t  # SwiGLU's gate | up, and the activation's output
    assert kept(dense) - kept(dense, modules=("core_attn", "mlp")) == pytest.approx(mlp)
    assert kept(moe, modules=("core_attn", "mlp")) == kept(moe)  # a mixture's MLP is "moe"


def test_each_module_adds_its_forward_again():
    """The recomputation per block and micro-batch: the attention core's forward
    (core_attn), the up projections' GEMMs as the rank runs them (mla_up_proj: q's latent to
    every head's d + d_r, kv's latent to every head's d and d_v, column-parallel over tp),
    the dense MLP's two GEMMs (mlp); and the hardware FLOPs count them: 2 per weight of the
    redone linears, every block of their kind."""
    cfg = preset("deepseek-v3")
    moe, dense = _kind(cfg, True), _kind(cfg, False)
    tokens, t = 4096, 2
    layout = Layout(dp=8, tp=t, sequence_parallel=True, recompute="selective")

    def redo(kind, modules):
        return recompute_time(kind, layout.replace(recompute_modules=modules), H100, 2, False, 0.0)

    core = attention_core(moe, layout, H100, 2)[0]
    assert redo(moe, ("core_attn",)) == pytest.approx(core)
    q_up = _gemm(tokens, a_d := cfg.n_heads * cfg.qk_head_dim / t, cfg.q_lora_rank, H100)
    kv_up = _gemm(tokens, cfg.n_heads * (cfg.head_dim + cfg.v_dim) / t, cfg.kv_lora_rank, H100)
    assert a_d == 128 * 192 / 2
    assert redo(moe, ("mla_up_proj",)) == pytest.approx(q_up + kv_up)
    up = _gemm(tokens, 2 * dense.ffn_hidden / t, cfg.hidden, H100)
    down = _gemm(tokens, cfg.hidden, dense.ffn_hidden / t, H100)
    assert redo(dense, ("mlp",)) == pytest.approx(up + down)
    assert redo(moe, ("mlp",)) == 0.0
    extra = hardware_flops_per_token(
        cfg, "selective", modules=("mla_up_proj", "mlp")
    ) - hardware_flops_per_token(cfg, "none")
    ups = 2 * (cfg.q_lora_rank * 128 * 192 + cfg.kv_lora_rank * 128 * 256)
    mlps = 2 * 3 * cfg.hidden * dense.ffn_hidden
    assert extra == pytest.approx(cfg.n_layers * ups + 3 * mlps)


def test_modules_are_refused_where_they_have_nothing_to_recompute():
    """mla_up_proj needs a latent attention, mlp a dense block; both are counted as
    Megatron-Core keeps its blocks; paracube train recomputes the attention core alone; the
    names are Megatron's, checked as the Layout is made."""
    llama = preset("llama3-8b")
    mla = Layout(dp=8, recompute="selective", recompute_modules=("mla_up_proj",),
                 activations="megatron")  # fmt: skip
    assert "no latent attention" in mla.recompute_modules_refusal(llama)
    all_moe = preset("qwen3-30b-a3b")
    mlp = Layout(dp=8, ep=8, recompute="selective", recompute_modules=("mlp",),
                 activations="megatron")  # fmt: skip
    assert "every block is a mixture" in mlp.model_refusal(all_moe)
    mine = Layout(dp=8, recompute="selective", recompute_modules=("mlp",))
    assert "planned as Megatron-Core keeps its blocks" in mine.model_refusal(llama)
    assert mine.replace(recompute="full").model_refusal(llama) == ""  # only under selective
    with pytest.raises(ConfigError, match="not what paracube train runs"):
        mine.to_args()
    assert "has no experts" in mine.replace(recompute_modules=("moe_act",)).model_refusal(llama)
    assert "no shared experts" in mine.replace(recompute_modules=("shared_experts",)).model_refusal(
        llama
    )
    for bad in (("moe_router",), (), ("mlp", "mlp"), "mlp"):
        with pytest.raises(ConfigError, match="a tuple of distinct modules"):
            Layout(dp=8, recompute_modules=bad)
    read_back = Layout(dp=8, recompute_modules=["core_attn", "mlp"])  # a layout from JSON
    assert read_back.recompute_modules == ("core_attn", "mlp") and hash(read_back)


def test_megatron_gets_the_modules_and_the_cli_plans_them(capsys):
    """The command carries --recompute-modules (the default core_attn left implicit); the
    CLI takes a comma list, implies --recompute selective, and refuses an unplanned module,
    another recomputation, or a stack that does not keep Megatron's blocks, in one line."""
    cfg = preset("llama3-8b")
    L = Layout(dp=8, recompute="selective", recompute_modules=("core_attn", "mlp"),
               **stack("megatron-core"))  # fmt: skip
    args = " ".join(megatron_args(L, cfg, "bf16", 64))
    assert "--recompute-granularity selective --recompute-modules core_attn mlp" in args
    plain = " ".join(megatron_args(L.replace(recompute_modules=("core_attn",)), cfg, "bf16", 64))
    assert "--recompute-modules" not in plain
    argv = ["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--top", "1",
            "--stack", "megatron-core"]  # fmt: skip
    assert main([*argv, "--recompute-modules", "mlp", "--json"]) == 0
    assert '"recompute": "selective"' in capsys.readouterr().out
    for extra, says in [
        (["--recompute-modules", "moe_router"], "give distinct modules among core_attn"),
        (["--recompute-modules", "mlp", "--recompute", "full"], "give --recompute selective"),
        (["--recompute-modules", "mla_up_proj"], "the model has no latent attention"),
    ]:
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1
    assert main([*argv[:-2], "--recompute-modules", "mlp"]) == 2
    assert "add --stack megatron-core" in capsys.readouterr().err


def test_a_latent_attentions_selective_recomputation_takes_its_up_projections():
    """Under Megatron's blocks the search recomputes a latent attention selectively with its
    up projections (the core alone would drop only the kernel's log-sum-exp); a module list
    the user gives is kept as given."""
    from paracube.planner.search import search
    from paracube.planner.time_model import Cluster

    cfg = preset("deepseek-v3", n_layers=4, dense_layers=(0,), mtp_layers=0)
    cluster = Cluster(H100, 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))
    fixed = dict(stack("megatron-core"), recompute="selective", tp=2, pp=1, ep=8, etp=1)
    found = search(cfg, cluster, 64, 64, precision="bf16", fixed=fixed, top=3)
    assert found.ranked
    assert {c.layout.recompute_modules for c in found.ranked} == {("core_attn", "mla_up_proj")}
    kept = search(cfg, cluster, 64, 64, precision="bf16", top=3,
                  fixed=dict(fixed, recompute_modules=("core_attn",)))  # fmt: skip
    assert {c.layout.recompute_modules for c in kept.ranked} == {("core_attn",)}


def test_the_element_wise_modules_drop_their_outputs_but_not_under_fp8():
    """moe_act drops each expert's activation output (the down projection's saved input:
    k · n · f/t 16-bit values), layernorm the two norms' outputs (2 · n · h/ts); under FP8
    the linears keep FP8 copies of their own, so neither drops anything. Their redo is
    memory-bound: the activation reads gate and up and writes one (3 · k · n · f/t values),
    each norm reads and writes h a token of the rank's shard."""
    from paracube.planner.time_model import elementwise_redo_time

    cfg = preset("qwen3-235b-a22b")
    n, t, k, f, h = 4096, 2, cfg.experts_per_token, cfg.ffn_hidden, cfg.hidden

    def kept(modules, fp8=False):
        return te_block_bytes(cfg, 1, t=t, sequence_parallel=True, recompute="selective",
                              modules=modules, fp8=fp8, etp=1)  # fmt: skip

    assert kept(("core_attn",)) - kept(("core_attn", "moe_act")) == pytest.approx(2 * k * n * f / t)
    assert kept(("core_attn",)) - kept(("core_attn", "layernorm")) == pytest.approx(
        2 * 2 * n * h / t
    )
    assert kept(("core_attn", "moe_act", "layernorm"), fp8=True) == kept(("core_attn",), fp8=True)
    layout = Layout(dp=8, tp=t, ep=8, etp=1, sequence_parallel=True, recompute="selective",
                    recompute_modules=("layernorm", "moe_act"))  # fmt: skip
    moved = 2 * 2 * n * h / t + 3 * k * n * f / t
    assert elementwise_redo_time(cfg, layout, H100, 2) == pytest.approx(
        moved * 2 / H100.memory_rate
    )
    assert recompute_time(cfg, layout, H100, 2, False, 0.0) == pytest.approx(
        moved * 2 / H100.memory_rate
    )


def test_a_whole_moe_layer_or_its_shared_experts_recomputed():
    """moe checkpoints a mixture's whole MoE layer (Megatron's MoELayer under
    tensor_parallel.checkpoint): it keeps only its input, and backward runs its router, its
    experts' and shared experts' GEMMs and its two forward all-to-alls again;
    shared_experts drops and redoes the shared experts alone. DeepSeek-V3's mixture at
    tp 2, EP 64 folded (etp 1), derived from the block's own terms."""
    from paracube.planner.mp_comm import ep_comm_time
    from paracube.planner.time_model import Cluster, block_costs

    cfg = preset("deepseek-v3")
    moe = _kind(cfg, True)
    n, t = 4096, 2

    def kept(modules):
        return te_block_bytes(moe, 1, t=t, sequence_parallel=True, recompute="selective",
                              modules=modules, etp=1)  # fmt: skip

    everything = kept(("core_attn",))
    # a dense block whose MLP is recomputed keeps the same norms and attention, no MLP
    attention_only = te_block_bytes(_kind(cfg, False), 1, t=t, sequence_parallel=True,
                                    recompute="selective", modules=("core_attn", "mlp"))  # fmt: skip
    assert kept(("core_attn", "moe")) == pytest.approx(attention_only)
    s = moe.shared_expert_ffn
    assert everything - kept(("core_attn", "shared_experts")) == pytest.approx(
        (2 * 2 * n * s + 2 * n * s) / t
    )
    layout = Layout(dp=64, tp=t, ep=64, etp=1, sequence_parallel=True, recompute="selective",
                    recompute_modules=("moe",), ep_dispatch="deepep")  # fmt: skip
    cluster = Cluster(H100, 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))
    from paracube.models import shapes

    gemms = shapes.moe_layer_gemms(moe, n, t, 64, 1)
    assert len(gemms) == 1 + 2 * (256 // 64) + 2  # the router, 4 experts' two, the shared two
    redo = sum(_gemm(m, nn, k, H100) for m, nn, k in gemms)
    expected = redo + ep_comm_time(moe, layout, cluster) / 2
    assert block_costs(moe, layout, cluster, 2, False).redo == pytest.approx(expected)
    extra = hardware_flops_per_token(cfg, "selective", modules=("moe",)) - hardware_flops_per_token(
        cfg, "none"
    )
    assert extra == pytest.approx(58 * 2 * shapes.moe_layer_active_params(moe))


def test_a_replayed_mlp_or_moe_layer_gathers_and_scatters_again():
    """Under tensor parallelism the replayed modules' forward collectives run again: a dense
    MLP's all-gather + reduce-scatter pair under sequence parallelism (one ring of b·s·h
    values), a mixture's MoE layer's dispatcher collectives (k + 1/t rings) and its shared
    experts' pair, none when the experts are folded at etp 1 but the shared experts'. The
    attention core and the latent up projections gather nothing again. Checked as the
    difference each module makes to one block's collectives, in rings of the cluster's own
    link."""
    from paracube.planner.collectives import ring
    from paracube.planner.mp_comm import block_tp_comm
    from paracube.planner.time_model import Cluster

    cfg = preset("deepseek-v3")
    moe, dense = _kind(cfg, True), _kind(cfg, False)
    t, n = 2, 4096
    cluster = Cluster(H100, 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))
    one_ring = ring(n * cfg.hidden * 2, t, cluster.intra) * cluster.intra.pair_cost_ratio

    def comm(kind, modules, etp=0):
        layout = Layout(dp=8, tp=t, ep=8 if kind.moe else 1, etp=etp, sequence_parallel=True,
                        recompute="selective", recompute_modules=modules)  # fmt: skip
        return block_tp_comm(kind, layout, cluster, 2)

    base = ("core_attn", "mla_up_proj")
    assert comm(dense, base + ("mlp",)) - comm(dense, base) == pytest.approx(one_ring)
    k = moe.experts_per_token
    assert comm(moe, base + ("moe",)) - comm(moe, base) == pytest.approx((k + 1 / t + 1) * one_ring)
    assert comm(moe, base + ("moe",), etp=1) - comm(moe, base, etp=1) == pytest.approx(one_ring)
    assert comm(moe, base + ("shared_experts",)) - comm(moe, base) == pytest.approx(one_ring)
    assert comm(moe, base + ("layernorm", "moe_act")) == pytest.approx(comm(moe, base))
