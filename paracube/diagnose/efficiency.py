"""How much of a step's compute a larger micro-batch would save, measured here: the
serial model's forward + backward timed at the run's micro-batch ``b`` and at ``8b``;
the saved share is ``1 − (t(8b) / 8b) / (t(b) / b)`` (per-token time, large vs small).

Measured on this machine with the run's threads per rank — run ``diagnose`` where the run
ran. Under tensor parallelism each rank computes a slice of every layer; the serial
model's curve is an approximation of the slice's.
"""

from __future__ import annotations

import time

LARGER = 8  # the larger micro-batch, as a multiple of the run's
REPEATS = 3


def small_batch_fraction(model: dict, micro_batch: int, seq_len: int, threads: int) -> float:
    """The share of forward + backward time a micro-batch ``8×`` larger saves per token."""
    import torch

    from paracube.config import ModelConfig
    from paracube.models.gpt import GPT, lm_loss

    torch.set_num_threads(max(1, threads))
    cfg = ModelConfig(**{k: v for k, v in model.items() if k in ModelConfig.__dataclass_fields__})
    net = GPT(cfg)

    def per_token(batch: int) -> float:
        tokens = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1))
        best = float("inf")
        for _ in range(REPEATS + 1):  # the first is warm-up
            start = time.perf_counter()
            lm_loss(net(tokens[:, :-1]), tokens[:, 1:]).backward()
            best = min(best, time.perf_counter() - start)
        net.zero_grad(set_to_none=True)
        return best / (batch * seq_len)

    small, large = per_token(micro_batch), per_token(micro_batch * LARGER)
    return max(0.0, 1.0 - large / small)
