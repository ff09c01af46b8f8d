"""``paracube plan``'s training budget — ``--epochs`` (with ``--train-samples``, or a
model's own dataset) or ``--train-tokens`` — and the time to train it, as the plan prints
and as ``--json`` carries it."""

from __future__ import annotations

from paracube.config import ModelConfig
from paracube.errors import ParacubeError


def count_text(value: float) -> str:
    """A count as the user wrote it: 1000000 (not 1e+06); 2.5."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:g}"


# --train-tokens' suffixes: thousands to trillions of tokens (B, as budgets are written)
TOKEN_SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def tokens_text(count: float) -> str:
    """A token count as budgets are written: 15T, 300B, 2.5M; below a thousand, plain."""
    for suffix in "TBMK":
        scale = TOKEN_SUFFIXES[suffix]
        if count >= scale:
            return f"{count / scale:,.4g}{suffix}"
    return f"{count:,.0f}"


def token_count(text: str) -> float:
    """``--train-tokens``: a positive count, plain (2e12) or with a suffix (300B, 15T)."""
    import argparse

    scale = TOKEN_SUFFIXES.get(text[-1:].upper(), 1.0)
    digits = text[:-1] if scale != 1.0 else text
    try:
        value = float(digits) * scale
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"must be a positive token count such as 2e12, 300B or 15T, got {text!r}"
        )
    return value


def epoch_samples(args, cfg) -> float | None:
    """Samples in one epoch for --epochs (--train-samples, or the model's own dataset:
    resnet50's ImageNet-1k), checked before any search; None without --epochs."""
    if args.epochs is None:
        return None
    per_epoch = args.train_samples or getattr(cfg, "dataset_samples", 0)
    if not per_epoch:
        raise ParacubeError(
            f"--epochs {args.epochs:g}: needs --train-samples N (samples per epoch); "
            "resnet50 knows ImageNet-1k's"
        )
    return per_epoch


def training_tokens(args, cfg) -> float | None:
    """The training budget in tokens (a model without tokens: samples) — --epochs ×
    samples per epoch × tokens per sample, or --train-tokens — checked before any search;
    None without either."""
    if args.train_tokens is not None:
        if not isinstance(cfg, ModelConfig):
            raise ParacubeError(
                f"--train-tokens {tokens_text(args.train_tokens)}: {cfg.name} takes "
                "samples, not tokens; give its budget in --epochs"
            )
        return args.train_tokens
    per_epoch = epoch_samples(args, cfg)
    if per_epoch is None:
        return None
    return args.epochs * per_epoch * (cfg.seq_len if isinstance(cfg, ModelConfig) else 1)


def budget_text(args, cfg) -> str:
    """The training budget in words, as the time-to-train line opens."""
    if args.train_tokens is not None:
        return f"Time to train {tokens_text(args.train_tokens)} tokens"
    per_epoch = epoch_samples(args, cfg)
    return (
        f"Time to train {args.epochs:g} epoch{'' if args.epochs == 1 else 's'} of "
        f"{per_epoch:,.0f} samples"
    )


def duration(tokens: float, tokens_per_s: float) -> str:
    """Wall time to see ``tokens`` at ``tokens_per_s``: hours, and days past two."""
    hours = tokens / tokens_per_s / 3600
    return f"{hours:,.2f} h" + (f" ({hours / 24:,.1f} days)" if hours >= 48 else "")


def training_seconds(args, cfg, result, baseline) -> dict | None:
    """The training budget's time for --json: tokens, and seconds on the best layout and on
    the baseline (None where there is none); None without a budget."""
    tokens = training_tokens(args, cfg)
    if tokens is None or not result.ranked:
        return None
    return {
        "tokens": tokens,
        "seconds": tokens / result.ranked[0].time.tokens_per_s,
        "baseline_seconds": None if baseline is None else tokens / baseline.best.time.tokens_per_s,
    }


def time_to_train(args, cfg, best, baseline) -> str:
    """--epochs or --train-tokens: the time to train on the best layout and on the baseline
    (one GPU or node)."""
    from paracube.planner.report import describe

    tokens = training_tokens(args, cfg)
    assert tokens is not None  # called under a training budget
    line = (
        f"{budget_text(args, cfg)}: {duration(tokens, best.time.tokens_per_s)} "
        f"on {best.layout.gpus} GPUs ({describe(best.layout)})"
    )
    if baseline is not None and baseline.gpus < best.layout.gpus:
        line += (
            f", against {duration(tokens, baseline.best.time.tokens_per_s)} on {baseline.gpus} "
            f"GPU{'s' if baseline.gpus > 1 else ''} ({baseline.speedup(best):.2f}× faster)"
        )
    return line + "."
