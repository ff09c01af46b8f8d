"""Cutting an ordered chain of layers into pipeline stages.

The chain is split into ``p·v`` contiguous parts (v virtual chunks per rank; part
``s`` runs on rank ``s mod p``) minimising the largest part's load — dynamic programming
over (layers, parts), exact, O(parts · layers²). The load of a layer may depend on the
stage it lands on: under 1F1B the first stage keeps p micro-batches of activations in
flight and the last one 1 (Narayanan et al. 2021), so balancing by *memory* moves layers
away from the early stages.

For the reference GPT the chain is ``embed, blocks[0..L), norm, head``
(:meth:`paracube.models.gpt.GPT.layers`) and its loads are in :mod:`paracube.pipeline.balance`;
any ``nn.Sequential`` works the same way.
"""

from __future__ import annotations

from collections.abc import Callable

from paracube.errors import ConfigError


def partition(
    n_layers: int,
    parts: int,
    load: Callable[[int, int], float],
    fits: Callable[[int, int, int], bool] | None = None,
) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` ranges, one per part, every layer exactly once, each part
    non-empty, minimising ``max_part Σ load(part, layer)``; with ``fits(part, start, end)``
    (memory: it must stay false once false as a part grows) only parts that fit."""
    if parts > n_layers:
        raise ConfigError(
            f"{n_layers} layers cannot fill {parts} pipeline stages (pp × chunks): "
            "use fewer stages or chunks, or a deeper model"
        )
    inf = float("inf")
    # best[k][j]: minimal max-load placing layers [0, j) into parts [0, k)
    best = [[inf] * (n_layers + 1) for _ in range(parts + 1)]
    cut = [[0] * (n_layers + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for j in range(k, n_layers - (parts - k) + 1):
            run = 0.0
            for i in range(j - 1, k - 2, -1):  # part k-1 holds layers [i, j)
                if fits is not None and not fits(k - 1, i, j):
                    break  # a longer part holds more: it cannot fit either
                run += load(k - 1, i)
                if run >= best[k][j]:
                    break  # loads are not negative: a longer part cannot do better
                cand = max(best[k - 1][i], run)
                if cand < best[k][j]:
                    best[k][j], cut[k][j] = cand, i
    if best[parts][n_layers] == inf:
        raise ConfigError(
            f"no split of the {n_layers} layers into {parts} pipeline stages fits every "
            "stage's memory: use more stages, a smaller micro-batch, recomputation or ZeRO"
        )
    bounds, j = [], n_layers
    for k in range(parts, 0, -1):
        bounds.append((cut[k][j], j))
        j = cut[k][j]
    return bounds[::-1]


def describe_split(
    names: list[str],
    bounds: list[tuple[int, int]],
    load: Callable[[int, int], float],
    p: int,
    unit: Callable[[float], str] = lambda x: f"load {x:,.3g}",
) -> str:
    """One line per part: its rank, layers and estimated load (printed by ``paracube train``)."""
    lines = []
    for k, (a, b) in enumerate(bounds):
        total = sum(load(k, i) for i in range(a, b))
        span = names[a] if b - a == 1 else f"{names[a]} … {names[b - 1]}"
        lines.append(
            f"  stage {k} (rank pp={k % p}, chunk {k // p}): {b - a} layers [{span}], {unit(total)}"
        )
    return "\n".join(lines)
