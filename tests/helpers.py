"""Helpers shared by the tests: the serial reference run and relative errors."""

from __future__ import annotations

import contextlib
import functools

import torch

from paracube.config import ModelConfig, ParallelConfig, TrainConfig
from paracube.data.corpus import TokenCorpus
from paracube.data.sampler import ShardedBatchSampler
from paracube.engine import build_optimizer, lr_at
from paracube.models.gpt import GPT, lm_loss
from paracube.models.presets import preset

SEQ = 32
# A LLaMA block on the small test models: RMSNorm, SwiGLU (96 wide), rotary positions, no
# biases, 2 key/value heads (grouped-query attention)
LLAMA_BLOCK = dict(
    norm="rmsnorm", activation="swiglu", position="rope", bias=False, n_kv_heads=2, ffn_hidden=96
)


def small_corpus() -> TokenCorpus:
    """A fixed, seeded byte stream: fast to build, identical in every process."""
    g = torch.Generator().manual_seed(1234)
    text = torch.randint(32, 127, (40_000,), generator=g, dtype=torch.uint8)
    return TokenCorpus(train=text[:36_000], val=text[36_000:], source="seeded bytes")


def train_config(
    dp: int = 1,
    micro_batch: int = 4,
    grad_accum: int = 1,
    steps: int = 5,
    tp: int = 1,
    sp: bool = False,
    **kw,
) -> TrainConfig:
    model: ModelConfig = kw.pop("model", preset("nano", seq_len=SEQ))
    return TrainConfig(
        model=model,
        parallel=ParallelConfig(
            dp=dp, tp=tp, sequence_parallel=sp, bucket_mb=kw.pop("bucket_mb", 0.1)
        ),
        steps=steps,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        warmup_steps=2,
        progress=False,
        **kw,
    )


def serial_reference(
    cfg: TrainConfig, corpus: TokenCorpus, staleness: int = 0, model=None, logits=None
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The ground truth: one process, the whole global batch in one forward and backward.

    ``staleness`` S: step t steps with the gradient of step t − S (none in the first S
    steps), as ``--dp-mode stale:S`` defines. ``model`` (default paracube's GPT from the
    seed) and ``logits(model, tokens)`` (default ``model(tokens)``) train another model,
    e.g. a plain Hugging Face one. Returns the loss of every step and the parameters
    after the last step.
    """
    if model is None:
        torch.manual_seed(cfg.seed)
        model = GPT(cfg.model)
    forward = logits or (lambda m, x: m(x))
    optimizer = build_optimizer(model, cfg)
    sampler = ShardedBatchSampler(corpus.train, cfg.model.seq_len, cfg.global_batch, cfg.seed)
    losses = []
    late: list[list[torch.Tensor | None]] = []  # gradients waiting S steps
    for step in range(cfg.steps):
        x, y = sampler.global_batch_at(step)  # (G, T)
        model.zero_grad(set_to_none=True)
        loss = lm_loss(forward(model, x), y)
        loss.backward()
        losses.append(loss.item())
        if staleness:
            late.append([p.grad for p in model.parameters()])
            if len(late) <= staleness:
                continue
            for p, g in zip(model.parameters(), late.pop(0)):
                p.grad = g
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        optimizer.step()
    return losses, {k: v.detach().clone() for k, v in model.named_parameters()}


@functools.cache
def serial_cached(
    global_batch: int, steps: int, model: ModelConfig | None = None, dtype=torch.float32
):
    """:func:`serial_reference` on :func:`small_corpus`, memoised per (batch, steps, model, dtype)."""
    kw = {"model": model} if model is not None else {}
    with default_dtype(dtype):
        return serial_reference(
            train_config(dp=1, micro_batch=global_batch, steps=steps, **kw), small_corpus()
        )


@contextlib.contextmanager
def default_dtype(dtype):
    """Build and train in ``dtype`` (float64 runs show that parallel == serial up to the
    last bits, separating real errors from float32 rounding)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Norm-wise relative error ‖a − b‖ / ‖b‖ (elementwise ratios blow up near zero)."""
    a = torch.as_tensor(a).detach().to(torch.float64)
    b = torch.as_tensor(b).detach().to(torch.float64)
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# The key projection's bias has an exactly-zero true gradient: it adds q·b to every score
# of a query row, and softmax is invariant to a shift along that row. Its values are
# rounding noise (norm ~1e-5 after a few Adam steps, against ~0.06 for the other biases)
# in the serial and the parallel run alike, so a relative comparison would compare two
# noises. That section of the fused q|k|v bias is checked to stay at noise level instead.
def zero_gradient_section(name: str, tensors: dict) -> slice | None:
    """The k part of ``blocks.i.attn.qkv_proj.bias``, else None."""
    if not name.endswith("attn.qkv_proj.bias"):
        return None
    hidden = tensors[name.replace("qkv_proj.bias", "o_proj.weight")].shape[0]
    kv = (tensors[name].shape[0] - hidden) // 2
    return slice(hidden, hidden + kv)


def split_zero_gradient(
    name: str, t: torch.Tensor, tensors: dict
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the part with a real gradient, the zero-gradient part or None)."""
    k = zero_gradient_section(name, tensors)
    if k is None:
        return t, None
    return torch.cat([t[: k.start], t[k.stop :]]), t[k]


def assert_params_close(got: dict, want: dict, tol: float = 1e-5, tensor_tol: float = 1e-4) -> None:
    """All parameters together within ``tol`` (norm-wise relative); each tensor within
    ``tensor_tol``. Why a looser per-tensor bound: the parallel gradient differs from the
    serial one only by summation order (~1e-7 relative), but Adam divides each element by
    sqrt(v), so in a small tensor whose gradients are near zero (e.g. a query bias, median
    |g| ~3e-5) that rounding is amplified to ~1e-5 after a few steps. A real bug (a missed
    or doubled reduction) shows up as O(1) errors, far above either bound."""
    assert got.keys() == want.keys()
    flat_got = torch.cat([got[k].flatten() for k in want])
    flat_want = torch.cat([want[k].flatten() for k in want])
    whole = rel_err(flat_got, flat_want)
    assert whole <= tol, f"parameters differ from serial: relative error {whole:.2e} > {tol}"
    errors = []
    for k in want:
        g, g_noise = split_zero_gradient(k, got[k], got)
        w, w_noise = split_zero_gradient(k, want[k], want)
        if w_noise is not None:
            assert g_noise.norm() < 1e-3 and w_noise.norm() < 1e-3, (
                f"k part of {k} should stay at noise level"
            )
        errors.append((rel_err(g, w), k))
    worst = max(errors, key=lambda t: t[0])
    assert worst[0] <= tensor_tol, (
        f"parameter {worst[1]} differs from serial: relative error {worst[0]:.2e}"
    )


def assert_losses_close(got: list[float], want: list[float], tol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want)):
        assert abs(g - w) <= tol * abs(w), f"step {step}: loss {g!r} vs serial {w!r}"
