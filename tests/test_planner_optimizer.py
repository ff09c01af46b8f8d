"""The optimizer step's bytes (``planner.time_model.optimizer_time``): AdamW as one fused kernel
or an op per pass (``Layout.optimizer_kernel``), and clipping that rescales the gradients
only when their norm is over the limit or always (``Layout.clip_scale``). The bytes per
parameter are counted here from torch's own kernels, run on this machine's CPU: every op
AdamW and ``clip_grad_norm_`` dispatch is intercepted, and the parameter-sized tensors it
reads and the ones whose values it changes are counted."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from paracube.errors import ConfigError
from paracube.planner import hardware as hw
from paracube.planner.layout import Layout
from paracube.planner.stacks import stack
from paracube.planner.time_model import OPTIMIZER_BYTES, optimizer_time

N = 4096  # elements of each parameter: what tells a parameter-sized tensor from a scalar


class CountPasses(TorchDispatchMode):
    """Tensors of N elements each dispatched op reads (distinct storages among its tensor
    arguments) and writes (arguments whose values it changed, and new tensors it returns)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = self.writes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        sized = {t.data_ptr(): t for t in inputs if t.numel() == N}
        before = {ptr: t.clone() for ptr, t in sized.items()}
        out = func(*args, **kwargs)
        self.reads += len(sized)
        self.writes += sum(not torch.equal(before[ptr], t) for ptr, t in sized.items())
        returned = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.writes += sum(t.numel() == N and t.data_ptr() not in sized for t in returned)
        return out


def passes(step, params: list[torch.nn.Parameter]) -> float:
    """Tensor passes per parameter element of one call of ``step``."""
    with CountPasses() as mode:
        step()
    return (mode.reads + mode.writes) / len(params)


def parameters() -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(N, generator=gen)) for _ in range(3)]
    for p in params:
        p.grad = torch.randn(N, generator=gen)
    return params


@pytest.mark.parametrize(
    "kernel, options", [("fused", {"fused": True}), ("multi-op", {"foreach": True})]
)
def test_adamw_bytes_are_torchs_own_passes(kernel, options):
    """torch.optim.AdamW (weight decay 0.01, its default), stepped twice so that the moments
    and the bias corrections are not trivial: the fused kernel reads weights, gradients, m and
    v and writes weights, m and v (7 fp32 passes); the default multi-tensor path makes 20 —
    the planner's OPTIMIZER_BYTES, 4 bytes each."""
    params = parameters()
    opt = torch.optim.AdamW(params, lr=1e-2, **options)
    opt.step()
    assert 4 * passes(opt.step, params) == OPTIMIZER_BYTES[kernel]


def test_torch_clipping_rescales_every_gradient_whatever_the_norm():
    """torch.nn.utils.clip_grad_norm_ with a limit far above the norm still multiplies every
    gradient (by a clamped 1.0): the norm's read and a read and write more — the 4 + 8 bytes
    clip_scale="always" charges; the planner's "when-clipped" rescales nothing there."""
    params = parameters()
    with CountPasses() as mode:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=1e9)
    assert norm < 1e9
    assert mode.writes == 0  # multiplied by 1.0: the values stand …
    assert mode.reads == 2 * len(params)  # … but each gradient was read for the norm and scaled


def test_the_step_charges_the_stacks_kernel_and_clipping():
    """One H100 rank stepping 1e9 parameters of a bf16 model (its 4 + 2-byte write-back):
    fused and rescaled when clipped 4 + 28 + 6 bytes; Composer's (DecoupledAdamW op by op,
    torch's clipping) 4 + 8 + 80 + 6; ZeRO-3 over 8 ranks steps an eighth."""
    h100, p = hw.gpu("h100"), 1e9
    rate = h100.memory_rate
    paracube = Layout()
    assert optimizer_time(paracube, h100, p, 2) == pytest.approx(38 * p / rate)
    composer = Layout(
        **{k: v for k, v in stack("composer").items() if k in ("optimizer_kernel", "clip_scale")}
    )
    assert (composer.optimizer_kernel, composer.clip_scale) == ("multi-op", "always")
    assert optimizer_time(composer, h100, p, 2) == pytest.approx(98 * p / rate)
    sharded = replace(composer, dp=8, zero=3)
    assert optimizer_time(sharded, h100, p, 2) == pytest.approx(98 * p / 8 / rate)
    # every PyTorch FSDP stack clips with torch's clip_grad_norm_; Megatron's stacks do not
    for name in ("fsdp", "fsdp1", "torchtitan", "composer"):
        assert stack(name)["clip_scale"] == "always"
    for name in ("paracube", "megatron-core", "nemo", "megatron-lm-2021"):
        assert "clip_scale" not in stack(name) and "optimizer_kernel" not in stack(name)


def test_unknown_kernels_are_refused_and_an_offloaded_step_is_the_hosts():
    with pytest.raises(ConfigError, match="optimizer_kernel='apex': choose fused or multi-op"):
        Layout(optimizer_kernel="apex")
    with pytest.raises(ConfigError, match="clip_scale='never': choose when-clipped or always"):
        Layout(clip_scale="never")
    a100 = hw.gpu("a100-80gb")  # its host link and memory are in the catalog
    offloaded = Layout(offload=True)
    assert optimizer_time(replace(offloaded, optimizer_kernel="multi-op"), a100, 1e9, 2) == (
        optimizer_time(offloaded, a100, 1e9, 2)
    )
    with pytest.raises(ConfigError, match="another stack's software"):
        Layout(clip_scale="always").check_paracube_software()


def test_bf16_moments_save_their_bytes_in_memory_and_in_the_step():
    """Adam's moments in bf16 (``Layout.moments``, Megatron-Core's precision-aware optimizer,
    as DeepSeek-V3 trained): each parameter's states 4 bytes fewer (two moments of 2 rather
    than 4) — 6 in bf16 training, whose fp32 main weights that optimizer keeps as the int16
    remainders beside the bf16 parameters — and the fused step's four passes over them 2 bytes
    each rather than 4; refused
    beside pure 16-bit training (its moments are 16-bit already) and an op-per-pass step, and
    by paracube train, which keeps them in fp32; Megatron-LM's command asks for them."""
    from paracube.models import shapes
    from paracube.models.presets import preset
    from paracube.planner.layout_memory import stage_memory
    from paracube.planner.megatron import megatron_args, megatron_refusal
    from paracube.planner.time_model import MOMENT_PASSES

    cfg = preset("gpt3-1.3b")
    fp32, bf16 = Layout(dp=1), Layout(dp=1, moments="bf16")
    for precision, saved_bytes in (("fp8", 4), ("bf16", 6)):
        # bf16: the main weights' int16 remainders too (store_param_remainders)
        kept = [stage_memory(cfg, L, precision)[0].model_states for L in (fp32, bf16)]
        assert kept[0] - kept[1] == pytest.approx(saved_bytes * shapes.parameter_count(cfg))
    g = hw.gpu("h100")
    step = optimizer_time(fp32, g, 1e9, 2) - optimizer_time(bf16, g, 1e9, 2)
    assert step == pytest.approx(MOMENT_PASSES * 2 * 1e9 / g.memory_rate)
    for other in (dict(master_weights="none"), dict(optimizer_kernel="multi-op")):
        with pytest.raises(ConfigError, match="bf16 moments are planned as Megatron-Core's"):
            Layout(dp=1, moments="bf16", **other)
    with pytest.raises(ConfigError, match="moments='bf16'.*not what paracube train runs"):
        bf16.to_args()
    megatron = Layout(dp=8, zero=1, moments="bf16", **stack("megatron-core"))
    args = " ".join(megatron_args(megatron, cfg, "bf16", 64))
    assert args.count("--use-precision-aware-optimizer") == 1
    assert "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16" in args
    unsharded = replace(megatron, zero=0)
    assert "only under its distributed optimizer" in megatron_refusal(unsharded, cfg, "bf16")
