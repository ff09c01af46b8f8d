"""Checkpoints: pieces are exact rectangles; a resumed run continues exactly; a checkpoint
saved under one layout loads under another and the run still equals the serial one."""

from __future__ import annotations

import functools

import pytest
import torch

from paracube.checkpoint.pieces import flat_rectangles
from paracube.config import ParallelConfig, TrainConfig
from paracube.models.presets import preset
from paracube.tensor_parallel.plan import tp_blocks
from tests.helpers import (
    SEQ,
    assert_losses_close,
    assert_params_close,
    serial_reference,
    small_corpus,
    train_config,
)

NANO = preset("nano", seq_len=SEQ)
GLOBAL, STEPS, SPLIT = 8, 6, 3


# -- pure: the rectangles ---------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7,), (5, 6), (4, 3)])
def test_flat_rectangles_tile_any_range_exactly(shape):
    numel = 1
    for s in shape:
        numel *= s
    for a in range(numel):
        for b in range(a, numel + 1):
            seen = torch.zeros(shape, dtype=torch.int32)
            total = 0
            for offsets, sizes, start in flat_rectangles(shape, a, b):
                region = seen[tuple(slice(o, o + n) for o, n in zip(offsets, sizes))]
                region += 1
                assert start == total  # rectangles follow each other in the range
                total += region.numel()
            flat = seen.view(-1)
            assert total == b - a and flat[a:b].eq(1).all() and flat.sum() == b - a


def test_tp_blocks_of_a_fused_projection_and_a_padded_vocabulary():
    p = torch.nn.Parameter(torch.zeros(6, 4))
    p.tp_dim, p.tp_sections = 0, (2, 1, 1)  # q | k | v rows of rank 1 of 2
    assert tp_blocks(p, 1, 2) == ((8, 4), 0, [(0, 2, 2), (2, 1, 5), (3, 1, 7)])
    v = torch.nn.Parameter(torch.zeros(4, 3))
    v.tp_dim, v.tp_sections, v.tp_vocab = 0, (4,), 7  # rows 4..7 of a vocabulary of 7 (+1 pad)
    assert tp_blocks(v, 1, 2) == ((7, 3), 0, [(0, 3, 4)])


# -- distributed: save, resume, reshard -----------------------------------------------------


def cfg_for(
    steps, dp=1, tp=1, pp=1, zero=0, sp=False, schedule="1f1b", chunks=1, accum=2, precision="fp32"
):
    return TrainConfig(
        model=NANO,
        parallel=ParallelConfig(
            dp=dp, tp=tp, pp=pp, sequence_parallel=sp, bucket_mb=0.1, schedule=schedule,
            chunks=chunks,
        ),
        steps=steps,
        micro_batch=GLOBAL // (dp * accum),
        grad_accum=accum,
        warmup_steps=2,
        progress=False,
        grad_clip=0.5,
        zero=zero,
        precision=precision,
    )  # fmt: skip


@functools.cache
def serial(steps: int):
    cfg = train_config(dp=1, micro_batch=GLOBAL, steps=steps, grad_clip=0.5, model=NANO)
    return serial_reference(cfg, small_corpus())


def _trainer(cfg):
    from paracube.engine import Trainer
    from paracube.mesh.mesh import ProcessMesh

    return Trainer(cfg, ProcessMesh(cfg.parallel), small_corpus())


def train_and_save(cfg, root, steps):
    from paracube.checkpoint.store import save

    trainer = _trainer(cfg)
    losses = [trainer.train_step().loss for _ in range(steps)]
    save(trainer, root)
    return losses


def resume_and_train(cfg, path, steps):
    from paracube.checkpoint.store import load
    from paracube.tensor_parallel import full_tensor

    trainer = _trainer(cfg)
    load(trainer, path)
    losses = [trainer.train_step().loss for _ in range(steps)]
    with trainer.gathered_parameters():
        params = {
            n: full_tensor(p, p, trainer.tp_group).float()
            for n, p in trainer.serial_named_parameters()
        }
    return trainer.step, losses, params


def _resume_matches_serial(pools, tmp_path, a: dict, b: dict):
    resume_matches_serial(pools, tmp_path, cfg_for(STEPS, **a), cfg_for(STEPS, **b))


def resume_matches_serial(pools, tmp_path, cfg_a, cfg_b):
    """SPLIT steps under ``cfg_a``, saved, resumed under ``cfg_b`` to STEPS: every loss and
    the final parameters the serial run's."""
    before = pools(cfg_a.parallel.world_size).run(train_and_save, cfg_a, str(tmp_path), SPLIT)
    path = tmp_path / f"step-{SPLIT:08d}"
    after = pools(cfg_b.parallel.world_size).run(resume_and_train, cfg_b, str(path), STEPS - SPLIT)
    want_losses, want_params = serial(STEPS)
    assert_losses_close(before[0], want_losses[:SPLIT])
    merged = {}
    for step, losses, params in after:
        assert step == STEPS
        assert_losses_close(losses, want_losses[SPLIT:])
        merged.update(params)
    assert_params_close(merged, want_params, tol=1e-5, tensor_tol=3e-4)


RESHARD = {
    "dp2-to-dp1": (dict(dp=2), dict(dp=1)),
    "dp1-to-dp4": (dict(dp=1), dict(dp=4, accum=1)),
    "tp2sp-to-tp1": (dict(tp=2, sp=True), dict(tp=1)),
    "pp2-to-pp1": (dict(pp=2, accum=4), dict(pp=1)),
    "pp1-to-pp2-interleaved": (dict(pp=1), dict(pp=2, schedule="interleaved-1f1b", chunks=2, accum=4)),
    "zero1dp2-to-zero3dp4": (dict(dp=2, zero=1), dict(dp=4, zero=3, accum=1)),
    "zero3dp2-to-zero0dp2": (dict(dp=2, zero=3), dict(dp=2, zero=0)),
    "3d-to-dp2": (dict(dp=2, tp=2, pp=2, sp=True, accum=4), dict(dp=2)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(RESHARD))
def test_reshard_on_load_matches_serial(pools, tmp_path, case):
    """Train 3 steps under layout A, save, resume under layout B for 3 more: every loss and
    the final parameters equal the serial run's 6 steps (1e-5, as every parity test)."""
    _resume_matches_serial(pools, tmp_path, *RESHARD[case])


def uninterrupted(cfg, steps):
    trainer = _trainer(cfg)
    return [trainer.train_step().loss for _ in range(steps)]


SAME = {
    "dp2-zero1": dict(dp=2, zero=1),
    "dp2-tp2-sp-zero2": dict(dp=2, tp=2, sp=True, zero=2),
    "dp2-zero3": dict(dp=2, zero=3),
    "pp2-1f1b": dict(pp=2, accum=4),
    "pp2-interleaved": dict(pp=2, schedule="interleaved-1f1b", chunks=2, accum=4),
    "pp2-zb-h1": dict(pp=2, schedule="zb-h1", accum=4),
    "3d": dict(dp=2, tp=2, pp=2, sp=True, accum=4),
    "bf16": dict(dp=2, precision="bf16"),
    "fp16": dict(dp=2, precision="fp16"),
}


@pytest.mark.parametrize("case", list(SAME))
def test_resume_under_the_same_layout_is_bitwise(pools, tmp_path, case):
    """3 steps, save, resume for 3 more: every loss equals the uninterrupted run's to the
    last bit (fp32 masters, Adam's moments and step, the fp16 loss scaler restored)."""
    cfg = cfg_for(STEPS, **SAME[case])
    world = cfg.parallel.world_size
    whole = pools(world).run(uninterrupted, cfg, STEPS)[0]
    first = pools(world).run(train_and_save, cfg, str(tmp_path), SPLIT)[0]
    rest = pools(world).run(
        resume_and_train, cfg, str(tmp_path / f"step-{SPLIT:08d}"), STEPS - SPLIT
    )
    assert first + rest[0][1] == whole  # float32, to the last bit


def _draw_train_save(cfg, root, steps):
    """Like a model with dropout: each step draws from the generator (rank r draws r more
    numbers, so the ranks' streams differ), then save, then draw."""
    import torch.distributed as dist

    from paracube.checkpoint.store import save

    trainer = _trainer(cfg)
    for _ in range(steps):
        trainer.train_step()
        torch.rand(5 + dist.get_rank())
    save(trainer, root)
    return torch.rand(4)


def _load_and_draw(cfg, path):
    from paracube.checkpoint.store import load

    trainer = _trainer(cfg)
    meta = load(trainer, path)
    return meta["rng_restored"], torch.rand(4)


def test_resume_continues_every_ranks_random_streams(pools, tmp_path):
    """Each rank's generator continues where it stopped under the same layout (the next
    draws equal the saving run's, and differ between ranks); under another layout the
    streams are not continued, and load says so."""
    cfg = cfg_for(STEPS, dp=2)
    saved = pools(2).run(_draw_train_save, cfg, str(tmp_path), SPLIT)
    path = str(tmp_path / f"step-{SPLIT:08d}")
    resumed = pools(2).run(_load_and_draw, cfg, path)
    assert not torch.equal(saved[0], saved[1])
    for (restored, draws), want in zip(resumed, saved):
        assert restored and torch.equal(draws, want)
    other = pools(1).run(_load_and_draw, cfg_for(STEPS, dp=1), path)[0]
    assert other[0] is False


# -- the command line ------------------------------------------------------------------


def _cli(*args):
    from tests.test_cli import run_cli

    proc = run_cli(
        "train", "--dp", "2", "--model", "nano", "--micro-batch", "2", "--no-progress", *args
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_cli_save_resume_auto_continues_exactly(tmp_path):
    """Train 6 steps saving every 2; lose the last save as a crash in the middle of it
    would (its partial folder left, no step-6): resume (auto) to 6 picks step 4, and
    steps 4 and 5 equal the uninterrupted run's to the last bit; --keep-last prunes."""
    import shutil

    from paracube.metrics import read_metrics

    ck = tmp_path / "ck"
    _cli(
        "--steps", "6", "--save-dir", str(ck), "--save-every", "2", "--metrics", str(tmp_path / "a")
    )
    assert sorted(p.name for p in ck.iterdir()) == [f"step-0000000{k}" for k in (2, 4, 6)]
    shutil.rmtree(ck / "step-00000006")
    (ck / ".step-00000006.partial").mkdir()  # what a crash in the middle of a save leaves
    proc = _cli(
        "--steps", "6", "--resume", "auto", "--save-dir", str(ck), "--keep-last", "1",
        "--metrics", str(tmp_path / "b"),
    )  # fmt: skip
    assert f"resumed from {ck / 'step-00000004'} at step 4" in proc.stdout
    resumed = read_metrics(str(tmp_path / "b"))
    whole = read_metrics(str(tmp_path / "a"))
    assert [r["step"] for r in resumed] == [4, 5]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in whole[4:]]
    assert [p.name for p in ck.iterdir() if not p.name.startswith(".")] == ["step-00000006"]


# -- export and --init-from --------------------------------------------------------------


def save_and_gather(cfg, root, steps):
    """Train, save, and return every parameter at full size (what an export must hold)."""
    from paracube.checkpoint.store import save
    from paracube.tensor_parallel import full_tensor

    trainer = _trainer(cfg)
    for _ in range(steps):
        trainer.train_step()
    save(trainer, root)
    with trainer.gathered_parameters():
        return {
            n: full_tensor(p, p, trainer.tp_group) for n, p in trainer.serial_named_parameters()
        }


def test_export_holds_the_serial_weights_and_loads_into_the_plain_gpt(pools, tmp_path):
    from safetensors.torch import load_file

    from paracube.checkpoint.export import export, load_into
    from paracube.models.gpt import GPT

    cfg = cfg_for(STEPS, tp=2, sp=True, zero=1, dp=2)
    gathered = pools(4).run(save_and_gather, cfg, str(tmp_path), SPLIT)
    full = {k: v for params in gathered for k, v in params.items()}
    out = tmp_path / "model.safetensors"
    model_cfg, step = export(tmp_path / f"step-{SPLIT:08d}", str(out))
    assert step == SPLIT and model_cfg == NANO
    tensors = load_file(str(out))
    assert tensors.keys() == full.keys()
    for name, t in tensors.items():
        assert torch.equal(t, full[name]), name
    model = GPT(model_cfg)
    load_into(model, tensors)
    tokens = torch.randint(0, 256, (2, SEQ))
    reference = GPT(model_cfg)
    reference.load_state_dict(full, strict=False)
    assert torch.equal(model(tokens), reference(tokens))


def init_and_train(cfg, path, steps):
    from paracube.checkpoint.export import init_from, read_exported

    trainer = _trainer(cfg)
    init_from(trainer, read_exported(path)[1])
    return [trainer.train_step().loss for _ in range(steps)]


def test_init_from_an_export_is_the_same_start_under_any_layout(pools, tmp_path):
    from paracube.checkpoint.export import export

    pools(2).run(train_and_save, cfg_for(STEPS, dp=2), str(tmp_path), SPLIT)
    out = str(tmp_path / "m.safetensors")
    export(tmp_path / f"step-{SPLIT:08d}", out)
    serial_run = pools(1).run(init_and_train, cfg_for(3, dp=1), out, 3)[0]
    for layout in (dict(tp=2, sp=True), dict(pp=2, accum=4), dict(dp=2, zero=3)):
        cfg = cfg_for(3, **layout)
        got = pools(cfg.parallel.world_size).run(init_and_train, cfg, out, 3)
        for losses in got:
            assert_losses_close(losses, serial_run)


def test_async_save_writes_the_same_checkpoints(tmp_path):
    """--async-save: the checkpoints written in the background equal the synchronous
    ones bit for bit (the state was copied at the save, not read later)."""
    from safetensors.torch import load_file

    from paracube.checkpoint.export import export

    for mode, extra in (("sync", ()), ("async", ("--async-save",))):
        _cli("--steps", "4", "--save-dir", str(tmp_path / mode), "--save-every", "2", *extra)
    for step in (2, 4):
        files = []
        for mode in ("sync", "async"):
            out = tmp_path / f"{mode}-{step}.safetensors"
            export(tmp_path / mode / f"step-{step:08d}", str(out))
            files.append(load_file(str(out)))
        assert files[0].keys() == files[1].keys()
        assert all(torch.equal(files[0][k], files[1][k]) for k in files[0])
