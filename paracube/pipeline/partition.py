"""Cutting an ordered chain of layers into pipeline stages.

The chain is split into ``p·v`` contiguous parts (v virtual chunks per rank; part
``s`` runs on rank ``s mod p``) minimising the largest part's load — dynamic programming
over (layers, parts), exact, O(parts · layers²). The load of a layer may depend on the
stage it lands on: under 1F1B the first stage keeps p micro-batches of activations in
flight and the last one 1 (Narayanan et al. 2021), so balancing by *memory* moves layers
away from the early stages.

For the reference GPT the chain is ``embed, blocks[0..L), norm, head``
(:meth:`paracube.models.gpt.GPT.layers`); any ``nn.Sequential`` works the same way.
"""

from __future__ import annotations

from typing import Callable

from paracube.config import ModelConfig
from paracube.errors import ConfigError

BALANCE = ("params", "flops", "memory", "time")


def partition(n_layers: int, parts: int, load: Callable[[int, int], float]) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` ranges, one per part, every layer exactly once, each part
    non-empty, minimising ``max_part Σ load(part, layer)``."""
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
                run += load(k - 1, i)
                cand = max(best[k - 1][i], run)
                if cand < best[k][j]:
                    best[k][j], cut[k][j] = cand, i
    bounds, j = [], n_layers
    for k in range(parts, 0, -1):
        bounds.append((cut[k][j], j))
        j = cut[k][j]
    return bounds[::-1]


def gpt_layer_names(cfg: ModelConfig) -> list[str]:
    return ["embed", *(f"blocks.{i}" for i in range(cfg.n_layers)), "norm", "head"]


def gpt_layer_loads(cfg: ModelConfig, balance: str, *, micro_batch: int, p: int, schedule: str = "1f1b",
                    m: int = 1) -> Callable[[int, int], float]:
    """``load(part, layer)`` for the reference GPT under ``balance``:

    - ``params``: parameter count (the head counted even when tied: its stage holds a copy);
    - ``flops``: forward + backward FLOPs per micro-batch, 3× the forward's
      (matmuls 2·b·s·(in·out); attention scores 4·b·s²·h; the LM head 2·b·s·h·V);
    - ``memory``: fp32 weights + gradients + Adam states (16 bytes per parameter) plus
      the activations the layer saves per micro-batch (counted bytes of this model:
      ≈ (18·h + 2·F + 3·a·s)·b·s·4 per block; b·s·V·4·2 for head and loss) times the
      micro-batches in flight on that part's rank (1F1B: p − rank; GPipe: m).
    """
    if balance not in BALANCE:
        raise ConfigError(f"unknown --balance {balance!r}: choose one of {', '.join(BALANCE)}")
    from paracube.models.presets import parameter_count

    b, s, h, V, F = micro_batch, cfg.seq_len, cfg.hidden, cfg.vocab_size, cfg.ffn_hidden
    L = cfg.n_layers
    one = cfg.replace(n_layers=1, tie_embeddings=False)
    block_params = parameter_count(one) - (V * h + (s * h if cfg.position == "learned" else 0) + V * h
                                           + (2 * h if cfg.norm == "layernorm" else h))
    embed_params = V * h + (s * h if cfg.position == "learned" else 0)
    norm_params = 2 * h if cfg.norm == "layernorm" else h
    params = [embed_params, *([block_params] * L), norm_params, V * h]
    kv = cfg.n_kv_heads * cfg.head_dim
    mlp_in = (2 if cfg.activation == "swiglu" else 1) * F
    block_flops = 3 * (2 * b * s * h * (h + 2 * kv + h + mlp_in + F) + 4 * b * s * s * h)
    flops = [3 * b * s * h, *([block_flops] * L), 3 * 5 * b * s * h, 3 * 2 * b * s * h * V]
    block_act = (18 * h + 2 * F + 3 * cfg.n_heads * s) * b * s * 4
    acts = [b * s * h * 4, *([block_act] * L), 2 * b * s * h * 4, 2 * b * s * V * 4]
    if balance == "params":
        return lambda part, layer: float(params[layer])
    if balance == "flops" or balance == "time":
        return lambda part, layer: float(flops[layer])

    def memory(part: int, layer: int) -> float:
        rank = part % p
        in_flight = m if schedule == "gpipe" else min(p - rank, m) if schedule != "zb-h1" else min(p, m)
        return 16.0 * params[layer] + acts[layer] * in_flight

    return memory


def describe_split(names: list[str], bounds: list[tuple[int, int]], load: Callable[[int, int], float], p: int) -> str:
    """One line per part: its rank, layers and estimated load (printed by ``paracube train``)."""
    lines = []
    for k, (a, b) in enumerate(bounds):
        total = sum(load(k, i) for i in range(a, b))
        span = names[a] if b - a == 1 else f"{names[a]} … {names[b - 1]}"
        lines.append(f"  stage {k} (rank pp={k % p}, chunk {k // p}): {b - a} layers [{span}], load {total:,.3g}")
    return "\n".join(lines)
