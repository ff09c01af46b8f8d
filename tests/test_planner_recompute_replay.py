"""How a fully recomputed block is replayed (``Layout.recompute_replay``): torch's
non-reentrant checkpoint stops once backward has every tensor it needs, so a block's last
matmul — the MLP's down projection, whose input the activation before it recomputed and whose
output only enters the residual sum — is never redone (early-stop: PyTorch 2.1 on, paracube
train's own blocks); Megatron's, DeepSpeed's and torch's reentrant checkpoint replay the whole
forward. Watched here on this machine's torch, then checked against the published sweeps that
ran each: within every sweep the checkpointed runs and the others are predicted alike only
with the replay that sweep's PyTorch ran."""

from __future__ import annotations

import statistics

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.models import shapes
from paracube.models.gpt import Block
from paracube.models.presets import preset
from paracube.planner import hardware as hw
from paracube.planner.flops import hardware_flops_per_token, model_flops_per_token
from paracube.planner.layout import Layout
from paracube.planner.published import evaluate, runs
from paracube.planner.stacks import stack
from paracube.planner.time_model import _gemm, layer_time, recompute_time, replay_saving

aten = torch.ops.aten


class ForwardMatmuls(TorchDispatchMode):
    """Names each of a block's linears whose forward matmul runs while it is watched: a
    forward matmul takes the weight transposed, a backward one the weight as it is or another
    operand."""

    def __init__(self, weights: dict[int, str]):
        super().__init__()
        self.weights, self.names = weights, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (aten.mm.default, aten.addmm.default):
            for operand in args:
                if isinstance(operand, torch.Tensor) and not operand.is_contiguous():
                    name = self.weights.get(operand.data_ptr())
                    if name is not None:
                        self.names.append(name)
        return func(*args, **(kwargs or {}))


def _replayed(activation: str, reentrant: bool) -> list[str]:
    cfg = ModelConfig(n_layers=1, hidden=64, n_heads=4, vocab_size=128, seq_len=16,
                      ffn_hidden=96, activation=activation)  # fmt: skip
    torch.manual_seed(0)
    block = Block(cfg)
    weights = {
        m.weight.data_ptr(): name
        for name, m in block.named_modules()
        if isinstance(m, torch.nn.Linear)
    }
    x = torch.randn(2, 16, 64, requires_grad=True)
    if reentrant:
        out = checkpoint(block._forward, x, use_reentrant=True)
    else:
        block.recompute = True  # paracube's own full recomputation
        out = block(x)
    watch = ForwardMatmuls(weights)
    with watch:
        out.square().sum().backward()
    return watch.names


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_paracubes_blocks_replay_every_matmul_but_the_last(activation):
    """paracube's own blocks, recomputed as paracube train recomputes them (torch's
    non-reentrant checkpoint), redo in backward the forward of every linear but the MLP's
    down projection; a reentrant checkpoint redoes all four."""
    linears = [lin.name for lin in shapes.block_linears(preset("gpt3-1.3b"))]
    assert sorted(_replayed(activation, reentrant=False)) == sorted(linears[:-1])
    assert linears[-1] == "mlp.down_proj"
    assert sorted(_replayed(activation, reentrant=True)) == sorted(linears)


def test_the_planner_charges_the_replay_it_watched():
    """Early-stop: the recomputed forward less the down projection's GEMM, in time and in the
    FLOPs HFU counts; whole: the forward, as before. paracube's default is early-stop;
    the Megatron-family and InternLM stacks replay whole, the PyTorch FSDP ones early."""
    cfg, g = preset("gpt3-1.3b"), hw.gpu("a100-80gb")
    early = Layout(dp=8, micro_batch=4, recompute="full")
    whole = Layout(dp=8, micro_batch=4, recompute="full", recompute_replay="whole")
    assert early.recompute_replay == "early-stop"
    forward = layer_time(cfg, early, g)[0]
    m, n, k = shapes.block_gemms(cfg, 4 * cfg.seq_len)[-1]
    assert (m, n, k) == (4 * cfg.seq_len, cfg.hidden, cfg.ffn_hidden)
    assert replay_saving(cfg, early, g) == pytest.approx(_gemm(m, n, k, g))
    assert recompute_time(cfg, early, g, 2, False, forward) == pytest.approx(
        forward - _gemm(m, n, k, g)
    )
    assert recompute_time(cfg, whole, g, 2, False, forward) == forward
    down = 2 * cfg.hidden * cfg.ffn_hidden
    assert hardware_flops_per_token(cfg, "full", replay="whole") - hardware_flops_per_token(
        cfg, "full", replay="early-stop"
    ) == pytest.approx(cfg.n_layers * down)
    assert hardware_flops_per_token(cfg, "none", replay="early-stop") == model_flops_per_token(cfg)
    for name in ("megatron-core", "nemo", "megatron-lm-2021", "internlm"):
        assert stack(name)["recompute_replay"] == "whole", name
    for name in ("paracube", "fsdp", "fsdp1", "torchtitan", "composer"):
        assert stack(name).get("recompute_replay", "early-stop") == "early-stop", name
    with pytest.raises(ConfigError, match="recompute_replay='partial'"):
        Layout(dp=8, recompute="full", recompute_replay="partial")


# The published sweeps that ran both checkpointed and uncheckpointed runs, and the replay
# each sweep's PyTorch ran: llm-foundry's (every one non-reentrant; 2.1 nightly for the later
# sweep, 2.0.1 and before for the others: paracube.planner.mosaic.REPLAY) and torchtitan's
# (2024 nightlies, PyTorch's checkpoint_wrapper: non-reentrant)
SWEEPS = {
    "MosaicML (H100)": "early-stop",
    "MosaicML (A100 80GB)": "early-stop",
    "torchtitan": "early-stop",
    "MosaicML (H100, 2023)": "whole",
    "MosaicML (A100 80GB, PURE)": "whole",
    "MosaicML (A100 40GB)": "whole",
}


def _gap(rows: list[dict], replay: str) -> float:
    """|median predicted ÷ published of the checkpointed runs − that of the others|, the
    checkpointed timed with ``replay``."""
    ratios: dict[bool, list[float]] = {True: [], False: []}
    for row in rows:
        fixed = row["fixed"]
        checkpointed = fixed.get("recompute") == "full"
        if checkpointed:
            row = {**row, "fixed": {**fixed, "recompute_replay": replay}}
        ratios[checkpointed].append(evaluate(row)["ratio"])
    return abs(statistics.median(ratios[True]) - statistics.median(ratios[False]))


def test_each_sweep_agrees_with_itself_only_under_the_replay_its_pytorch_ran():
    """No published figure says how a block was replayed; each sweep's own runs do. A run
    without checkpointing carries no replay; timed with the replay its sweep's PyTorch ran,
    the checkpointed runs of the same sweep land where the others do (medians within 2.5 %),
    and the other replay puts them further apart — in every sweep, both ways."""
    for source, replay in SWEEPS.items():
        rows = [r for r in runs() if r["source"] == source]
        other = "whole" if replay == "early-stop" else "early-stop"
        as_ran, wrong = _gap(rows, replay), _gap(rows, other)
        assert as_ran <= 0.025, (source, as_ran)
        assert as_ran < wrong, (source, as_ran, wrong)
        held = {r["fixed"].get("recompute_replay", "early-stop") for r in rows
                if r["fixed"].get("recompute") == "full"}  # fmt: skip
        assert held == {replay}, (source, held)
