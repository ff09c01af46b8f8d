"""Measuring this machine's GPU, so the planner's datasheet constants can be checked.

``paracube calibrate`` on a machine with CUDA adds a ``gpu`` section to the calibration:
the GPU's name, SMs and memory; the bf16 tensor-core rate at several GEMM shapes (square
ones, and a transformer block's at 16,384 tokens: the shapes whose tile and wave
quantization ``planner.time_model.wave_efficiency`` models) and the head's with GPT-2's
vocabulary, plain and padded as the GPT runs it; fp32 on the CUDA cores and
TF32 on the tensor cores (8192³); the fused causal attention of
``scaled_dot_product_attention`` (bf16, forward and forward + backward, counted as the
planner counts it); and the memory bandwidth of a device-to-device copy. The planner reads
them (:func:`paracube.planner.local.calibrated_gpu`) as "this GPU, measured", beside the
catalog's datasheet entry.

Every figure is the median of rounds timed with CUDA events after warm-up, on random data
(zeros run faster: the tensor cores' power draw depends on the bits they toggle).
"""

from __future__ import annotations

# (m, n, k) of an (m×k)·(k×n) product. The squares show the rate's climb with size. The
# block shapes are a transformer block's linear layers at 16,384 tokens (micro-batch 8 ×
# 2048): QKV, projection, MLP up and down of GPT-3 1.3B (h = 2048) and of a 6.7B (h =
# 4096) — what training runs, and what the calibrated GPU's peak is taken from. The head's
# shape has GPT-2's 50,257-token vocabulary, whose odd rows keep the product off the
# tensor cores' fast kernels.
SQUARES: tuple[tuple[int, int, int], ...] = (
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (16384, 16384, 16384),
)
BLOCK_SHAPES: tuple[tuple[int, int, int], ...] = (
    (16384, 6144, 2048),
    (16384, 2048, 2048),
    (16384, 8192, 2048),
    (16384, 2048, 8192),
    (16384, 12288, 4096),
    (16384, 4096, 4096),
    (16384, 16384, 4096),
    (16384, 4096, 16384),
)
HEAD_SHAPE = (16384, 50257, 2048)
GEMM_SHAPES = SQUARES + BLOCK_SHAPES + (HEAD_SHAPE,)
# FlashAttention-2's benchmark shape (Dao 2023, Fig. 4: head dim 128, 16k tokens per batch)
# at GPT-3 1.3B's sequence: batch 8 × 16 heads × 2048 × 128
ATTENTION_SHAPE = (8, 16, 2048, 128)


def _timed(fn, repeats: int, rounds: int = 5) -> float:
    """Median seconds per call of ``fn`` over ``rounds`` rounds of ``repeats`` calls, timed
    with CUDA events (the host only queues kernels), after three warm-up calls."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / repeats)
    return sorted(times)[rounds // 2]


def _gemm_rate(m: int, n: int, k: int, dtype, device) -> float:
    import torch

    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(k, n, dtype=dtype, device=device)
    flops = 2 * m * n * k
    repeats = max(3, min(50, int(2e13 / flops)))  # ~20 TFLOP a round: tens of milliseconds
    seconds = _timed(lambda: a @ b, repeats)
    return flops / seconds


def _matmul_rates(device) -> dict:
    import torch

    bf16 = {"x".join(map(str, s)): _gemm_rate(*s, torch.bfloat16, device) for s in GEMM_SHAPES}
    # fp32: torch's default keeps TF32 off, so fp32 products run on the CUDA cores
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        fp32 = _gemm_rate(8192, 8192, 8192, torch.float32, device)
        torch.backends.cuda.matmul.allow_tf32 = True
        tf32 = _gemm_rate(8192, 8192, 8192, torch.float32, device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return {"bf16": bf16, "fp32": fp32, "tf32": tf32}


def _head_rates(device) -> dict:
    """The head's forward + backward (bf16) at :data:`HEAD_SHAPE` as the model runs it: a
    plain ``F.linear`` over the 50,257-token vocabulary, and the GPT's padded products
    (``models.gpt.Head``); FLOP/s of the three products (6·m·n·k)."""
    import torch
    import torch.nn.functional as F

    from paracube.models.gpt import _PaddedHeadProduct

    m, vocab, k = HEAD_SHAPE
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device, requires_grad=True)
    w = torch.randn(vocab, k, dtype=torch.bfloat16, device=device, requires_grad=True)
    grad = torch.randn(m, vocab, dtype=torch.bfloat16, device=device)
    rates = {}
    for name, product in (("plain", F.linear), ("padded", _PaddedHeadProduct.apply)):
        seconds = _timed(lambda product=product: product(x, w).backward(grad), 5)
        rates[name] = 6 * m * vocab * k / seconds
    return rates


def _attention_rates(device) -> dict:
    """Causal SDPA in bf16: FLOP/s of the forward and of forward + backward, the FLOPs
    counted as ``time_model.attention_core`` counts them — the unmasked half of 4·b·a·s²·d
    forward, 3.5× that for forward + backward (the backward's 2.5×) — and the seconds."""
    import torch
    import torch.nn.functional as F

    b, heads, s, d = ATTENTION_SHAPE
    q, k, v = (
        torch.randn(b, heads, s, d, dtype=torch.bfloat16, device=device, requires_grad=True)
        for _ in range(3)
    )
    grad = torch.randn(b, heads, s, d, dtype=torch.bfloat16, device=device)
    executed = 4 * b * heads * s * s * d / 2

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward_backward():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    fwd = _timed(forward, 20)
    both = _timed(forward_backward, 10)
    return {
        "shape": list(ATTENTION_SHAPE),
        "forward_s": fwd,
        "forward_backward_s": both,
        "forward_flops": executed / fwd,
        "backward_flops": 2.5 * executed / (both - fwd),
        "flops": 3.5 * executed / both,  # what the planner's single attention rate is
    }


def _copy_bandwidth(device, gib: int = 4) -> float:
    """Bytes per second of a device-to-device copy, read plus written."""
    import torch

    src = torch.empty(gib << 28, dtype=torch.float32, device=device)  # 4 bytes each
    dst = torch.empty_like(src)
    seconds = _timed(lambda: dst.copy_(src), 5)
    return 2 * src.numel() * 4 / seconds


def calibrate_gpu() -> dict:
    """The ``gpu`` section of the calibration, measured on ``cuda:0`` (a few seconds)."""
    import torch

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)  # autograd's backward threads then find a current context
    props = torch.cuda.get_device_properties(device)
    return {
        "name": props.name,
        "sms": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "matmul": _matmul_rates(device),
        "head": _head_rates(device),
        "attention": _attention_rates(device),
        "memory_bandwidth": _copy_bandwidth(device),
    }
