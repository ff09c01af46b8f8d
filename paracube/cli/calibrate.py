"""``paracube calibrate`` (also ``paracube plan --calibrate``): measure this machine for
``paracube train --predict`` (the measurements are :mod:`paracube.calibrate`)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="measure this machine (CPU, gloo, and its GPU where there is one) for `train --predict`",
        description="Measure this machine so the planner can predict paracube's own runs here.",
    )
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args) -> int:
    from paracube.calibrate import calibrate
    from paracube.planner.local import DEFAULT_PATH

    data = calibrate()
    print(
        f"matmul {data['matmul_flops_per_thread'] / 1e9:.1f} GFLOP/s per thread, attention "
        f"{data['attention_flops_per_thread'] / 1e9:.1f} GFLOP/s per thread, GELU "
        f"{data['gelu_forward_per_thread'] / 1e9:.2f} / {data['gelu_backward_per_thread'] / 1e9:.2f} "
        f"G elements/s per thread (forward / backward), memory "
        f"{data['memory_bandwidth'] / 1e9:.1f} GB/s, gloo {data['link_bandwidth'] / 1e9:.2f} GB/s "
        f"+ {data['link_latency'] * 1e6:.0f} µs per message, all-reduce {data['allreduce_bandwidth'] / 1e9:.2f} GB/s "
        f"+ {data['allreduce_latency'] * 1e6:.0f} µs, all-gather + reduce-scatter pair "
        f"{data['gather_scatter_pair_ratio']:.2f}× the all-reduce; saved to {DEFAULT_PATH}"
    )
    if "gpu" in data:
        print("\n".join(gpu_lines(data)))
    return 0


def gpu_lines(data: dict) -> list[str]:
    """The measured GPU (the calibration's ``gpu`` section) beside the planner: each GEMM
    shape's bf16 rate against the time model's — the calibrated peak, and the catalog's
    sustained datasheet peak, each derated by that shape's tile and wave quantization — and
    the fp32, TF32, attention and memory rates against the datasheet's."""
    from paracube.calibrate_gpu import GEMM_SHAPES, HEAD_SHAPE
    from paracube.planner import local
    from paracube.planner.hardware import GPUS, catalog_key
    from paracube.planner.time_model import wave_efficiency

    measured = data["gpu"]
    calibrated, _ = local.calibrated_gpu(data) or (None, None)
    assert calibrated is not None
    key = catalog_key(measured["name"])
    listed = GPUS.get(key) if key else None
    sustained = calibrated.peak_flops * calibrated.sustained_fraction
    T = 1e12
    lines = [
        f"GPU: {measured['name']}, {measured['sms']} SMs, {measured['memory_bytes'] / 2**30:.0f} GiB; "
        f"torch {measured['torch']}, CUDA {measured['cuda']}; "
        + (f"catalog entry: {listed.name}" if listed else "not in the planner's catalog"),
        "bf16 GEMM (m×n×k): measured TFLOP/s | model with the calibrated peak | model with the datasheet",
    ]
    for m, n, k in GEMM_SHAPES:
        rate = measured["matmul"]["bf16"][f"{m}x{n}x{k}"]
        waves = wave_efficiency(m, n, measured["sms"])
        sheet = (
            f"{listed.peak_flops * listed.sustained_fraction * waves / T:.0f}" if listed else "-"
        )
        lines.append(f"  {m}×{n}×{k}: {rate / T:.0f} | {sustained * waves / T:.0f} | {sheet}")
    attention = measured["attention"]
    if "head" in measured:  # (a calibration before the head was measured has none)
        lines.append(
            f"the head {HEAD_SHAPE[0]}×{HEAD_SHAPE[1]}×{HEAD_SHAPE[2]}, forward + backward: plain "
            f"F.linear {measured['head']['plain'] / T:.0f}, padded as the GPT runs it "
            f"{measured['head']['padded'] / T:.0f} TFLOP/s"
        )
    lines += [
        f"bf16 sustained (the block shapes' median, each over its wave efficiency): "
        f"{sustained / T:.0f} TFLOP/s"
        + (
            f"; datasheet {listed.peak_flops / T:.0f} × sustained {listed.sustained_fraction:.3f} "
            f"= {listed.peak_flops * listed.sustained_fraction / T:.0f}"
            if listed
            else ""
        ),
        f"fp32 (CUDA cores) {measured['matmul']['fp32'] / T:.1f} TFLOP/s, TF32 "
        f"{measured['matmul']['tf32'] / T:.0f} TFLOP/s"
        + (
            f"; datasheet {listed.rate('fp32') / T:.1f} and {listed.rate('tf32') / T:.0f}"
            if listed
            else ""
        ),
        f"causal SDPA bf16 {tuple(attention['shape'])}: forward {attention['forward_flops'] / T:.0f}, "
        f"backward {attention['backward_flops'] / T:.0f}, forward + backward "
        f"{attention['flops'] / T:.0f} TFLOP/s (executed FLOPs)"
        + (f"; the catalog's {listed.attention_rate / T:.0f}" if listed else ""),
        f"HBM copy {measured['memory_bandwidth'] / 1e9:.0f} GB/s (read + written)"
        + (f"; datasheet {listed.hbm_bandwidth / 1e9:.0f}" if listed else ""),
    ]
    return lines
