"""Pipeline schedules as data: for each rank, the ordered list of compute actions.

An :class:`Action` is ``F`` (forward), ``B`` (full backward), or, for zero-bubble
schedules, ``I`` (backward for the input gradient) and ``W`` (backward for the weights),
of one micro-batch ``mb`` on one of the rank's model chunks ``chunk``. Communication is
implied by the stage graph and done by the executor: the forward of virtual stage ``s``
receives from stage ``s−1`` and sends to ``s+1``; the backward the other way. With ``v``
chunks per rank, virtual stage ``s = chunk·p + rank`` (Narayanan et al. 2021, §2.2).

The same lists drive the executor (real run) and the simulator (costs, timeline,
bubble), so the picture, the formula and the run agree.

Shapes of the schedules (p ranks, m micro-batches, v chunks):
- ``gpipe`` (Huang et al. 2019): all forwards, then all backwards; m in flight.
- ``1f1b`` (PipeDream-Flush, Narayanan et al. 2021): p−r−1 warm-up forwards, then one
  forward / one backward, then the cool-down backwards; at most p−r in flight.
- ``interleaved-1f1b`` (Narayanan et al. 2021, §2.2): 1F1B over v chunks, micro-batches
  in groups of p; bubble (p−1)/(v·m + p−1); needs m a multiple of p.
- ``zb-h1`` (Qi et al. 2024, "Zero Bubble Pipeline Parallelism"): 1F1B's order with the
  backward split into I and W, and W deferred to fill what would be idle time, at most
  p−r−1 W's outstanding, so in-flight activations stay within 1F1B's.
"""

from __future__ import annotations

from dataclasses import dataclass

from paracube.errors import ConfigError

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")


@dataclass(frozen=True)
class Action:
    kind: str  # "F", "B", "I" or "W"
    mb: int
    chunk: int = 0

    def __repr__(self) -> str:
        return f"{self.kind}{self.mb}" + (f".{self.chunk}" if self.chunk else "")


def check_schedule(name: str, p: int, m: int, v: int = 1) -> None:
    """Refuse a schedule that cannot run as asked — before any collective."""
    if name not in SCHEDULES:
        raise ConfigError(f"unknown schedule {name!r}: choose one of {', '.join(SCHEDULES)}")
    if m < 1:
        raise ConfigError(f"--microbatches must be ≥ 1, got {m}")
    if v < 1:
        raise ConfigError(f"--chunks must be ≥ 1, got {v}")
    if name != "interleaved-1f1b" and v != 1:
        raise ConfigError(f"--chunks {v} needs --schedule interleaved-1f1b ({name} runs one chunk per rank)")
    if name in ("1f1b", "zb-h1") and m < p:
        raise ConfigError(f"{name} needs at least as many micro-batches as stages: --microbatches {m} < --pp {p}")
    if name == "interleaved-1f1b":
        if v < 2:
            raise ConfigError("interleaved-1f1b needs --chunks ≥ 2 (virtual stages per rank)")
        if m % p:
            raise ConfigError(f"interleaved-1f1b needs --microbatches a multiple of --pp: {m} is not a multiple of {p}")


def build_schedule(name: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """The action list of every rank, ``[rank][i]``."""
    check_schedule(name, p, m, v)
    if name == "gpipe":
        return [gpipe(p, m, r) for r in range(p)]
    if name == "1f1b":
        return [one_f_one_b(p, m, r) for r in range(p)]
    if name == "interleaved-1f1b":
        return [interleaved(p, m, v, r) for r in range(p)]
    return zb_h1(p, m)


def gpipe(p: int, m: int, rank: int) -> list[Action]:
    return [Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]


def one_f_one_b(p: int, m: int, rank: int) -> list[Action]:
    warmup = min(p - rank - 1, m)
    acts = [Action("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        acts += [Action("F", warmup + i), Action("B", i)]
    return acts + [Action("B", i) for i in range(m - warmup, m)]


def interleaved(p: int, m: int, v: int, rank: int) -> list[Action]:
    """Megatron's interleaved order: the k-th forward is micro-batch
    ``(k // (p·v))·p + k % p`` on chunk ``(k // p) % v``; backwards walk the chunks in
    reverse. Warm-up ``2(p−r−1) + (v−1)·p`` forwards."""
    total = m * v

    def fwd(k: int) -> Action:
        return Action("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def bwd(k: int) -> Action:
        return Action("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    warmup = min(2 * (p - rank - 1) + (v - 1) * p, total)
    acts = [fwd(k) for k in range(warmup)]
    for i in range(total - warmup):
        acts += [fwd(warmup + i), bwd(i)]
    return acts + [bwd(k) for k in range(total - warmup, total)]


def zb_h1(p: int, m: int) -> list[list[Action]]:
    """Zero-bubble H1 (Qi et al. 2024, §3.1): the backward is split into I (input
    gradient, on the critical path) and W (weight gradient, free to move). Rank r warms up
    with p−r forwards, then repeats I(k), W(k−r), F; the deferred W's fill the time 1F1B
    spends waiting. Every rank holds at most p micro-batches' activations (1F1B's peak)."""
    return [_zb_h1_rank(p, m, r) for r in range(p)]


def _zb_h1_rank(p: int, m: int, r: int) -> list[Action]:
    warmup = min(p - r, m)
    acts = [Action("F", i) for i in range(warmup)]
    next_f, next_w = warmup, 0
    for k in range(m):
        acts.append(Action("I", k))
        if k >= r:
            acts.append(Action("W", next_w))
            next_w += 1
        if next_f < m:
            acts.append(Action("F", next_f))
            next_f += 1
    return acts + [Action("W", i) for i in range(next_w, m)]
