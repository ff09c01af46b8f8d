"""The training objective — one owner for how a loss is normalised and which gradient
sums must precede the data-parallel reduction.

Every runner (local micro-steps, a pipeline's last stage) computes :meth:`Objective.loss_sum`
— the next-token loss *summed* over its tokens — and backpropagates it times
:meth:`Objective.backward_weight` = loss scale / tokens of the *global* batch. The
data-parallel reduction is then a plain sum and the gradient is exactly the serial one,
whatever the split into ranks and micro-batches; the runners report raw sums, and the
mean is taken once (:meth:`Objective.mean`), in training and evaluation alike.
"""

from __future__ import annotations

import torch
from torch import nn

from paracube.comm import ops
from paracube.config import TrainConfig
from paracube.mesh.mesh import ProcessMesh
from paracube.precision import LossScaler
from paracube.tensor_parallel import vocab_parallel_cross_entropy


class Objective:
    """Loss, its normalisation and the pre-reduction gradient sums of one job."""

    def __init__(self, cfg: TrainConfig, mesh: ProcessMesh, scaler: LossScaler | None = None):
        self.tokens_global = cfg.global_batch * cfg.model.seq_len
        self.vocab_size = cfg.model.vocab_size
        self.tp_group, self.ledger = mesh.group("tp"), mesh.ledger
        self.scaler = scaler
        self.tied: nn.Parameter | None = None  # an embedding/head weight split across stages
        self.tied_group = None

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    def loss_sum(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Summed next-token loss of logits (b, T, V or V/tp) against targets (b, T);
        vocabulary-parallel when the head is sharded."""
        return vocab_parallel_cross_entropy(
            logits, targets, self.tp_group, self.ledger, reduction="sum", vocab_size=self.vocab_size
        )

    def backward_weight(self) -> float:
        """What a raw loss sum is multiplied by before backward."""
        return self.loss_scale / self.tokens_global

    def mean(self, total: float, global_batches: int = 1) -> float:
        """The mean token loss of ``global_batches`` global batches whose summed loss is ``total``."""
        return total / (global_batches * self.tokens_global)

    def tie(self, param: nn.Parameter | None, group) -> None:
        """``param`` (the tied embedding/head weight on this stage) has a twin on the
        other end of the pipeline; their gradients are summed over ``group``."""
        self.tied, self.tied_group = param, group

    @torch.no_grad()
    def pre_reduce(self, params: list[nn.Parameter], grads: list[torch.Tensor]) -> None:
        """Sums that must precede the data-parallel reduction of a unit: the partial
        gradients of sequence-parallel norms over tp (each rank saw T/tp tokens —
        Korthikanti et al. 2022, §4.2.2), and a tied embedding/head weight's two halves
        over the first and last stage (Narayanan et al. 2021)."""
        sp = [g for p, g in zip(params, grads) if getattr(p, "sequence_parallel", False)]
        ops.all_reduce_coalesced(sp, self.tp_group, self.ledger, tag="sp_grad")
        if self.tied is not None:
            for p, g in zip(params, grads):
                if p is self.tied:
                    ops.all_reduce(g, self.tied_group, self.ledger, tag="tied_grad")
