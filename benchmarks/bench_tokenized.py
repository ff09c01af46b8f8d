"""Tokenized data at scale: prepare speed, and what streaming it costs a training step.

1. Text: ``--copies`` copies of the embedded corpus (the stdlib sources, ~11 MB each) as
   separate documents in a scratch folder — ≥ 100 MB of token shards at the default.
2. ``paracube data prepare`` with a byte-level BPE of ``--vocab`` ids trained on one copy
   (the tokenizer is shared); its tokens per second beside the tokenizer's own
   ``encode_batch`` over the same documents (no writing), in the same process.
3. ``paracube train --model small --data DIR`` (2 ranks × 1 thread, 8 sequences per rank,
   ``--steps`` steps): the data phase's share of each step (its metrics' ``time.data``
   over ``step_time``, the median over the steps after the first).

    python benchmarks/bench_tokenized.py --out benchmarks/results/tokenized.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_json
from paracube.data.source import stdlib_files
from paracube.data.tokenized import load_tokenizer, prepare


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--copies", type=int, default=16)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", default="benchmarks/results/tokenized.json")
    args = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="paracube-tokens-"))
    try:
        text = scratch / "text"
        text.mkdir()
        corpus = b"".join(f.read_bytes() for f in stdlib_files())
        for i in range(args.copies):
            (text / f"copy{i:03d}.py").write_bytes(corpus)
        tokenizer_dir = scratch / "tokenizer"
        tokenizer_dir.mkdir()
        load_tokenizer(f"bpe:{args.vocab}", [text / "copy000.py"]).save(
            str(tokenizer_dir / "tokenizer.json")
        )
        data = scratch / "tokens"
        stats = prepare(str(text), str(tokenizer_dir), str(data))
        tokens = sum(s["tokens"] for s in stats["splits"].values())
        shard_bytes = sum(f.stat().st_size for f in data.glob("*.bin"))
        tokenizer = load_tokenizer(str(tokenizer_dir), [])
        docs = [f.read_text() for f in sorted(text.iterdir())]
        start = time.perf_counter()
        native = sum(len(e.ids) for e in tokenizer.encode_batch(docs, add_special_tokens=False))
        native_s = time.perf_counter() - start
        del docs
        metrics = scratch / "metrics.jsonl"
        subprocess.run(
            ["paracube", "train", "--model", "small", "--data", str(data), "--dp", "2",
             "--micro-batch", "8", "--steps", str(args.steps), "--metrics", str(metrics),
             "--no-progress"],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        steps = [json.loads(line) for line in metrics.read_text().splitlines()][1:]
        share = statistics.median(s["time"]["data"] / s["step_time"] for s in steps)
        step_ms = 1000 * statistics.median(s["step_time"] for s in steps)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = {
        "benchmark": "tokenized",
        "text_mb": stats["text_bytes"] / 1e6,
        "tokens": tokens,
        "shard_mb": shard_bytes / 1e6,
        "vocab": stats["vocab_size"],
        "prepare_s": stats["seconds"],
        "prepare_tokens_per_s": tokens / stats["seconds"],
        "encode_batch_tokens_per_s": native / native_s,
        "train_step_ms": step_ms,
        "data_share_percent": 100 * share,
    }
    write_json(args.out, result)
    print(
        f"{result['text_mb']:.0f} MB of text → {tokens:,} tokens ({result['shard_mb']:.0f} MB of "
        f"shards, vocabulary {result['vocab']:,})\n"
        f"prepare: {result['prepare_s']:.0f} s, {result['prepare_tokens_per_s']:,.0f} tokens/s; "
        f"the tokenizer's encode_batch alone: {result['encode_batch_tokens_per_s']:,.0f} tokens/s "
        f"(prepare ÷ encode_batch {result['prepare_tokens_per_s'] / result['encode_batch_tokens_per_s']:.2f})\n"
        f"train small on it: {step_ms:.0f} ms/step, data {result['data_share_percent']:.2f} % of the step"
    )


if __name__ == "__main__":
    main()
