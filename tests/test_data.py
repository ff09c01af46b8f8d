"""Embedded corpus, user data, and the data-parallel sharded sampler."""

from __future__ import annotations

import pytest
import torch

from paracube.data.corpus import build_corpus, stdlib_files, stdlib_text
from paracube.data.sampler import ShardedBatchSampler
from paracube.errors import DataError


def test_default_corpus_is_deterministic_and_split():
    a = build_corpus(None, seq_len=128, max_bytes=1 << 20)
    b = build_corpus(None, seq_len=128, max_bytes=1 << 20)
    assert torch.equal(a.train, b.train) and torch.equal(a.val, b.val)
    assert a.train.numel() + a.val.numel() == 1 << 20
    assert a.val.numel() == int((1 << 20) * 0.05)
    files = stdlib_files()
    assert files == sorted(files) and len(files) > 100
    assert b"def " in stdlib_text(1 << 16)  # it is Python source


def test_user_file_and_folder(tmp_path):
    (tmp_path / "b.txt").write_text("world " * 200)
    (tmp_path / "a.txt").write_text("hello " * 200)
    (tmp_path / "blob.bin").write_bytes(b"\0\1\2" * 100)  # skipped inside a folder
    corpus = build_corpus(str(tmp_path), seq_len=16, val_fraction=0.1)
    text = bytes(torch.cat([corpus.train, corpus.val]).tolist())
    assert text == b"hello " * 200 + b"world " * 200  # sorted path order, binary skipped
    single = build_corpus(str(tmp_path / "a.txt"), seq_len=16)
    assert single.train.numel() + single.val.numel() == 1200


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda p: p / "missing.txt", "no such file or folder"),
        (
            lambda p: (p / "empty.txt").write_text("") and None or p / "empty.txt",
            r"no text in it \(empty\)",
        ),
        (lambda p: (p / "d").mkdir() or p / "d", "the folder holds no files"),
        (lambda p: (p / "x.bin").write_bytes(b"\0" * 500) and None or p / "x.bin", "looks binary"),
        (
            lambda p: (p / "short.txt").write_text("abc") and None or p / "short.txt",
            "too short for sequence length",
        ),
    ],
    ids=["missing", "empty", "empty-folder", "binary", "too-short"],
)
def test_bad_data_is_refused(tmp_path, make, match):
    with pytest.raises(DataError, match=match):
        build_corpus(str(make(tmp_path)), seq_len=16)


def test_shards_partition_the_global_batch():
    tokens = torch.arange(10_000, dtype=torch.int32) % 251
    dp, accum, b, T = 4, 3, 2, 16
    sampler = ShardedBatchSampler(tokens.to(torch.uint8), T, dp * accum * b, seed=5)
    for step in range(3):
        gx, gy = sampler.global_batch_at(step)
        shards = [
            sampler.micro_batch(step, dp_rank=r, dp_size=dp, micro_step=k, accum=accum)
            for r in range(dp)
            for k in range(accum)
        ]
        assert torch.equal(torch.cat([x for x, _ in shards]), gx)
        assert torch.equal(torch.cat([y for _, y in shards]), gy)
        assert torch.equal(gx[:, 1:], gy[:, :-1])  # targets are inputs shifted by one
    assert not torch.equal(sampler.global_batch_at(0)[0], sampler.global_batch_at(1)[0])
