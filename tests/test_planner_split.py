"""Megatron's pipeline split in the planner (pure math): every virtual stage holds the same
number of blocks and the embedding and head come on top, where paracube's engine gives a
heavy head fewer blocks beside it — so a published Megatron run is timed with the split it
ran, and a large vocabulary slows its last rank as it slowed the run."""

from __future__ import annotations

import pytest

from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.models.presets import preset
from paracube.planner import hardware as hw
from paracube.planner.layout import Layout
from paracube.planner.search import search
from paracube.planner.stacks import search_options, stack
from paracube.planner.stages import even_shares, layout_shares, torchtitan_shares
from paracube.planner.time_model import Cluster, estimate, head_time, layer_time


def _h100() -> Cluster:
    return Cluster(hw.gpu("h100"), 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))


def test_even_split_is_megatrons():
    """Llama 3 70B at pp 8 × 5 chunks: 80 blocks in 40 virtual stages of 2, stage k on rank
    k mod 8 (rank 0: blocks 0–1, 16–17, …), the embedding on rank 0 and the head on rank 7.
    With the embedding and the loss counted as blocks (405B at pp 8 × 8: 128 units in 64
    stages of 2), the first and last stages hold one block, so ranks 0 and 7 hold 15."""
    shares = even_shares(preset("llama3-70b"), 8, 5)
    assert [len(s.blocks) for s in shares] == [10] * 8
    assert shares[0].blocks == tuple(b for k in range(0, 40, 8) for b in (2 * k, 2 * k + 1))
    assert [s.embedding for s in shares] == [True] + [False] * 7
    assert [s.head for s in shares] == [False] * 7 + [True]
    ends = even_shares(preset("llama3-405b"), 8, 8, ends=True)
    assert [len(s.blocks) for s in ends] == [15] + [16] * 6 + [15]
    assert ends[0].blocks[:3] == (0, 15, 16) and ends[7].blocks[-1] == 125
    assert sorted(b for s in ends for b in s.blocks) == list(range(126))


def test_even_split_refuses_counts_that_do_not_divide():
    """Megatron refuses a layer count that pp × chunks do not divide: the planner says why,
    and its search rejects those layouts with the reason rather than timing another split."""
    with pytest.raises(ConfigError, match="126 blocks into pp × chunks = 64 equal parts"):
        even_shares(preset("llama3-405b"), 8, 8)
    result = search(
        preset("llama3-405b"),
        _h100(),
        1024,
        512,
        fixed=dict(tp=8, pp=8, chunks=8, schedule="interleaved-1f1b", split="even"),
    )
    assert not result.ranked
    assert "--pipeline-split even: the layers do not divide into pp × chunks" in result.rejected


def test_a_megatron_stack_also_tries_the_split_that_counts_the_ends():
    """Megatron-Core can count the embedding and the loss as a block each, so a plan for its
    stacks tries that split beside the plain one: Llama 3 405B's 126 blocks pipeline over
    Meta's 16 stages only so (128 layers, 8 a rank: the first and last rank 7 blocks),
    where the plain split refuses every 16-stage layout; a split the user chose is the only
    one planned; and where both splits cut alike (2 stages, no chunks) the layout is one
    candidate, not two."""
    cfg, h100 = preset("llama3-405b"), _h100()
    fixed = stack("megatron-core") | dict(tp=8, pp=16, dp=128, micro_batch=1)
    plain = search(cfg, h100, 16384, 2048, fixed=fixed, top=3)
    assert not plain.ranked
    assert any(r.startswith("--pipeline-split even:") for r in plain.rejected)
    both = search(cfg, h100, 16384, 2048, fixed=fixed, top=3, **search_options("megatron-core"))
    assert both.ranked and {c.layout.split for c in both.ranked} == {"even-ends"}
    shares = layout_shares(cfg, both.ranked[0].layout)
    per_rank = (126 + 2) // 16  # layers a rank holds, the embedding and the loss counted
    assert [len(s.blocks) for s in shares] == [per_rank - 1] + [per_rank] * 14 + [per_rank - 1]
    assert sorted(b for s in shares for b in s.blocks) == list(range(126))
    chosen = search(cfg, h100, 16384, 2048, fixed=fixed, top=3,
                    **search_options("megatron-core", split_chosen=True))  # fmt: skip
    assert not chosen.ranked
    two = stack("megatron-core") | dict(tp=8, pp=2, schedule="1f1b", micro_batch=1, zero=1)
    alike = search(preset("llama3-70b"), h100, 64, 128, fixed=two, top=50,
                   **search_options("megatron-core"))  # fmt: skip
    assert alike.ranked and {c.layout.split for c in alike.ranked} == {"even"}


def test_torchtitans_split_deals_the_layers_as_evenly_as_they_go():
    """torchtitan counts the embedding and the norm + head as a layer each and deals the
    L + 2 layers over pp × chunks stages, the first stages taking what does not divide, stage
    k on rank k mod pp: Llama 3 8B (32 blocks, 34 layers) on 4 ranks × 2 chunks is stages of
    4, 5, 4, 4, 4, 4, 4, 3 blocks — ranks of 8, 9, 8, 7 — where Megatron's even split needs
    pp × chunks to divide. A --stack torchtitan plan pipelines so, on 5 stages too; more
    stages than layers are refused with the reason."""
    cfg = preset("llama3-8b")
    shares = torchtitan_shares(cfg, 4, 2)
    assert [len(s.blocks) for s in shares] == [8, 9, 8, 7]
    assert shares[0].blocks == (0, 1, 2, 3, 17, 18, 19, 20) and shares[0].embedding
    assert shares[3].head and shares[3].blocks[-1] == 31
    assert sorted(b for s in shares for b in s.blocks) == list(range(32))
    with pytest.raises(ConfigError, match="torchtitan's split gives every one of"):
        torchtitan_shares(cfg, 35)
    with pytest.raises(ConfigError, match="32 blocks into pp × chunks = 5"):
        even_shares(cfg, 5)
    fixed = stack("torchtitan") | dict(tp=1, pp=5, zero=0, schedule="1f1b", micro_batch=1)
    best = search(cfg, _h100(), 40, 320, fixed=fixed, top=1).ranked[0]
    assert best.layout.split == "torchtitan"
    assert [len(s.blocks) for s in layout_shares(cfg, best.layout)] == [6, 7, 7, 7, 5]


def test_a_heavy_head_slows_megatrons_last_rank():
    """Nemotron 22B's shape (40 blocks of 6144, 256,000 tokens: its head weighs 3.5 blocks)
    at tp 2 × pp 4 × 10 chunks, one block per virtual stage: Megatron's last rank runs its
    10 blocks and the head, so its compute is m × (10 blocks + head) exactly and the step is
    slower than under paracube's cut, which gives that rank fewer blocks."""
    cfg = ModelConfig(n_layers=40, hidden=6144, n_heads=48, vocab_size=256000, seq_len=4096,
                      position="rope", bias=False)  # fmt: skip
    assert shapes.head_params(cfg) > 3 * shapes.block_params(cfg)
    cluster = _h100()
    base = dict(tp=2, pp=4, dp=1, micro_batch=2, microbatches=16, chunks=10,
                schedule="interleaved-1f1b", sequence_parallel=True,
                grad_accumulation="fused")  # fmt: skip
    even, engine = Layout(**base, split="even"), Layout(**base)
    assert len(layout_shares(cfg, engine)[-1].blocks) < 10
    fwd, bwd, _ = layer_time(cfg, even, cluster.gpu)
    head = head_time(cfg, even, cluster.gpu)
    slow, fast = estimate(cfg, even, cluster), estimate(cfg, engine, cluster)
    assert slow.compute == pytest.approx(16 * (10 * (fwd + bwd) + head))
    assert slow.compute > fast.compute and slow.step_time > fast.step_time


def test_the_split_is_planned_only():
    """A misspelt split is refused where the Layout is made, and a Megatron split is never
    turned into a paracube train command (the engine cuts by --balance)."""
    with pytest.raises(ConfigError, match="split 'uniform': choose one of engine, even"):
        Layout(split="uniform")
    with pytest.raises(ConfigError, match="paracube train cuts its stages by --balance"):
        Layout(pp=2, split="even").to_args()
    with pytest.raises(ConfigError, match="paracube train cuts its stages by --balance"):
        Layout(pp=2, split="Et|tL").to_args()
    assert "--pp 1" in Layout(split="even").to_args()  # no pipeline: nothing to split


def test_even_ends_split_allows_a_stage_per_layer_embedding_and_loss_included():
    """Under the even-ends split the embedding and the loss count as layers, so a pipeline
    may have L + 2 stages (BLOOM's reshaping run: 70 blocks on pp 72, the first stage holding
    only the embedding); beyond the layers a fixed pp is refused with the reason."""
    from paracube.planner.published import bloom

    cfg = bloom()
    jean_zay = hw.interconnect("opa-4x100")
    cluster = Cluster(hw.gpu("a100-80gb"), 8, hw.interconnect("nvlink3"), jean_zay)
    fixed = dict(dp=4, tp=1, pp=72, micro_batch=1, zero=1, recompute="full", split="even-ends")
    best = search(cfg, cluster, 288, 2048, fixed=fixed, top=1).ranked[0]
    shares = layout_shares(cfg, best.layout)
    assert [len(s.blocks) for s in shares] == [0] + [1] * 70 + [0]
    engine = search(cfg, cluster, 288, 2048, fixed=dict(fixed, split="engine"), top=1)
    assert not engine.ranked
    assert any(
        "pp=72 is more pipeline stages than the model's 70 layers" in r for r in engine.rejected
    )


def test_another_stacks_software_is_planned_not_emitted():
    """The facts that describe another stack (Megatron's fused loss and blocks, MPT's Triton
    attention, FSDP1's unprefetched gathers, a reduction left until after the backward,
    userbuffers) time published runs; a paracube train command is never made from them."""
    for other in (
        dict(loss="fused"),
        dict(activations="megatron"),
        dict(attention="fused-triton"),
        dict(backward_prefetch=False, zero=3),
        dict(overlap_grad_reduce=False),
        dict(tp_comm_overlap=True, tp=2),
    ):
        with pytest.raises(ConfigError, match="another stack's software"):
            Layout(**other).to_args()
    assert "--dp 1" in " ".join(Layout().to_args())


def test_the_recomputed_count_is_the_recomputed_blocks():
    """The count a search asks for every rank (stages.recomputed_blocks, a bisection over
    the rank's blocks in order) is the number of blocks recomputed_indices names, under
    every split and chunk count: each split deals a rank's blocks in ascending order."""
    from paracube.planner.stages import can_cut, recomputed_blocks, recomputed_indices

    cfg = preset("llama3-8b")  # 32 blocks
    for split in ("engine", "even", "even-ends", "torchtitan", "E" + "tttt|" * 7 + "ttttL"):
        for pp, chunks in ((2, 1), (4, 2), (8, 1), (2, 4)):
            layout = Layout(dp=1, pp=pp, chunks=chunks, split=split, recompute="full",
                            recompute_blocks=13)  # fmt: skip
            if not can_cut(cfg, split, pp, chunks):
                continue  # even-ends: 34 units; the explicit layout: 8 stages
            for share in layout_shares(cfg, layout):
                assert list(share.blocks) == sorted(share.blocks)
                assert recomputed_blocks(share, layout) == len(recomputed_indices(share, layout))
