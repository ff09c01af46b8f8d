"""Large models start: no rank builds the whole model; its shards equal the serial ones."""

from __future__ import annotations

import re

import torch

from paracube.models.gpt import GPT, initial_values
from paracube.models.presets import preset


def test_initial_values_are_the_serial_models_and_depend_only_on_the_seed():
    cfg = preset("nano", tie_embeddings=True)
    torch.manual_seed(3)
    model = GPT(cfg)
    torch.rand(10)  # other draws in between change nothing
    values = dict(initial_values(cfg, 3))
    assert values.keys() == dict(model.named_parameters()).keys()
    for name, p in model.named_parameters():
        assert torch.equal(values[name], p), name
    assert not torch.equal(
        dict(initial_values(cfg, 4))["embed.tok.weight"], values["embed.tok.weight"]
    )


def test_a_model_too_big_to_build_whole_starts_from_its_shards():
    """gpt3-125m (619 MiB in fp32) under tp=4: rank 0's memory grows by far less than the
    whole model while it is built — its shards plus one full parameter at a time."""
    from tests.test_cli import run_cli

    proc = run_cli(
        "train", "--tp", "4", "--model", "gpt3-125m", "--seq-len", "64", "--micro-batch", "1",
        "--steps", "1", "--no-progress",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if "model build on rank 0" in x)
    peak, shards, whole = (float(v.replace(",", "")) for v in re.findall(r"([\d,.]+) MiB", line))
    assert shards < whole / 3.5  # a quarter of the matrices (the norms are replicated)
    assert peak < 0.75 * whole, line  # measured 398 of 619 MiB: shards + the 154 MiB embedding
