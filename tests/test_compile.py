"""``paracube train --compile``: the GPT's blocks under torch.compile train as the eager
blocks do, and keep for backward what the planner counts for compiled blocks
(``--activations compiled``: models.shapes.block_saved_bytes, compiled)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from paracube.config import TrainConfig
from paracube.errors import ConfigError
from paracube.models.presets import preset
from paracube.models.shapes import rotary_table_bytes
from paracube.pipeline.schedules import get_schedule
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import stage_memory
from tests.helpers import assert_losses_close
from tests.test_cli import error_line
from tests.test_zero import run_engine, zcfg

# Llama's block at nano's size — RMSNorm, SwiGLU, rotary positions, grouped-query attention
# with four query heads a key head (Llama 3 8B's): the shape whose compiled block keeps less
# than its eager one
LLAMA = replace(
    preset("nano", seq_len=16, n_layers=4),
    norm="rmsnorm",
    activation="swiglu",
    position="rope",
    bias=False,
    ffn_hidden=96,
    n_kv_heads=1,
)
# Qwen3's block: heads twice hidden ÷ heads wide, and per-head q and k norms
QWEN3 = replace(LLAMA, head_size=32, qk_norm=True)
# the same with two key heads, one a tensor-parallel rank
LLAMA_KV2, QWEN3_KV2 = replace(LLAMA, n_kv_heads=2), replace(QWEN3, n_kv_heads=2)


def _train(pools, cfg: TrainConfig):
    """Per-step losses and the first rank's last metrics record."""
    ranks = cfg.parallel.dp * cfg.parallel.pp * cfg.parallel.tp
    losses, _, metrics = pools(ranks).run(run_engine, cfg)[0]
    return losses, metrics[-1]


def _planned(cfg: TrainConfig) -> float:
    """The planner's first-stage activations for the layout ``cfg`` runs, + 8·b per
    micro-batch in flight: the token ids are a view of the sampler's (b, T + 1) window, one
    column wider (as test_zero's single-stage and pipeline counts) — except under tensor
    parallelism, whose vocabulary-parallel embedding keeps its own shifted ids (as
    test_zero's tensor-parallel counts)."""
    par = cfg.parallel
    in_flight = get_schedule(par.schedule).in_flight(par.pp, cfg.grad_accum, 1, stage=0)
    planned = stage_memory(cfg.model, Layout.from_config(cfg), cfg.precision)[0].activations
    return planned + (8 * cfg.micro_batch * in_flight if par.tp == 1 else 0)


@pytest.mark.parametrize(
    "layout",
    [
        dict(dp=2),
        dict(dp=1, pp=2, accum=4),
        dict(dp=2, recompute="full"),
        dict(dp=2, zero=3),
        dict(dp=2, model=QWEN3),
        dict(dp=1, tp=2, model=LLAMA_KV2),
        dict(dp=1, tp=2, sp=True, model=QWEN3_KV2),
        dict(dp=1, tp=2, sp=True, recompute="full", model=LLAMA_KV2),
    ],
    ids=[
        "dp2",
        "pp2",
        "dp2-full-recompute",
        "dp2-zero3",
        "dp2-qwen3",
        "tp2",
        "tp2-sp-qwen3",
        "tp2-sp-full-recompute",
    ],
)
def test_compiled_blocks_train_as_eager_and_keep_what_the_planner_counts(pools, layout):
    """Inductor's partitioner without code generation (``--compile partition``): the same
    losses as the eager blocks — under ZeRO-3 too, its gathers in the hooks around the
    compiled forward, and under tensor and sequence parallelism, their collectives eager
    between the compiled regions — and counted activation peaks — the first stage's under a
    pipeline, whose blocks hold two micro-batches but one copy of their rotary tables —
    equal to the planner's for the layout each job runs (Layout.from_config: activations
    "compiled" or "paracube"), the compiled one the lower where nothing is recomputed; a
    Qwen3 block's q and k norms keep their rstd alone compiled."""
    rest = {k: v for k, v in layout.items() if k not in ("zero", "model")}
    model = layout.get("model", LLAMA)
    eager = zcfg(layout.get("zero", 0), steps=3, model=model, **rest)
    compiled = replace(eager, compile="partition")
    assert Layout.from_config(compiled).activations == "compiled"
    want, eager_last = _train(pools, eager)
    got, last = _train(pools, compiled)
    assert_losses_close(got, want)
    eager_peak, peak = eager_last.memory["activations_peak"], last.memory["activations_peak"]
    assert eager_peak == _planned(eager)
    if eager.recompute == "full" and eager.parallel.tp > 1:
        # the checkpointed forward holds graph breaks (the tensor-parallel collectives), so
        # dynamo runs the checkpoint itself eager around the compiled regions: the block's
        # input alone, as eager
        assert peak == _planned(compiled) == eager_peak
    elif eager.recompute == "full":
        # each block's input, as eager, and per block constants the formula leaves out —
        # the rotary tables and the random-number state its checkpoint restores
        tables = rotary_table_bytes(model, 4)
        assert peak == _planned(compiled) + model.n_layers * (
            tables + torch.get_rng_state().numel()
        )
    else:
        assert peak == _planned(compiled) < eager_peak


def test_inductor_compiled_blocks_train_as_eager(pools):
    """The real backend, code generated for this CPU: the same losses to float32's
    tolerance and the same counted peak as the partitioner alone (under tensor parallelism
    too: ``benchmarks/bench_compile.py --parallel tp``, whose code generation for the
    regions between the collectives takes 20 s here)."""
    eager = zcfg(0, dp=1, accum=1, steps=2, model=LLAMA)
    want, _ = _train(pools, eager)
    got, last = _train(pools, replace(eager, compile="inductor"))
    assert_losses_close(got, want)
    assert last.memory["activations_peak"] == _planned(replace(eager, compile="inductor"))


@pytest.mark.parametrize(
    ("changes", "refusal"),
    [
        (dict(recompute="selective"), "--compile inductor with --recompute selective"),
        (dict(compile="max-autotune"), "unknown --compile 'max-autotune'"),
    ],
)
def test_what_compile_cannot_run_is_refused_before_anything_runs(changes, refusal):
    with pytest.raises(ConfigError, match=refusal):
        TrainConfig(**{"model": LLAMA, "compile": "inductor", **changes})


def test_the_planner_emits_compile_only_for_layouts_train_compiles():
    assert "--compile inductor" in Layout(dp=2, activations="compiled").to_args("fp32")
    assert "--compile" not in " ".join(Layout(dp=2).to_args("fp32"))
    assert {"--compile inductor", "--tp 2"} <= set(Layout(tp=2, activations="compiled").to_args())
    with pytest.raises(ConfigError, match="another stack's software"):
        Layout(activations="megatron").to_args()


def test_compile_refusal_from_the_command_line(capsys):
    err = error_line(
        capsys, ["train", "--model", "nano", "--recompute", "selective", "--compile", "inductor"]
    )
    assert "--compile inductor with --recompute selective" in err


def test_the_planner_refuses_what_it_does_not_count_compiled(capsys):
    """A compiled block is counted kept whole or fully recomputed: the search does not
    propose the attention core's recomputation beside it, and a fixed one is refused."""
    from paracube.planner import hardware as hw
    from paracube.planner.search import search
    from paracube.planner.time_model import Cluster

    with pytest.raises(ConfigError, match="activations='compiled' with recompute='selective'"):
        Layout(activations="compiled", recompute="selective")
    node = Cluster(hw.gpu("h100"), 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))
    found = search(preset("llama3-8b"), node, 8, 64, fixed={"activations": "compiled"}, top=500)
    assert found.ranked and {c.layout.recompute for c in found.ranked} <= {"none", "full"}
    err = error_line(
        capsys,
        ["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "64",
         "--activations", "compiled", "--recompute", "selective"],
    )  # fmt: skip
    assert "activations='compiled' with recompute='selective'" in err


def test_a_compiled_runs_checkpoint_resumes_eager_under_another_layout(pools, tmp_path):
    """Compiling changes no parameter name: 3 compiled steps on dp 2, saved, resumed eager
    under ZeRO-3 for 3 more — every loss and the final parameters the serial run's."""
    from tests.test_checkpoint import STEPS, cfg_for, resume_matches_serial

    compiled = replace(cfg_for(STEPS, dp=2), compile="partition")
    resume_matches_serial(pools, tmp_path, compiled, cfg_for(STEPS, dp=2, zero=3))
