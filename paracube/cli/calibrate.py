"""``paracube calibrate`` (also ``paracube plan --calibrate``): measure this machine for
``paracube train --predict`` (the measurements are :mod:`paracube.calibrate`)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="measure this machine (matmul, attention, GELU, memory and gloo rates) for `train --predict`",
        description="Measure this machine so the planner can predict paracube's own runs here.",
    )
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args) -> int:
    from paracube.calibrate import calibrate
    from paracube.planner.local import DEFAULT_PATH

    data = calibrate()
    print(
        f"matmul {data['matmul_flops_per_thread'] / 1e9:.1f} GFLOP/s per thread, attention "
        f"{data['attention_flops_per_thread'] / 1e9:.1f} GFLOP/s per thread, memory "
        f"{data['memory_bandwidth'] / 1e9:.1f} GB/s, gloo {data['link_bandwidth'] / 1e9:.2f} GB/s "
        f"+ {data['link_latency'] * 1e6:.0f} µs per message, all-reduce {data['allreduce_bandwidth'] / 1e9:.2f} GB/s "
        f"+ {data['allreduce_latency'] * 1e6:.0f} µs, all-gather + reduce-scatter pair "
        f"{data['gather_scatter_pair_ratio']:.2f}× the all-reduce; saved to {DEFAULT_PATH}"
    )
    return 0
