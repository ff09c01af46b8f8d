"""ZeRO-3's memory as the stacks hold it: the parameters gathered beside the shards,
PyTorch FSDP's mixed precision, whose fp32 parameters are the main weights (no 16-bit shard
kept at rest), and pure 16-bit training, which keeps no fp32 copy at all. The engine's own
gathered bytes are checked against the planner's in tests/test_materialize.py."""

from __future__ import annotations

import pytest

from paracube.choices import state_bytes_per_parameter
from paracube.models import shapes
from paracube.models.presets import preset
from paracube.planner import hardware as hw
from paracube.planner.layout import Layout
from paracube.planner.layout_memory import stage_memory
from paracube.planner.stacks import stack
from paracube.planner.time_model import OPTIMIZER_BYTES, optimizer_time


def states(zero: int, precision: str = "bf16", **software) -> float:
    """A rank's model states for Llama 3 8B over 8 data-parallel ranks."""
    [rank] = stage_memory(preset("llama3-8b"), Layout(dp=8, zero=zero, **software), precision)
    return rank.model_states


def test_zero3_holds_its_root_unit_and_two_blocks_gathered():
    """Beside its shards, ZeRO-3 holds the root unit (embedding, final norm, head) through
    the step and a block with the next one prefetched, in the compute dtype: on one
    pipeline stage, (embed + head + norm + 2 blocks) × 2 bytes in bf16. ZeRO-1 gathers
    nothing; neither does a pipelined step that keeps its stage gathered (ZeRO-1's memory,
    counted in its states)."""
    cfg = preset("llama3-8b")
    root = shapes.embed_params(cfg) + shapes.head_params(cfg) + shapes.norm_params(cfg)
    expected = (root + 2 * shapes.block_params(cfg)) * 2
    [rank] = stage_memory(cfg, Layout(dp=8, zero=3), "bf16")
    assert rank.gathered == pytest.approx(expected)
    [fp32] = stage_memory(cfg, Layout(dp=8, zero=3), "fp32")
    assert fp32.gathered == pytest.approx(2 * expected)
    assert stage_memory(cfg, Layout(dp=8, zero=1), "bf16")[0].gathered == 0
    kept = Layout(dp=2, pp=4, microbatches=8, zero=3, zero3_pipeline="per-step")
    assert all(m.gathered == 0 for m in stage_memory(cfg, kept, "bf16"))
    # under a pipeline each end holds its own part of the root
    spread = stage_memory(cfg, Layout(dp=2, pp=4, microbatches=8, zero=3), "bf16")
    blocks = 2 * shapes.block_params(cfg) * 2
    assert spread[0].gathered == pytest.approx(blocks + 2 * shapes.embed_params(cfg))
    assert spread[1].gathered == pytest.approx(blocks)


def test_pytorch_fsdp_keeps_no_16bit_shard_under_zero3():
    """PyTorch FSDP's shards are the fp32 parameters — the main weights of the optimizer's
    12 bytes — cast to bf16 only as they are gathered: under ZeRO-3 a rank keeps 2/dp bytes
    a parameter less than a stack that keeps 16-bit parameters beside fp32 main weights.
    Under ZeRO-1 and 2 the 16-bit parameters are whole on every rank either way, and in fp32
    the parameters are the weights in both."""
    params = shapes.parameter_count(preset("llama3-8b"))
    fsdp = {"master_weights": "parameters"}
    assert states(3) - states(3, **fsdp) == pytest.approx(2 * params / 8)
    for zero in (0, 1, 2):
        assert states(zero, **fsdp) == states(zero)
    assert states(3, "fp32", **fsdp) == states(3, "fp32")
    # the PyTorch FSDP stacks state it; Megatron-Core keeps its main weights in the optimizer
    for name in ("fsdp", "fsdp1", "torchtitan", "composer"):
        assert stack(name)["master_weights"] == "parameters", name
    assert "master_weights" not in stack("megatron-core")


def _fsdp2_gradient_shard_bytes(reduce_in_bf16: bool) -> tuple[int, int]:
    """On a rank: (bytes, elements) of the gradient shards FSDP2 keeps after two accumulated
    micro-batches of a bf16-cast model, its gradients reduced in bf16 or in fp32."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 16))
    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16,
        reduce_dtype=torch.bfloat16 if reduce_in_bf16 else torch.float32,
    )
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for _ in range(2):
        model(torch.randn(4, 16)).float().square().mean().backward()
    shards = [p.grad.to_local() for p in model.parameters()]
    return sum(g.numel() * g.element_size() for g in shards), sum(g.numel() for g in shards)


@pytest.mark.parametrize("grad_reduce", ["compute", "fp32"])
def test_pytorch_fsdp_accumulates_fp32_gradients_whatever_it_reduces_in(pools, grad_reduce):
    """PyTorch FSDP reduces in its policy's dtype but casts each reduced gradient to the
    sharded parameter's — fp32, the main weights — before accumulating it: FSDP2 run on two
    ranks keeps 4 bytes a gradient element under a bf16 reduce as under an fp32 one, the
    bytes the planner counts for its stacks (``master_weights="parameters"``), where a stack
    with 16-bit parameters beside the optimizer's main weights keeps the reduce dtype."""
    measured = pools(2).run(_fsdp2_gradient_shard_bytes, grad_reduce == "compute")
    _, gradient, _ = state_bytes_per_parameter("bf16", grad_reduce, "parameters")
    assert all(nbytes == gradient * elements for nbytes, elements in measured)
    assert gradient == 4
    assert state_bytes_per_parameter("bf16", "compute", "optimizer")[1] == 2
    params = shapes.parameter_count(preset("llama3-8b"))
    fsdp = {"master_weights": "parameters"}
    assert states(3, grad_reduce="compute", **fsdp) == states(3, **fsdp)
    assert states(3, grad_reduce="compute") == pytest.approx(states(3) - 2 * params / 8)


def test_pure_16bit_training_keeps_every_state_in_the_compute_dtype():
    """Without fp32 main weights (``master_weights="none"``: NeMo AutoModel's bf16-cast models
    stepped by torch.optim.Adam) a parameter costs 2 + 2 + 4 bytes — its bf16 value, its
    gradient held in bf16 though reduced in fp32, and Adam's two bf16 moments — against
    mixed precision's 2 + 4 + 12; sharded alike under ZeRO-3. fp32 training has no main
    copy to drop: unchanged."""
    params = shapes.parameter_count(preset("llama3-8b"))
    pure = {"master_weights": "none"}
    assert states(0, **pure) == pytest.approx(8 * params)
    assert states(0) == pytest.approx(18 * params)  # 2 + 4 (fp32 gradients) + 12
    assert states(3, **pure) == pytest.approx(8 * params / 8)
    assert states(0, grad_reduce="compute", **pure) == states(0, **pure)
    assert states(3, "fp32", **pure) == states(3, "fp32")


def test_the_optimizer_step_moves_what_its_states_hold():
    """The step's bytes a parameter, with a fused AdamW and no clipping rescale: the norm's
    read of the gradients, Adam's 7 reads and writes, and — only where the main weights sit
    in the optimizer beside 16-bit parameters — the main copy read and the bf16 copy
    written. FSDP's fp32 parameters are the main weights (nothing written back); pure bf16
    steps 2-byte values throughout."""
    g = hw.gpu("h100")
    shard = 1e9
    base = Layout(optimizer_kernel="fused", clip_scale="when-clipped")

    def seconds(master: str) -> float:
        return optimizer_time(base.replace(master_weights=master), g, shard, 2)

    adam = OPTIMIZER_BYTES["fused"]
    assert seconds("optimizer") == pytest.approx((4 + adam + 4 + 2) * shard / g.memory_rate)
    assert seconds("parameters") == pytest.approx((4 + adam) * shard / g.memory_rate)
    assert seconds("none") == pytest.approx((2 + adam / 2) * shard / g.memory_rate)
    # an fp32 model's parameters are its main weights whatever the stack says
    fp32 = [
        optimizer_time(base.replace(master_weights=m), g, shard, 4) for m in ("optimizer", "none")
    ]
    assert fp32[0] == pytest.approx(fp32[1])


def test_nemo_automodels_moe_run_fits_as_it_trained():
    """NeMo AutoModel's Qwen3-30B-A3B benchmark ran on 8 H100s of 80 GB. Counted in mixed
    precision its rank needed 105 GB (the experts unsharded under EP 8, 16 bytes a
    parameter); as it trains, in pure bf16, the layout fits and the row carries no memory
    note."""
    from paracube.planner.published import evaluate, runs

    [row] = [r for r in runs() if r["source"] == "NeMo AutoModel, MoE"]
    assert row["fixed"]["master_weights"] == "none"
    assert evaluate(row)["note"] == ""
    mixed = dict(row, fixed=dict(row["fixed"], master_weights="parameters"))
    assert evaluate(mixed)["note"].startswith("memory model:")


def test_explain_says_where_the_main_weights_are(capsys):
    """--explain's ZeRO line gives the bytes a parameter the states take when the main
    weights are not the optimizer's: pure bf16's 2 + 2 + 4, FSDP's fp32 parameters' 4 + 4 + 8
    (the stack's gradients reduced in fp32); Megatron's placement needs no word."""
    from paracube.cli import main

    common = ["plan", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100",
              "--global-batch", "64", "--layout", "dp=8,tp=1,pp=1", "--zero", "3", "--explain"]  # fmt: skip

    def zero_line(*extra: str) -> str:
        assert main([*common, *extra]) == 0
        return next(x for x in capsys.readouterr().out.splitlines() if "- ZeRO-3 shards" in x)

    assert "2 + 2 + 4 bytes a parameter, no fp32 copy" in zero_line("--master-weights", "none")
    assert "4 + 4 + 8 bytes a parameter, no 16-bit shard" in zero_line("--stack", "fsdp")
    assert "bytes a parameter" not in zero_line()
