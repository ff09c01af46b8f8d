"""Your own model under paracube train: a factory returning a ModelSpec.

    paracube train --model examples.own_model:build --dp 2 --tp 2 --pp 2 --microbatches 4

(from the repository root, so that ``examples`` is importable). The model here is not a
transformer paracube knows: a causal language model whose blocks mix tokens with a
depthwise causal convolution and then apply an MLP. The spec tells the engines the three
things they need: the forward pass as a chain of modules (pipelines cut it), the repeated
blocks (ZeRO-3 gathers them one at a time, --recompute full recomputes them), and the
tensor-parallel plan by module name (the MLP column → row; embedding and head by
vocabulary). The factory is called once on the meta device by the command line (to read
the shape) and once per rank after ``torch.manual_seed(--seed)``, so every rank builds
the same values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from paracube.config import ModelConfig
from paracube.models.spec import ModelSpec
from paracube.tensor_parallel.plan import Colwise, Rowwise, VocabEmbedding

CONFIG = ModelConfig(
    n_layers=4, hidden=64, n_heads=4, vocab_size=256, seq_len=64, name="conv-lm", bias=True
)


class CausalMix(nn.Module):
    """Each position mixes itself and the ``width − 1`` tokens before it, per channel:
    (B, T, H) → (B, T, H), left-padded so no position sees the future."""

    def __init__(self, hidden: int, width: int = 4):
        super().__init__()
        self.width = width
        self.conv = nn.Conv1d(hidden, hidden, width, groups=hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.pad(x.transpose(1, 2), (self.width - 1, 0))  # (B, H, T + width − 1)
        return self.conv(h).transpose(1, 2)


class Block(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.mix_norm, self.mix = nn.LayerNorm(hidden), CausalMix(hidden)
        self.mlp_norm = nn.LayerNorm(hidden)
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) → (B, T, H)
        x = x + self.mix(self.mix_norm(x))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class ConvLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg.hidden) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) → (B, T, V)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build() -> ModelSpec:
    model = ConvLM(CONFIG)
    blocks = [f"blocks.{i}" for i in range(CONFIG.n_layers)]
    plan = {
        "embed": VocabEmbedding(),
        "blocks.*.up": Colwise(),  # (B, T, 4H/tp) on each rank
        "blocks.*.down": Rowwise(),  # all-reduced back to (B, T, H)
        "head": Colwise(vocab=True),  # vocabulary-parallel logits and loss
    }
    return ModelSpec.from_names(
        model, CONFIG, ["embed", *blocks, "norm", "head"], units=blocks, tp_plan=plan
    )
