"""ZeRO 1/2/3, their compositions with tensor and pipeline parallelism, activation
recomputation and mixed precision: parity with the serial run, and counted memory
against the ZeRO and activation formulas."""

from __future__ import annotations

import functools

import pytest
import torch

from paracube.config import ParallelConfig, TrainConfig
from paracube.models.presets import preset
from paracube.planner.memory import model_state_bytes
from tests.helpers import (
    LLAMA_BLOCK,
    SEQ,
    assert_losses_close,
    assert_params_close,
    serial_reference,
    small_corpus,
    train_config,
)

NANO = preset("nano", seq_len=SEQ)
TIED = preset("nano", seq_len=SEQ, tie_embeddings=True)
DEEP = preset("nano", seq_len=SEQ, n_layers=4)
GLOBAL = 8  # sequences per step in every case below
CLIP = 0.5  # below the nano model's early gradient norms (~1–3), so clipping is exercised


def zcfg(
    zero=0,
    dp=2,
    tp=1,
    pp=1,
    sp=False,
    accum=2,
    steps=10,
    model=NANO,
    schedule="1f1b",
    chunks=1,
    **kw,
) -> TrainConfig:
    return TrainConfig(
        model=model,
        parallel=ParallelConfig(
            dp=dp,
            tp=tp,
            pp=pp,
            sequence_parallel=sp,
            bucket_mb=0.1,
            schedule=schedule,
            chunks=chunks,
        ),
        steps=steps,
        micro_batch=GLOBAL // (dp * accum),
        grad_accum=accum,
        warmup_steps=2,
        progress=False,
        grad_clip=CLIP,
        zero=zero,
        **kw,
    )


@functools.cache
def serial(steps: int, model=NANO):
    cfg = train_config(dp=1, micro_batch=GLOBAL, steps=steps, grad_clip=CLIP, model=model)
    return serial_reference(cfg, small_corpus())


def run_engine(cfg):
    """Train; return losses, every parameter at full size under serial names, the metrics."""
    from paracube.engine import Trainer
    from paracube.mesh.mesh import ProcessMesh
    from paracube.tensor_parallel import full_tensor

    trainer = Trainer(cfg, ProcessMesh(cfg.parallel), small_corpus())
    metrics = [trainer.train_step() for _ in range(cfg.steps)]
    with trainer.gathered_parameters():
        params = {
            n: full_tensor(p, p, trainer.tp_group).to(torch.promote_types(p.dtype, torch.float32))
            for n, p in trainer.serial_named_parameters()
        }
    return [m.loss for m in metrics], params, metrics


def _check_parity(results, steps, model=NANO):
    want_losses, want_params = serial(steps, model)
    merged = {}
    for losses, params, _ in results:
        assert_losses_close(losses, want_losses)
        merged.update(params)
    if "head.weight" in merged and "head.weight" not in want_params:  # tied, split over stages
        assert torch.equal(merged.pop("head.weight"), merged["embed.tok.weight"])
    for _, _, metrics in results:
        assert max(m.grad_norm for m in metrics) > CLIP  # clipping really happened
    assert_params_close(merged, want_params, tol=1e-5, tensor_tol=3e-4)


@pytest.mark.parametrize("zero", [1, 2, 3])
@pytest.mark.parametrize("dp", [2, 4])
def test_zero_matches_serial(pools, zero, dp):
    """ZeRO stages with accumulation (2 micro-steps) and clipping: 10 steps, loss per step
    and all parameters within 1e-5 of the serial run."""
    cfg = zcfg(zero, dp=dp)
    _check_parity(pools(dp).run(run_engine, cfg), cfg.steps)


CASES = {
    "zero1-pp2": dict(zero=1, pp=2, accum=4),
    "zero2-pp2": dict(zero=2, pp=2, accum=4),
    "zero1-tp2-sp": dict(zero=1, tp=2, sp=True),
    "zero2-tp2-sp": dict(zero=2, tp=2, sp=True),
    "zero3-tp2": dict(zero=3, tp=2),
    "zero3-tp2-sp": dict(zero=3, tp=2, sp=True),
    "zero2-tp2-pp2": dict(zero=2, dp=1, tp=2, pp=2, accum=4),
    "zero1-dp2-tp2-pp2-sp": dict(zero=1, tp=2, pp=2, sp=True, accum=4),
    "zero3-tied": dict(zero=3, model=TIED),
    "zero2-pp2-tied": dict(zero=2, pp=2, accum=4, model=TIED),
    "zero1-pp2-zb-h1-full-recompute": dict(
        zero=1, pp=2, accum=4, schedule="zb-h1", recompute="full"
    ),
    "zero2-pp2-interleaved-selective": dict(
        zero=2,
        pp=2,
        accum=4,
        schedule="interleaved-1f1b",
        chunks=2,
        recompute="selective",
        model=DEEP,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_zero_composes_with_tensor_and_pipeline(pools, case):
    cfg = zcfg(**{"dp": 2, **CASES[case]})
    _check_parity(pools(cfg.parallel.world_size).run(run_engine, cfg), cfg.steps, cfg.model)


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recompute_matches_serial(pools, recompute):
    cfg = zcfg(0, dp=2, recompute=recompute)
    _check_parity(pools(2).run(run_engine, cfg), cfg.steps)


def test_recompute_with_zero3(pools):
    cfg = zcfg(3, dp=2, recompute="full", model=DEEP, steps=4)
    _check_parity(pools(2).run(run_engine, cfg), cfg.steps, DEEP)


# -- memory ------------------------------------------------------------------------------


def _psi(model) -> int:
    from paracube.models.shapes import parameter_count

    return parameter_count(model)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("dp", [2, 4])
def test_model_state_bytes_equal_zero_formula(pools, zero, dp):
    """fp32 AdamW: 4Ψ weights, 4Ψ gradients, 8Ψ Adam moments (no master copy), each divided
    by dp from its ZeRO stage on (Rajbhandari et al. 2020, Fig. 1 with this run's dtypes)."""
    cfg = zcfg(zero, dp=dp, steps=2)
    psi = _psi(cfg.model)
    want = model_state_bytes(psi, zero, dp, weight_bytes=4, grad_bytes=4, optimizer_bytes=8)
    for _, _, metrics in pools(dp).run(run_engine, cfg):
        mem = metrics[-1].memory
        assert (mem["weights"], mem["gradients"], mem["optimizer"]) == (
            want.weights,
            want.gradients,
            want.optimizer,
        )


def test_bf16_model_states_equal_mixed_precision_formula(pools):
    """bf16 weights (2Ψ), fp32 gradients (4Ψ, the default --grad-reduce fp32) and fp32
    master + moments (12Ψ), ZeRO-2 over 2 ranks — the planner's figure for the same job."""
    from paracube.planner.layout import Layout
    from paracube.planner.layout_memory import stage_memory

    cfg = zcfg(2, dp=2, steps=1, precision="bf16")
    psi = _psi(cfg.model)
    want = model_state_bytes(psi, 2, 2, weight_bytes=2, grad_bytes=4, optimizer_bytes=12)
    planned = stage_memory(cfg.model, Layout.from_config(cfg), cfg.precision)[0].model_states
    assert planned == pytest.approx(want.total)
    for _, _, metrics in pools(2).run(run_engine, cfg):
        mem = metrics[-1].memory
        assert (mem["weights"], mem["gradients"], mem["optimizer"]) == (
            want.weights,
            want.gradients,
            want.optimizer,
        )


def test_zero3_peak_parameters_are_a_shard_plus_gathered_units(pools):
    """ZeRO-3 keeps Ψ/dp; at most the root unit and two blocks (one computing, one
    prefetched) are gathered at once — far below the full model for a deep one."""
    model = preset("nano", seq_len=SEQ, n_layers=8)
    cfg = zcfg(3, dp=2, steps=1, model=model)
    from paracube.models.gpt import GPT

    blocks = sum(p.numel() for p in GPT(model).blocks[0].parameters()) * 4
    full = _psi(model) * 4
    root = full - model.n_layers * blocks
    for _, _, metrics in pools(2).run(run_engine, cfg):
        peak = metrics[-1].memory["params_peak"]
        assert full // 2 + root + blocks <= peak <= full // 2 + root + 2 * blocks
        assert peak < full  # never the whole model at once


def probe_units(cfg):
    """Train; return the full gradient buffers' peak and each unit's buffer bytes."""
    from paracube.engine import Trainer
    from paracube.mesh.mesh import ProcessMesh

    trainer = Trainer(cfg, ProcessMesh(cfg.parallel), small_corpus())
    metrics = [trainer.train_step() for _ in range(cfg.steps)]
    sizes = [u.numel * u.buffer.element_size() for u in trainer.grad_sync.units]
    return metrics[-1].memory["grad_buffers_peak"], sizes


def test_sharded_gradients_are_never_whole_during_backward(pools):
    """ZeRO-2/3 free a unit's full gradient buffer when its reduce-scatter is waited for;
    one reduction stays in flight beside the next unit's backward, so a backward holds at
    most the unit being filled and the one being reduced — under ZeRO-3 beside the root
    unit (embedding, final norm, head), which fills from the head's backward to the
    embedding's: root + 2 blocks, as FSDP does. (Waited for only at the end of backward,
    every unit's buffer was alive at once: the whole model's gradients.)"""
    model = preset("nano", seq_len=SEQ, n_layers=8)
    for peak, sizes in pools(2).run(probe_units, zcfg(3, steps=2, model=model)):
        *blocks, root = sizes  # launch order: the last block first, the root last
        assert len(blocks) == model.n_layers and len(set(blocks)) == 1
        assert peak == root + 2 * blocks[0]
        assert peak < sum(sizes) / 3
    for peak, sizes in pools(2).run(probe_units, zcfg(2, steps=2, model=model)):
        # ZeRO-2's units are gradient buckets: the one just filled, the one in flight, and
        # at most one more that has begun to fill as its parameters' gradients arrive
        assert len(sizes) > 8 and peak <= 3 * max(sizes) < sum(sizes) / 3


def test_zero3_collectives_per_step_are_the_planners(pools):
    """The planner charges ZeRO-3 one ring latency per collective (time_model.
    zero3_collectives: per micro-batch a forward gather per block and one for the root, a
    backward gather per block — the root stays gathered — and a reduce-scatter per unit);
    the engine's ledger counts exactly those calls in a step of two micro-batches."""
    from paracube.planner.dp_comm import zero3_collectives

    cfg = zcfg(3, dp=2, accum=2, steps=2, model=DEEP)
    forward, backward, scatters = zero3_collectives(DEEP.n_layers)
    for _, _, metrics in pools(2).run(run_engine, cfg):
        comm = metrics[-1].comm
        assert comm["all_gather/param"]["calls"] == cfg.grad_accum * (forward + backward), comm
        assert comm["reduce_scatter/grad"]["calls"] == cfg.grad_accum * scatters, comm


def test_full_recompute_saves_over_half_the_activations(pools):
    """The engine's per-step peak equals the op-by-op formula for paracube's model, and
    full recomputation keeps less than half of it."""
    from paracube.models.shapes import model_saved_bytes

    results = {}
    for mode in ("none", "selective", "full"):
        cfg = zcfg(0, dp=2, steps=1, accum=1, recompute=mode, model=DEEP)
        results[mode] = pools(2).run(run_engine, cfg)[0][2][-1].memory["activations_peak"]
        # + 8·b: the token ids are a view of the sampler's (b, T + 1) window, one column wider
        assert (
            results[mode]
            == model_saved_bytes(DEEP, cfg.micro_batch, recompute=mode) + 8 * cfg.micro_batch
        )
    assert results["full"] <= 0.5 * results["none"]
    assert results["selective"] < results["none"]


# Qwen3's block in miniature: grouped-query heads twice hidden ÷ heads wide, q and k norms
QWEN3 = DEEP.replace(**LLAMA_BLOCK, head_size=32, qk_norm=True)


@pytest.mark.parametrize(
    ("sp", "recompute", "model"),
    [
        (False, "none", DEEP),
        (True, "none", DEEP),
        (True, "selective", DEEP),
        (True, "full", DEEP),
        (True, "none", QWEN3),
    ],
    ids=["tp2", "tp2-sp", "tp2-sp-selective", "tp2-sp-full", "tp2-sp-qwen3"],
)
def test_tensor_parallel_activations_equal_the_planners_count(pools, sp, recompute, model):
    """Under tensor parallelism (with or without sequence parallelism, and recomputing) the
    engine's counted peak of saved activations on a rank is the planner's per-stage figure
    to the byte: the blocks' shards — under sequence parallelism every kept activation 1/tp
    of the sequence —, the vocabulary-parallel embedding's and loss's per-token masks; a
    Qwen3 block's per-head q and k norms over the rank's own heads."""
    from paracube.planner.layout import Layout
    from paracube.planner.layout_memory import stage_memory

    cfg = zcfg(0, dp=1, tp=2, sp=sp, steps=1, accum=1, model=model, recompute=recompute)
    peak = pools(2).run(run_engine, cfg)[0][2][-1].memory["activations_peak"]
    planned = stage_memory(cfg.model, Layout.from_config(cfg), cfg.precision)[0].activations
    assert peak == planned


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pipeline_first_stage_activations_equal_the_planners_count(pools, schedule):
    """The first pipeline stage holds the schedule's in-flight micro-batches (1F1B: p,
    GPipe: m): its counted peak is the planner's first-stage figure — plus, per micro-batch
    in flight, the 8·b bytes by which the sampler's (b, T + 1) window, of which the token ids
    are a view, is wider than the ids (as in the single-stage test above)."""
    from paracube.pipeline.schedules import get_schedule
    from paracube.planner.layout import Layout
    from paracube.planner.layout_memory import stage_memory

    cfg = zcfg(0, dp=1, pp=2, accum=4, steps=1, model=DEEP, schedule=schedule)
    peak = pools(2).run(run_engine, cfg)[0][2][-1].memory["activations_peak"]
    layout = Layout.from_config(cfg)
    planned = stage_memory(cfg.model, layout, cfg.precision)[0].activations
    in_flight = get_schedule(schedule).in_flight(2, 4, 1, stage=0)
    assert peak == planned + 8 * cfg.micro_batch * in_flight


# -- mixed precision ---------------------------------------------------------------------


def test_bf16_tracks_the_fp32_loss_curve(pools):
    """bf16 compute with fp32 master weights follows the fp32 run: every step's loss
    within 2 % over 12 steps (bf16 keeps 8 mantissa bits: ~0.4 % per rounding)."""
    fp32 = pools(2).run(run_engine, zcfg(1, dp=2, steps=12))[0][0]
    variants = [
        dict(zero=1, precision="bf16"),
        dict(zero=1, precision="fp16"),
        dict(zero=2, precision="bf16", grad_reduce="compute"),
        dict(zero=3, precision="bf16"),
    ]
    for kw in variants:
        low = pools(2).run(run_engine, zcfg(dp=2, steps=12, **kw))[0][0]
        for step, (a, b) in enumerate(zip(low, fp32)):
            assert abs(a - b) <= 0.02 * b, (kw, step, a, b)


def run_fp16_overflow(cfg):
    """A loss scale so large that fp16 gradients overflow: the step must be skipped (no
    parameter changes) and the dynamic scale halved."""
    from paracube.engine import Trainer
    from paracube.mesh.mesh import ProcessMesh

    trainer = Trainer(cfg, ProcessMesh(cfg.parallel), small_corpus())
    trainer.scaler.scale = 2.0**40
    before = [p.detach().clone() for p in trainer.module.parameters()]
    m = trainer.train_step()
    same = all(torch.equal(a, b) for a, b in zip(before, trainer.module.parameters()))
    return m.skipped, same, trainer.scaler.scale, m.loss


def test_fp16_overflow_skips_the_step_and_halves_the_scale(pools):
    for skipped, unchanged, scale, loss in pools(2).run(
        run_fp16_overflow, zcfg(2, dp=2, steps=1, precision="fp16")
    ):
        assert skipped and unchanged and scale == 2.0**39
        assert 4 < loss < 7  # the reported loss is unscaled


def run_stage_peaks(cfg):
    from paracube.engine import Trainer
    from paracube.mesh.mesh import ProcessMesh

    trainer = Trainer(cfg, ProcessMesh(cfg.parallel), small_corpus())
    return trainer.mesh.rank("pp"), trainer.train_step().memory["activations_peak"]


def test_pipeline_activation_peak_follows_the_schedule(pools):
    """Counted over the whole schedule: with m = 4 micro-batches on 2 stages, GPipe's first
    stage holds all 4 micro-batches' activations at its peak, 1F1B's only p = 2 (Narayanan
    et al. 2021) — the counted peaks are in that ratio exactly; the last stage holds one
    micro-batch under 1F1B."""
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        cfg = TrainConfig(
            model=NANO,
            parallel=ParallelConfig(pp=2, schedule=schedule),
            micro_batch=2,
            grad_accum=4,
            steps=1,
            warmup_steps=1,
            progress=False,
        )
        peaks[schedule] = dict(pools(2).run(run_stage_peaks, cfg))
    assert peaks["gpipe"][0] == 2 * peaks["1f1b"][0]
    assert peaks["gpipe"][1] == 4 * peaks["1f1b"][1]


def run_engine_float64(cfg):
    from tests.helpers import default_dtype

    with default_dtype(torch.float64):
        return run_engine(cfg)


@pytest.mark.parametrize("case", ["zero3-dp2", "zero2-pp2", "zero1-tp2-sp"])
def test_zero_is_exact_in_float64(pools, case):
    """In float64 the sharded runs equal the serial one to ~1e-10: the float32 differences
    above are summation order, not an error in the sharding."""
    kw = {
        "zero3-dp2": dict(zero=3),
        "zero2-pp2": dict(zero=2, pp=2, accum=4),
        "zero1-tp2-sp": dict(zero=1, tp=2, sp=True),
    }[case]
    cfg = zcfg(**{"dp": 2, **kw}, steps=6)
    from tests.helpers import default_dtype

    with default_dtype(torch.float64):
        want_losses, want_params = serial_reference(
            train_config(dp=1, micro_batch=GLOBAL, steps=cfg.steps, grad_clip=CLIP, model=NANO),
            small_corpus(),
        )
    merged = {}
    for losses, params, _ in pools(cfg.parallel.world_size).run(run_engine_float64, cfg):
        assert_losses_close(losses, want_losses, tol=1e-12)
        merged.update(params)
    assert_params_close(
        {k: v.double() for k, v in merged.items()}, want_params, tol=1e-10, tensor_tol=1e-9
    )
