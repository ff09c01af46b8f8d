"""Tokenized datasets: ``paracube data prepare`` writes them, ``paracube train --data DIR``
streams them.

A dataset is a folder::

    index.json       {"format": "paracube-tokens", "version": 1, "dtype": "uint16",
                      "vocab_size": V, "eot_id": E, "tokenizer": "tokenizer.json",
                      "splits": {"train": {"file": "train.bin", "tokens": N, ...}, "val": ...}}
    train.bin        N little-endian uint16 (uint32 when V > 65,536) token ids
    val.bin          the validation split, the same way
    tokenizer.json   the Hugging Face ``tokenizers`` tokenizer that made them

Documents (one per input file) are encoded with Hugging Face ``tokenizers`` — a local
``tokenizer.json``, or a byte-level BPE trained on the spot on the input (``bpe:VOCAB``) so
that nothing is downloaded — and written end to end, each followed by the end-of-text
token; training windows are drawn across those boundaries (packed sequences, as GPT-2/3
pre-training does). Each split is one memory-mapped file: any size, its pages shared by
the ranks of a machine through the page cache, read only where a window falls. The
sampler draws the windows of step t from (seed, t) alone, so a resumed run reads exactly
the windows the uninterrupted one would have.

Reading the index is torch-free (the launcher checks a dataset before starting ranks).
"""

from __future__ import annotations

import json
import os
import time
from array import array
from dataclasses import dataclass
from pathlib import Path

from paracube.errors import DataError

INDEX = "index.json"
FORMAT = "paracube-tokens"
EOT = "<|endoftext|>"  # GPT-2's end-of-text token; added to a tokenizer that has none
_EOT_NAMES = (EOT, "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
ITEM_BYTES = {"uint16": 2, "uint32": 4}


@dataclass(frozen=True)
class TokenIndex:
    """A tokenized dataset's index, checked against its files."""

    root: Path
    vocab_size: int
    dtype: str  # "uint16" or "uint32"
    eot_id: int
    splits: dict[str, int]  # split → tokens
    tokenizer: str | None

    def path(self, split: str) -> Path:
        return self.root / f"{split}.bin"


def is_tokenized(path: str | None) -> bool:
    """``path`` is a folder holding a dataset index (else: text, read as bytes)."""
    return path is not None and (Path(path) / INDEX).is_file()


def read_index(path: str) -> TokenIndex:
    """The index of the dataset at ``path``; a missing, corrupt or inconsistent one is one
    :class:`DataError` line naming what is wrong."""
    root = Path(path)
    where = root / INDEX
    try:
        raw = json.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(
            f"--data {path}: no {INDEX}: not a tokenized dataset; make one with `paracube data prepare`"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(
            f"--data {path}: {INDEX} is unreadable or corrupt ({e}); prepare the dataset again"
        ) from None
    try:
        if raw["format"] != FORMAT:
            raise ValueError(f"format {raw['format']!r}, not {FORMAT!r}")
        dtype, vocab, eot = raw["dtype"], int(raw["vocab_size"]), int(raw["eot_id"])
        if dtype not in ITEM_BYTES:
            raise ValueError(f"dtype {dtype!r} (uint16 or uint32)")
        if not 0 <= eot < vocab:
            raise ValueError(f"eot_id {eot} outside the vocabulary of {vocab}")
        splits = {name: int(s["tokens"]) for name, s in raw["splits"].items()}
        if set(splits) != {"train", "val"}:
            raise ValueError(f"splits {sorted(splits)} (train and val)")
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(
            f"--data {path}: {INDEX} is not a valid index ({e}); prepare the dataset again"
        ) from None
    index = TokenIndex(root, vocab, dtype, eot, splits, raw.get("tokenizer"))
    for split, tokens in splits.items():
        file = index.path(split)
        want = tokens * ITEM_BYTES[dtype]
        size = file.stat().st_size if file.is_file() else None
        if size != want:
            found = "missing" if size is None else f"{size:,} bytes"
            raise DataError(
                f"--data {path}: {file.name} is {found}, the index says {tokens:,} {dtype} tokens "
                f"({want:,} bytes): the dataset is incomplete or corrupt; prepare it again"
            )
    return index


def check_tokenized(path: str, seq_len: int, vocab_size: int | None) -> TokenIndex:
    """A dataset a model of ``vocab_size`` (None: taken from the data) can train on with
    windows of ``seq_len + 1`` tokens in each split."""
    index = read_index(path)
    for split, tokens in index.splits.items():
        if tokens < seq_len + 1:
            raise DataError(
                f"--data {path}: the {split} split holds {tokens:,} tokens, fewer than one window "
                f"of seq_len + 1 = {seq_len + 1}; prepare more text or use a shorter --seq-len"
            )
    if vocab_size is not None and index.vocab_size > vocab_size:
        raise DataError(
            f"--data {path}: its tokenizer's vocabulary ({index.vocab_size:,}) is larger than "
            f"the model's ({vocab_size:,}): token ids would fall outside the embedding; use a "
            "model with a vocabulary at least that large, or a smaller tokenizer"
        )
    return index


def model_vocab(index_vocab: int, multiple: int = 64) -> int:
    """The embedding size a preset model takes for a dataset: its vocabulary rounded up
    to a multiple of 64 (divisible by every tensor-parallel degree up to 64, and
    kernel-friendly, as Megatron pads the vocabulary)."""
    return -(-index_vocab // multiple) * multiple


def load_split(index: TokenIndex, split: str):
    """The split's token ids as a 1-D memory-mapped tensor (uint16 or uint32)."""
    import torch

    dtype = torch.uint16 if index.dtype == "uint16" else torch.uint32
    return torch.from_file(
        str(index.path(split)), shared=False, size=index.splits[split], dtype=dtype
    )


# -- prepare -----------------------------------------------------------------------------------


def load_tokenizer(spec: str, files: list[Path]):
    """A local ``tokenizer.json`` (or a folder holding one), or ``bpe:VOCAB``: a byte-level
    BPE of VOCAB ids trained on ``files`` now (GPT-2's scheme, Radford et al. 2019)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if spec.startswith("bpe:"):
        text = spec[4:]
        if not text.isdigit() or not 257 <= int(text) <= 1 << 20:
            raise DataError(
                f"--tokenizer {spec}: VOCAB must be an integer in [257, 1048576] (256 bytes + "
                "merges + end-of-text), e.g. bpe:8192"
            )
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=int(text),
            special_tokens=[EOT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train([str(f) for f in files], trainer)
        return tokenizer
    path = Path(spec)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise DataError(
            f"--tokenizer {spec}: no such tokenizer.json (nothing is downloaded); give a local "
            "tokenizer.json or a folder holding one, or bpe:VOCAB to train one on the input"
        )
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 — the tokenizers library raises a bare Exception
        raise DataError(f"--tokenizer {spec}: not a tokenizers file ({e})") from None


def end_of_text(tokenizer) -> int:
    """The tokenizer's end-of-text id (added as a special token if it has none)."""
    for name in _EOT_NAMES:
        found = tokenizer.token_to_id(name)
        if found is not None:
            return found
    tokenizer.add_special_tokens([EOT])
    return tokenizer.token_to_id(EOT)


def prepare(source: str | None, tokenizer_spec: str, out: str, val_fraction: float = 0.05) -> dict:
    """Tokenize ``source`` (a text file or folder; None: the embedded stdlib corpus) into
    the dataset folder ``out``, which must not exist or be empty. Returns its statistics."""
    from paracube.data.source import stdlib_files, text_files

    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise DataError(
            f"--out {out} exists and is not empty: choose a new folder (nothing is overwritten)"
        )
    if not 0 < val_fraction < 1:
        raise DataError(f"--val-fraction {val_fraction}: must be in (0, 1), e.g. 0.05")
    files = stdlib_files() if source is None else text_files(source)
    start = time.perf_counter()
    tokenizer = load_tokenizer(tokenizer_spec, files)
    eot = end_of_text(tokenizer)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = "uint16" if vocab <= 1 << 16 else "uint32"
    trained = time.perf_counter() - start
    target.mkdir(parents=True, exist_ok=True)
    whole = target / "all.bin.partial"
    tokens = text_bytes = 0
    encode_seconds = 0.0
    with whole.open("wb") as f:
        for batch in _batches(files):
            texts = [t for t in batch if t]
            t0 = time.perf_counter()
            # ids only: encode_batch_fast skips the offsets encode_batch also computes
            encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
            encode_seconds += time.perf_counter() - t0
            for text, enc in zip(texts, encodings):
                ids = array("I" if dtype == "uint32" else "H", enc.ids)
                ids.append(eot)
                ids.tofile(f)
                tokens += len(ids)
                text_bytes += len(text.encode("utf-8", errors="replace"))
    n_val = int(tokens * val_fraction)
    item = ITEM_BYTES[dtype]
    _split_tail(whole, target / "train.bin", target / "val.bin", (tokens - n_val) * item)
    tokenizer.save(str(target / "tokenizer.json"))
    seconds = time.perf_counter() - start
    index = {
        "format": FORMAT,
        "version": 1,
        "dtype": dtype,
        "vocab_size": vocab,
        "eot_id": eot,
        "tokenizer": "tokenizer.json",
        "source": "stdlib sources" if source is None else str(source),
        "documents": len(files),
        "splits": {"train": {"tokens": tokens - n_val}, "val": {"tokens": n_val}},
    }
    partial = target / (INDEX + ".partial")
    partial.write_text(json.dumps(index, indent=2) + "\n")
    os.replace(partial, target / INDEX)  # the index last: a dataset without one is incomplete
    return {
        **index,
        "text_bytes": text_bytes,
        "seconds": seconds,
        "tokenizer_seconds": trained,
        "encode_seconds": encode_seconds,
    }


def _batches(files: list[Path], budget: int = 8 << 20):
    """Documents (files, as text) in batches of about ``budget`` bytes, for encode_batch."""
    batch: list[str] = []
    size = 0
    for f in files:
        text = f.read_bytes().decode("utf-8", errors="replace")
        batch.append(text)
        size += len(text)
        if size >= budget:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _split_tail(whole: Path, train: Path, val: Path, cut: int) -> None:
    """``whole``[:cut] becomes ``train`` and the rest ``val`` (the tail copied, the file
    truncated and renamed: no second copy of the training split)."""
    with whole.open("r+b") as f:
        f.seek(cut)
        with val.open("wb") as v:
            while chunk := f.read(16 << 20):
                v.write(chunk)
        f.truncate(cut)
    os.replace(whole, train)
