"""A user's own model (``examples/own_model.py``'s factory) under the engines, against the
same module trained in one process; and the README's "train your own model" commands."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from paracube.config import ParallelConfig, TrainConfig
from tests.helpers import assert_losses_close, assert_params_close, serial_reference, small_corpus

FACTORY = "examples.own_model:build"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def own_config(zero=0, m=2, recompute="none", compile="none", **parallel) -> TrainConfig:
    from examples.own_model import CONFIG

    par = ParallelConfig(bucket_mb=0.05, **parallel)
    return TrainConfig(
        model=CONFIG.replace(seq_len=32),
        model_source=f"factory:{FACTORY}",
        parallel=par,
        steps=5,
        micro_batch=8 // (par.dp * m),
        grad_accum=m,
        warmup_steps=2,
        zero=zero,
        recompute=recompute,
        compile=compile,
        progress=False,
    )


def run_own(cfg: TrainConfig):
    from paracube.engine import Trainer
    from paracube.mesh.mesh import ProcessMesh
    from paracube.tensor_parallel import full_tensor

    torch.set_num_threads(1)
    trainer = Trainer(cfg, ProcessMesh(cfg.parallel), small_corpus())
    losses = [trainer.train_step().loss for _ in range(cfg.steps)]
    with trainer.gathered_parameters():
        params = {
            n: full_tensor(p, p, trainer.tp_group) for n, p in trainer.serial_named_parameters()
        }
    return losses, params


@pytest.mark.parametrize(
    "layout",
    [
        dict(dp=2, zero=3, recompute="full"),
        dict(dp=2, tp=2, pp=2, m=2),
        dict(pp=2, m=4, schedule="interleaved-1f1b", chunks=2),
        dict(tp=2, compile="partition"),  # its blocks compiled, the TP collectives eager
    ],
    ids=["dp2-zero3-recompute", "dp2xtp2xpp2", "pp2-interleaved", "tp2-compiled"],
)
def test_own_model_matches_its_serial_run(pools, layout):
    from examples.own_model import build

    cfg = own_config(**layout)
    torch.manual_seed(cfg.seed)
    # a factory's own config has seq_len 64; the module itself accepts any length
    want_losses, want_params = serial_reference(cfg, small_corpus(), model=build().module)
    results = pools(cfg.parallel.world_size).run(run_own, cfg)
    merged = {}
    for losses, params in results:
        assert_losses_close(losses, want_losses)
        merged.update(params)
    assert_params_close(merged, want_params, tol=3e-5, tensor_tol=3e-4)


@pytest.mark.parametrize(
    "model",
    ["hf:examples/models/llama-tiny", FACTORY],
    ids=["llama", "factory"],
)
def test_readme_own_model_commands_run(model):
    """The README's commands: a Llama config, and the factory, under dp × tp × pp."""
    cmd = [sys.executable, "-m", "paracube", "train", "--model", model, "--dp", "2", "--tp", "2",
           "--pp", "2", "--microbatches", "4", "--steps", "2", "--seq-len", "32", "--no-progress"]  # fmt: skip
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 steps in" in out.stderr + out.stdout
