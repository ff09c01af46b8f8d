"""An explicit pipeline layout in Megatron-Core's grammar (``--pipeline-split 'Et|(tt|)*30mL'``,
Megatron's --pipeline-model-parallel-layout): parsed as Megatron parses it, each rank timed
and sized with the blocks the layout gives it, the search held to its pp × chunks, the
command carrying it, and a layout that does not fit the model refused with the reason."""

from __future__ import annotations

import itertools
import re

import pytest

from paracube.cli import main
from paracube.errors import ConfigError
from paracube.models.presets import preset
from paracube.planner import hardware as hw
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import peak_memory, stage_memory
from paracube.planner.megatron import megatron_args
from paracube.planner.pipeline_layout import stages_of
from paracube.planner.search import search
from paracube.planner.stacks import stack
from paracube.planner.stages import even_shares, layout_shares
from paracube.planner.time_model import Cluster, estimate

DEEPSEEK_H100 = "Et|(tt|)*30mL"  # Megatron-Bridge's DeepSeek-V3 layout on PP 8 × VP 4


def _h100() -> Cluster:
    return Cluster(hw.gpu("h100"), 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))


def test_the_grammar_is_megatrons():
    """Repetitions of a unit and of a group (nested too) unroll, commas and spaces are only
    for the eye, ``|`` separates the virtual stages, and an empty stage is a stage."""
    assert stages_of("Et|(tt|)*2,mL") == ("Et", "tt", "tt", "mL")
    assert stages_of("E, t*3 | ((t|)*2)*2 L") == ("Ettt", "t", "t", "t", "t", "L")
    assert stages_of("E||tL") == ("E", "", "tL")
    assert (
        len(stages_of(DEEPSEEK_H100)) == 32 and "".join(stages_of(DEEPSEEK_H100)).count("t") == 61
    )


@pytest.mark.parametrize(
    "text, reason",
    [
        ("Etx|L", "'x' is no unit"),
        ("E(tt|L", "a '(' is not closed"),
        ("Et)|L", "a ')' stands where"),
        ("tE|L", "the embedding (E) comes once, first"),
        ("Et|L|t", "the loss (L) comes once, last"),
        ("Em|tL", "come after every block (t), as Megatron-Core requires"),
    ],
)
def test_a_malformed_layout_is_refused_with_the_grammar(text, reason):
    """A layout Megatron would not parse is refused at construction, naming the text, what
    is wrong and — where the grammar is — how to write one."""
    with pytest.raises(ConfigError, match=re.escape(reason)) as refused:
        Layout(dp=1, pp=2, split=text)
    assert repr(text) in str(refused.value)
    assert "Megatron's layout" in str(refused.value) or "Megatron-Core requires" in reason


def test_each_rank_holds_the_stages_k_mod_pp():
    """DeepSeek-V3's H100 layout on pp 8 × 4 chunks: the 32 stages hold 1, 2 × 30 and 0
    blocks, stage k on rank k mod 8 — rank 0 the embedding and 7 blocks, ranks 1–6 8 each,
    rank 7 six and the loss — the blocks numbered in the order the stages name them."""
    cfg = preset("deepseek-v3")
    sizes = [1] + [2] * 30 + [0]
    starts = list(itertools.accumulate([0] + sizes))
    expected = [
        tuple(b for k in range(r, 32, 8) for b in range(starts[k], starts[k] + sizes[k]))
        for r in range(8)
    ]
    shares = layout_shares(cfg, Layout(dp=64, tp=2, pp=8, chunks=4, split=DEEPSEEK_H100))
    assert [s.blocks for s in shares] == expected
    assert [len(b) for b in expected] == [7, 8, 8, 8, 8, 8, 8, 6]
    assert [s.embedding for s in shares] == [True] + [False] * 7
    assert [s.head for s in shares] == [False] * 7 + [True]


def test_a_layout_that_cuts_evenly_is_the_even_split():
    """Written out, Megatron's even split (24 blocks over pp 4 × 2 chunks: 3 a stage) is the
    same cut, so the same step time and memory — the layout changes only who holds what."""
    cfg = preset("gpt3-1.3b")
    text = "E" + "ttt|" * 7 + "tttL"
    assert layout_shares(cfg, Layout(dp=2, pp=4, chunks=2, split=text)) == even_shares(cfg, 4, 2)
    base = dict(dp=2, pp=4, chunks=2, schedule="interleaved-1f1b", microbatches=8)
    even, written = Layout(**base, split="even"), Layout(**base, split=text)
    assert estimate(cfg, written, _h100()) == estimate(cfg, even, _h100())
    assert peak_memory(cfg, written) == peak_memory(cfg, even)


def test_an_uneven_layout_relieves_the_heads_rank():
    """Three of four blocks beside the embedding and one beside the head, which weighs about
    two blocks at GPT-2's vocabulary: the first rank holds a block's states more than under
    the even split and the last a block's less, and the busiest rank — the head's under the
    even split — has less to do, so the step's work is less (why DeepSeek-V3's layout gives
    its last stage one block fewer)."""
    cfg = preset("gpt3-1.3b", n_layers=4)
    base = dict(dp=1, pp=2, microbatches=4)
    even, heavy = Layout(**base, split="even"), Layout(**base, split="Ettt|tL")
    (even0, even1), (heavy0, heavy1) = stage_memory(cfg, even), stage_memory(cfg, heavy)
    block = heavy0.model_states - even0.model_states
    assert block > 0 and even1.model_states - heavy1.model_states == pytest.approx(block)
    assert estimate(cfg, heavy, _h100()).compute < estimate(cfg, even, _h100()).compute


def test_a_layout_that_does_not_fit_the_model_or_the_layout_is_refused():
    """The blocks named once each, the multi-token prediction modules beside the loss, the
    stages pp × chunks: otherwise the reason, before any timing."""
    cfg = preset("deepseek-v3")
    wrong_blocks = Layout(dp=64, tp=2, pp=8, chunks=4, sequence_parallel=True, ep=64,
                          split="Et|(tt|)*29,t|mL")  # fmt: skip
    assert "holds 60 blocks (t) and the model has 61" in wrong_blocks.model_refusal(cfg)
    with pytest.raises(ConfigError, match="holds 60 blocks"):
        estimate(cfg, wrong_blocks, _h100())
    apart = Layout(dp=64, tp=2, pp=8, chunks=4, sequence_parallel=True, ep=64,
                   split="Et|(tt|)*29,ttm|L")  # fmt: skip
    assert "stand apart from the loss" in apart.model_refusal(cfg)
    wrong_count = Layout(dp=64, tp=2, pp=8, chunks=2, sequence_parallel=True, ep=64,
                         split=DEEPSEEK_H100)  # fmt: skip
    assert "names 32 stages and pp × chunks = 16" in wrong_count.model_refusal(cfg)
    no_mtp = preset("deepseek-v3", mtp_layers=0)
    assert "holds 1 multi-token prediction modules" in Layout(
        dp=64, tp=2, pp=8, chunks=4, sequence_parallel=True, ep=64, split=DEEPSEEK_H100
    ).model_refusal(no_mtp)


def test_the_search_holds_to_the_layouts_stages():
    """A plan with a layout of 8 stages tries only pp × chunks = 8: pp 8 alone, pp 4 × 2 and
    pp 2 × 4 chunks (interleaved), never pp 1 or a count the layout does not give."""
    cfg = preset("gpt3-1.3b")  # 24 blocks
    text = "E" + "ttt|" * 7 + "tttL"
    result = search(cfg, _h100(), 16, 64, fixed=dict(split=text, tp=1), top=100)
    shapes = {(c.layout.pp, c.layout.chunks) for c in result.ranked}
    assert shapes and shapes <= {(8, 1), (4, 2), (2, 4)}
    assert any("names 8 stages = pp × chunks" in reason for reason in result.rejected)


def test_the_command_carries_the_layout_for_megatron(capsys):
    """Megatron-LM takes the layout whole (its --pipeline-model-parallel-layout, which sets
    the virtual stages itself: neither --num-virtual-stages-per-pipeline-rank nor the
    split's ends are given beside it), quoted for the shell."""
    cfg = preset("gpt3-1.3b")
    text = "E" + "ttt|" * 7 + "tttL"
    L = Layout(dp=2, pp=4, chunks=2, microbatches=8,
               **{**stack("megatron-core"), "schedule": "interleaved-1f1b", "split": text})  # fmt: skip
    args = " ".join(megatron_args(L, cfg, "bf16", 16))
    assert f"--pipeline-model-parallel-layout '{text}'" in args
    assert "--num-virtual-stages-per-pipeline-rank" not in args
    argv = ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "64", "--top", "1",
            "--layout", "tp=1,pp=4", "--pipeline-split", text, "--emit", "megatron"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| pp=4 b=" not in out and f"×2 split={text}".replace("|", "\\|") in out
    assert f"--pipeline-model-parallel-layout '{text}'" in out.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "split, says",
    [
        ("Etq|L", "'q' is no unit"),
        ("E" + "tt|" * 11 + "tL", "holds 23 blocks (t) and the model has 24"),
    ],
)
def test_the_cli_refuses_a_bad_layout_in_one_line(capsys, split, says):
    argv = ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "64",
            "--pipeline-split", split]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_deepseek_v3s_published_run_is_planned_with_its_layout():
    """Megatron-Bridge's DeepSeek-V3 run on 1,024 H100s (published.py, its 25.09 table) is
    timed with the recipe's layout — pp 8 × 4 chunks from its 32 stages — and lands within
    the ±30 % every run but the named ones keeps (BENCHMARKS.md: 0.78, the all-to-alls over
    InfiniBand two-fifths of its predicted step)."""
    from paracube.planner.published import _deepseek_v3, evaluate

    (row,) = _deepseek_v3()
    assert row["fixed"]["split"] == DEEPSEEK_H100
    result = evaluate(row)
    assert (result["layout"], result["chunks"]) == ("2×8×64", 4)
    assert abs(result["ratio"] - 1) <= 0.30
