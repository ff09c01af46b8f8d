"""Communication volumes, as the engine's ledger counts them and as the wire carries them.

Payload convention (what :class:`paracube.comm.ledger.CommLedger` records): an
all-reduce of an ``n``-byte tensor counts ``n``; an all-gather counts the gathered
``n``; a reduce-scatter counts its full ``n``-byte input. Wire bytes per rank for a ring
over ``t`` ranks (docs/formulas.md, "Communication volume"; NCCL's bus-bandwidth factors):
all-reduce ``2(t−1)/t·n``, all-gather and reduce-scatter ``(t−1)/t·n`` each — so an
all-gather plus a reduce-scatter moves exactly what one all-reduce moves.
"""

from __future__ import annotations

WIRE_FACTOR = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}


def wire_bytes(kind: str, payload: float, ranks: int) -> float:
    """Bytes each rank sends for a ring collective of ``payload`` bytes over ``ranks``."""
    if ranks <= 1:
        return 0.0
    return WIRE_FACTOR[kind] * (ranks - 1) / ranks * payload


def tp_layer_payload(
    b: int, s: int, h: int, t: int, *, bytes_per_element: int, sequence_parallel: bool
) -> dict[str, int]:
    """Tensor-parallel payload bytes of one transformer layer, one micro-batch, forward
    plus backward, per rank (Shoeybi et al. 2019 §3; Korthikanti et al. 2022 §4.2.2).

    Without sequence parallelism: *g* after attention and after the MLP all-reduce in
    forward, *f* before them all-reduce in backward — four all-reduces of ``b·s·h``.
    With it, each all-reduce becomes an all-gather plus a reduce-scatter of ``b·s·h``:
    forward gathers before and reduce-scatters after each of the two regions, and the
    backward does the reverse — and gathers the two regions' inputs once more, since the
    layers that take them keep only their sequence shards (§4.2.2).
    """
    if t == 1:
        return {}
    n = b * s * h * bytes_per_element
    if sequence_parallel:
        return {"all_gather": 6 * n, "reduce_scatter": 4 * n}
    return {"all_reduce": 4 * n}


def total_wire_bytes(payload: dict[str, float], ranks: int) -> float:
    return sum(wire_bytes(kind, v, ranks) for kind, v in payload.items())
