"""Measuring this machine, so the planner can predict paracube's own runs here.

``paracube plan --calibrate`` measures, in a few seconds: the matmul rate of one thread
(fp32, 512³), the rate of the fused attention kernel (``scaled_dot_product_attention``,
causal, forward + backward, at the ``small`` preset's shape: 8 heads of 32, sequence 128 —
a CPU's attention kernel runs far below its matmul rate, unlike a GPU's FlashAttention),
the rate of the MLP's GELU (tanh form, as paracube's model), forward and backward per element
— compute-bound on a CPU, where a GPU's fused kernel is bound by memory —
the memory bandwidth (a large copy) — each of these the median of five timed rounds —,
and gloo's latency and bandwidth
between two local processes, for a point-to-point transfer (4 KiB and 8 MiB, fastest of
ten) and for an all-reduce (the same sizes, each issued between computes as a step issues
them: α and β of the α-β model), and what an all-gather plus a reduce-scatter pair costs against the
all-reduce it replaces under sequence parallelism (1 MiB, an activation's size, each half
and the all-reduce between computes too: on NCCL the pair *is* a ring all-reduce, ratio 1;
gloo implements the three separately). It saves them as JSON; the planner
(:mod:`paracube.planner.local`) then treats "this machine" as a GPU whose peak is the
measured matmul rate × threads per rank. This module measures (torch, processes); the
planner only reads the file. On a machine with CUDA it measures the GPU too
(:mod:`paracube.calibrate_gpu`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from paracube.planner.local import DEFAULT_PATH


def _median_rate(work: float, run, rounds: int = 5) -> float:
    """``work`` per second of ``run()``: the median of ``rounds`` timed rounds, after one
    to warm up. A shared machine's clock and neighbours move a single round by a quarter,
    and one round's hiccup in a rate the planner divides by moves a prediction by as much."""
    run()
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        rates.append(work / (time.perf_counter() - start))
    return sorted(rates)[rounds // 2]


def _matmul_rate(n: int = 512, repeats: int = 10) -> float:
    """FLOP/s of one thread's n³ fp32 matmul."""
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(n, n), torch.randn(n, n)

    def run() -> None:
        for _ in range(repeats):
            a @ b

    return _median_rate(2 * n**3 * repeats, run)


def _attention_rate(
    b: int = 8, heads: int = 8, s: int = 128, d: int = 32, repeats: int = 10
) -> float:
    """FLOP/s of one thread's causal SDPA, forward + backward, counted as the planner counts
    it (``time_model.attention_core``): the unmasked half of 4·b·a·s²·d forward, 3.5× that
    for forward + backward (FlashAttention's backward: five matmuls for the forward's two)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    q, k, v = (torch.randn(b, heads, s, d, requires_grad=True) for _ in range(3))

    def step():
        for _ in range(repeats):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    return _median_rate(3.5 * 2 * b * heads * s * s * d * repeats, step)


def _activation_rates(n: int = 1 << 20, repeats: int = 10, rounds: int = 5) -> tuple[float, float]:
    """Elements per second of one thread's GELU (tanh), forward and backward separately,
    each forward followed by its backward as a step runs them: each the median of
    ``rounds`` rounds (:func:`_median_rate`'s reason)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    x = torch.randn(n, requires_grad=True)
    grad = torch.ones(n)
    F.gelu(x, approximate="tanh").backward(grad)
    forwards, backwards = [], []
    for _ in range(rounds):
        forward = backward = 0.0
        for _ in range(repeats):
            start = time.perf_counter()
            y = F.gelu(x, approximate="tanh")
            mid = time.perf_counter()
            y.backward(grad)
            forward, backward = forward + mid - start, backward + time.perf_counter() - mid
        forwards.append(n * repeats / forward)
        backwards.append(n * repeats / backward)
    return sorted(forwards)[rounds // 2], sorted(backwards)[rounds // 2]


def _copy_bandwidth(mib: int = 256, repeats: int = 2) -> float:
    """Bytes per second of a large float32 copy, read + written."""
    import torch

    src = torch.empty(mib << 18)  # float32: 4 bytes each
    dst = torch.empty_like(src)

    def run() -> None:
        for _ in range(repeats):
            dst.copy_(src)

    return _median_rate(2 * src.numel() * 4 * repeats, run)


def _pingpong(rank: int, port: int, out) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    torch.set_num_threads(1)  # as a rank of paracube train on CPU runs
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def compute() -> None:  # a layer's worth of work between two collectives, ~0.5-1.5 ms
        for _ in range(4):
            a @ b

    p2p: dict[int, float] = {}
    reduce: dict[int, float] = {}
    for size in (1024, 2 << 20):  # floats: 4 KiB and 8 MiB
        buf = torch.zeros(size)
        times = []
        for i in range(11):
            start = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if i:
                times.append((time.perf_counter() - start) / 2)
        # the fastest of ten: the transfer itself, without the scheduler's noise
        p2p[size * 4] = min(times)
        reduce[size * 4] = _between_computes(lambda buf=buf: dist.all_reduce(buf), compute)
    # Sequence parallelism's pair against the all-reduce it replaces, at 1 MiB (full size).
    full, half = torch.zeros(1 << 18), torch.zeros(1 << 17)

    from paracube.comm.ops import all_gather_flat, reduce_scatter_flat

    def gather() -> None:
        all_gather_flat(full, half)

    def scatter() -> None:
        reduce_scatter_flat(half, full)

    def one(collective) -> float:  # one round, between computes as a block issues them
        return _between_computes(collective, compute, rounds=1)

    # the pair's two halves sit apart in a block (the gather before the first linear, the
    # scatter after the last), each between computes; the three measured in turns, round by
    # round, so that the machine's drift between them cancels in each round's ratio; the
    # median round
    ratios = sorted(
        (one(gather) + one(scatter)) / one(lambda: dist.all_reduce(full)) for _ in range(15)
    )
    ratio = ratios[len(ratios) // 2]
    if rank == 0:
        out.put({"p2p": p2p, "all_reduce": reduce, "pair_ratio": ratio})
    dist.destroy_process_group()


def _between_computes(collective, compute, calls: int = 10, rounds: int = 5) -> float:
    """Seconds a collective adds to a step that issues it between computes, as a tensor-
    parallel block issues its all-reduces between matmuls: per round, ``calls`` times the
    collective then ``compute``, less ``calls`` times ``compute`` alone, per call; the median
    round. On a two-core machine a small gloo all-reduce issued so adds 2-3× what it takes
    issued back to back: the ranks' skew after each compute, and gloo's threads no longer
    spinning on the previous call — what a step pays, and what tensor parallelism's
    prediction had missed."""
    collective()
    compute()
    added = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            collective()
            compute()
        both = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(calls):
            compute()
        added.append((both - (time.perf_counter() - start)) / calls)
    return max(sorted(added)[rounds // 2], 1e-6)


def _alpha_beta(points: dict) -> tuple[float, float]:
    """(α seconds, bandwidth bytes/s) through two (bytes → seconds) measurements."""
    (s_bytes, s_time), (b_bytes, b_time) = sorted(points.items())
    beta = max((b_time - s_time) / (b_bytes - s_bytes), 1e-12)
    return max(s_time - beta * s_bytes, 1e-6), 1 / beta


def _link() -> dict:
    """α-β of a gloo transfer and of a gloo all-reduce between two local processes."""
    import multiprocessing as mp
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_pingpong, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    measured = out.get(timeout=120)
    for p in procs:
        p.join(timeout=30)
    latency, bandwidth = _alpha_beta(measured["p2p"])
    reduce_latency, reduce_bandwidth = _alpha_beta(measured["all_reduce"])
    return {
        "link_latency": latency,
        "link_bandwidth": bandwidth,
        "allreduce_latency": reduce_latency,
        "allreduce_bandwidth": reduce_bandwidth,
        "gather_scatter_pair_ratio": measured["pair_ratio"],
    }


def calibrate(path: Path = DEFAULT_PATH) -> dict:
    """Measure this machine's CPU and gloo (what ``paracube train`` on CPU ranks uses) and,
    where CUDA is available, its first GPU (:mod:`paracube.calibrate_gpu`); save them."""
    import torch

    gelu_forward, gelu_backward = _activation_rates()
    data = {
        "matmul_flops_per_thread": _matmul_rate(),
        "attention_flops_per_thread": _attention_rate(),
        "gelu_forward_per_thread": gelu_forward,
        "gelu_backward_per_thread": gelu_backward,
        "memory_bandwidth": _copy_bandwidth(),
        **_link(),
        "cores": os.cpu_count() or 1,
    }
    if torch.cuda.is_available():
        from paracube.calibrate_gpu import calibrate_gpu

        data["gpu"] = calibrate_gpu()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return data
