"""Cross-entropy over vocabulary-parallel logits, never gathering the full (B, T, V).

Each rank holds logits (B, T, V/tp) for its slice of the vocabulary. Three all-reduces of
(B, T) values give the exact loss (Shoeybi et al. 2019; Megatron's
``vocab_parallel_cross_entropy``): the row maximum (for a stable log-sum-exp), the target
logit (found on exactly one rank), and the sum of exponentials. The backward needs no
communication: softmax − one-hot, restricted to this rank's columns.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paracube.comm import ops
from paracube.models.gpt import at_least_fp32


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, group, ledger, vocab_size):
        logits = at_least_fp32(logits)  # (B, T, V_padded/tp)
        vocab_local = logits.shape[-1]
        start = dist.get_rank(group) * vocab_local
        if vocab_size is not None and start + vocab_local > vocab_size:  # padded columns: not words
            padding = torch.arange(start, start + vocab_local, device=logits.device) >= vocab_size
            logits = logits.masked_fill(padding, float("-inf"))
        row_max = logits.max(dim=-1).values  # (B, T)
        ops.all_reduce(row_max, group, ledger, tag="tp_loss", op=dist.ReduceOp.MAX)
        shifted = logits - row_max.unsqueeze(-1)
        local = targets - start
        outside = (local < 0) | (local >= vocab_local)
        local = local.masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        both = torch.stack([target_logit, sum_exp])  # one all-reduce for the two sums
        ops.all_reduce(both, group, ledger, tag="tp_loss")
        target_logit, sum_exp = both[0], both[1]
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), local, outside)
        return sum_exp.log() - target_logit  # (B, T)

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local, outside = ctx.saved_tensors
        grad = softmax.clone()
        hit = (~outside).to(grad.dtype).unsqueeze(-1)
        grad.scatter_add_(-1, local.unsqueeze(-1), -hit)
        return grad * grad_loss.unsqueeze(-1), None, None, None, None


def vocab_parallel_cross_entropy(
    logits, targets, group, ledger=None, reduction: str = "mean", vocab_size: int | None = None
) -> torch.Tensor:
    """Cross-entropy of vocabulary-sharded ``logits`` (B, T, V/tp) against ``targets`` (B, T).
    ``vocab_size``: the true vocabulary when the shards are padded (columns ≥ it are masked)."""
    if ops.group_size(group) == 1:
        from paracube.models.gpt import lm_loss

        return lm_loss(logits, targets, reduction)
    losses = _VocabParallelCrossEntropy.apply(logits, targets, group, ledger, vocab_size)
    if reduction == "sum":
        return losses.sum()
    if reduction == "none":
        return losses
    return losses.mean()
