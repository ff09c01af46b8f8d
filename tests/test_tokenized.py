"""Tokenized datasets (``paracube data prepare`` / ``train --data DIR``): the shards hold
exactly the documents' token ids, each followed by end-of-text; the index is checked
against the files; a data-parallel run on them equals the serial run on the same tokens;
the model's vocabulary is checked against the tokenizer's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from paracube.data.tokenized import (
    check_tokenized,
    load_split,
    model_vocab,
    prepare,
    read_index,
)
from paracube.errors import DataError

DOCS = {
    "a.txt": "def add(a, b):\n    return a + b\n" * 40,
    "b.txt": "The quick brown fox jumps over the lazy dog. " * 60,
    "c.txt": "for i in range(10):\n    print(i * i)\n" * 50,
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("text")
    for name, text in DOCS.items():
        (src / name).write_text(text)
    out = tmp_path_factory.mktemp("tokens") / "ds"
    prepare(str(src), "bpe:300", str(out), val_fraction=0.1)
    return out


def test_the_shards_are_the_documents_tokens_each_ended_by_end_of_text(dataset):
    from tokenizers import Tokenizer

    index = read_index(str(dataset))
    assert index.dtype == "uint16" and index.vocab_size == 300
    ids = torch.cat([load_split(index, "train"), load_split(index, "val")]).long().tolist()
    assert len(ids) == sum(index.splits.values())
    assert index.splits["val"] == int(len(ids) * 0.1)
    tokenizer = Tokenizer.from_file(str(dataset / "tokenizer.json"))
    docs, current = [], []
    for i in ids:
        if i == index.eot_id:
            docs.append(tokenizer.decode(current))
            current = []
        else:
            current.append(i)
    assert current == [] and docs == [DOCS[k] for k in sorted(DOCS)]  # sorted path order


def test_uint32_ids_are_read_back(tmp_path):
    """A vocabulary beyond 65,536 ids is stored as uint32 and read back exactly."""
    ids = torch.tensor([70_000, 5, 69_999, 1] * 30, dtype=torch.int64)
    index = {"format": "paracube-tokens", "version": 1, "dtype": "uint32", "vocab_size": 70_001,
             "eot_id": 1, "splits": {"train": {"tokens": 100}, "val": {"tokens": 20}}}  # fmt: skip
    (tmp_path / "index.json").write_text(json.dumps(index))
    data = b"".join(int(v).to_bytes(4, "little") for v in ids.tolist())
    (tmp_path / "train.bin").write_bytes(data[: 100 * 4])
    (tmp_path / "val.bin").write_bytes(data[100 * 4 :])
    loaded = read_index(str(tmp_path))
    assert torch.equal(load_split(loaded, "train").long(), ids[:100])
    assert torch.equal(load_split(loaded, "val").long(), ids[100:])


def test_a_tokenizer_larger_than_the_model_is_refused(dataset):
    with pytest.raises(DataError, match=r"vocabulary \(300\) is larger than the model's \(256\)"):
        check_tokenized(str(dataset), 16, 256)
    assert check_tokenized(str(dataset), 16, model_vocab(300)).vocab_size == 300
    assert model_vocab(300) == 320


def test_prepare_never_overwrites(dataset):
    with pytest.raises(DataError, match="exists and is not empty"):
        prepare(None, "bpe:300", str(dataset))


def run_on_tokens(cfg, root: str):
    from paracube.data.corpus import build_corpus
    from paracube.engine import Trainer
    from paracube.mesh.mesh import ProcessMesh

    corpus = build_corpus(root, cfg.model.seq_len)
    trainer = Trainer(cfg, ProcessMesh(cfg.parallel), corpus)
    return [trainer.train_step().loss for _ in range(cfg.steps)]


def test_data_parallel_training_on_tokens_equals_the_serial_run(pools, dataset):
    """dp2 with accumulation on the prepared dataset: the serial run's losses on the same
    memory-mapped token windows."""
    from paracube.data.corpus import build_corpus
    from paracube.models.presets import preset
    from tests.helpers import SEQ, assert_losses_close, serial_reference, train_config

    model = preset("nano", seq_len=SEQ, vocab_size=model_vocab(300))
    cfg = train_config(dp=2, micro_batch=2, grad_accum=2, steps=4, model=model, data=str(dataset))
    want, _ = serial_reference(
        train_config(dp=1, micro_batch=8, steps=4, model=model), build_corpus(str(dataset), SEQ)
    )
    for losses in pools(2).run(run_on_tokens, cfg, str(dataset)):
        assert_losses_close(losses, want)
    assert want[0] == pytest.approx(torch.log(torch.tensor(320.0)).item(), rel=0.05)
