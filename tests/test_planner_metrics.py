"""Metrics a trainer computes over the logits beside the loss (``Layout.logit_metrics``,
``planner.time_model.logit_metric_bytes``): Composer updates its model's training metrics
after every micro-batch — for llm-foundry's MPT a LanguageCrossEntropy and a
LanguagePerplexity, each a ``torch.nn.CrossEntropyLoss`` over the whole logits. Their bytes
are counted here from torch's own kernels on this machine's CPU: every op the cross-entropy
dispatches is intercepted, and the logits-sized tensors it reads and writes are summed."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from paracube.config import ModelConfig
from paracube.errors import ConfigError
from paracube.planner import hardware as hw
from paracube.planner.layout import Layout
from paracube.planner.stacks import STACK_SOFTWARE, stack
from paracube.planner.time_model import head_time, logit_metric_bytes

ROWS, VOCAB = 8, 4096  # (b·s, V): the logits of a micro-batch


class CountBytes(TorchDispatchMode):
    """Each dispatched op's name and the bytes it moves of (ROWS, VOCAB)-shaped tensors:
    those among its arguments (read) and those it returns (written)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        read = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        written = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        moved = sum(t.element_size() for t in read + written if t.shape == (ROWS, VOCAB))
        self.ops.append((func.__name__, moved))
        return out


def metric_ops(logits: torch.Tensor, autocast: bool) -> list[tuple[str, int]]:
    """The ops of one LanguageCrossEntropy update (composer/metrics/nlp.py: a sum-reduced
    torch.nn.CrossEntropyLoss over the flattened logits), under the trainer's precision
    context, in no_grad as Composer's _eval_train_metrics runs it."""
    target = torch.randint(0, VOCAB, (ROWS,), generator=torch.Generator().manual_seed(0))
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100, reduction="sum")
    with (
        torch.no_grad(),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
        CountBytes() as mode,
    ):
        loss_fn(logits, target)
    return mode.ops


def test_a_metric_over_bf16_logits_is_a_cast_and_an_fp32_log_softmax():
    """Under bf16 autocast torch casts the logits to fp32 (2 bytes read, 4 written), runs the
    log-softmax in fp32 (4 + 4) and the loss, which reads the target's log-probability of
    each row only (ROWS values, not the (ROWS, VOCAB) tensor it is handed): 14 bytes a logit,
    the planner's logit_metric_bytes(2)."""
    logits = torch.randn(ROWS, VOCAB, generator=torch.Generator().manual_seed(1)).bfloat16()
    ops = metric_ops(logits, autocast=True)
    assert [name for name, _ in ops] == [
        "_to_copy.default",
        "_log_softmax.default",
        "nll_loss_forward.default",
    ]
    passes = sum(moved for name, moved in ops if not name.startswith("nll_loss"))
    assert passes == logit_metric_bytes(2) == 14


def test_a_metric_over_fp32_logits_is_the_log_softmax_alone():
    logits = torch.randn(ROWS, VOCAB, generator=torch.Generator().manual_seed(1))
    ops = metric_ops(logits, autocast=False)
    assert [name for name, _ in ops] == ["_log_softmax.default", "nll_loss_forward.default"]
    assert ops[0][1] == logit_metric_bytes(4) == 8


def test_composer_computes_two_metrics_and_no_other_stack_any():
    """Composer's stack states llm-foundry's two training metrics; the other stacks log the
    loss they computed (FlashAttention's GPT hands its loss to its perplexity metric "to
    avoid recomputation"), as paracube train does — the Layout's default, 0."""
    assert stack("composer")["logit_metrics"] == 2
    assert [n for n in STACK_SOFTWARE if "logit_metrics" in stack(n)] == ["composer"]
    assert Layout().logit_metrics == 0


def test_metrics_are_their_bytes_at_the_hbm_rate_per_micro_batch():
    """Each metric adds its bytes per logit of the micro-batch's (b·s, V/t) logits at the
    GPU's streaming rate to the head's time — nothing else moves."""
    cfg = ModelConfig(n_layers=24, hidden=1024, n_heads=16, vocab_size=50368, seq_len=512)
    h100 = hw.gpu("h100")
    plain = Layout(micro_batch=56)
    for metrics, elem in ((1, 2), (2, 2), (2, 4)):
        added = head_time(cfg, replace(plain, logit_metrics=metrics), h100, elem) - head_time(
            cfg, plain, h100, elem
        )
        logits = 56 * 512 * 50368
        assert added == pytest.approx(
            metrics * logits * logit_metric_bytes(elem) / h100.memory_rate
        )


def test_a_negative_count_is_refused_and_paracube_train_runs_none():
    with pytest.raises(ConfigError, match="logit_metrics=-1: a count of cross-entropy metrics"):
        Layout(logit_metrics=-1)
    with pytest.raises(ConfigError, match="logit_metrics=2: another stack's software"):
        Layout(logit_metrics=2).check_paracube_software()


def test_plan_states_the_metrics_it_charges(capsys):
    """``paracube plan --stack composer --explain`` says the trainer's two metrics are in the
    step; paracube's own stack charges none and says nothing of them."""
    from paracube.cli import main

    argv = ["plan", "--model", "gpt3-350m", "--gpus", "8", "--global-batch", "256",
            "--gpu", "h100", "--explain"]  # fmt: skip
    main([*argv, "--stack", "composer"])
    assert "The trainer's 2 metrics over each micro-batch's logits" in capsys.readouterr().out
    main(argv)
    assert "metrics over each micro-batch's logits" not in capsys.readouterr().out
