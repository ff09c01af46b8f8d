"""``paracube data prepare``: text into a tokenized dataset that ``train --data DIR`` streams."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "data",
        help="prepare tokenized datasets (Hugging Face tokenizers; nothing is downloaded)",
        description="Tokenized datasets for `paracube train --data DIR`.",
    )
    commands = p.add_subparsers(dest="data_command", required=True)
    prep = commands.add_parser(
        "prepare",
        help="tokenize text files into memory-mappable token shards with a JSON index",
        description="Tokenize a text file or folder (default: the embedded stdlib corpus), one "
        "document per file, each ended by the end-of-text token; the last --val-fraction of "
        "the tokens is the validation split.",
    )
    prep.add_argument(
        "input",
        nargs="?",
        default=None,
        help="a text file or folder (default: the embedded corpus)",
    )
    prep.add_argument(
        "--tokenizer",
        required=True,
        help="a local tokenizer.json (or a folder holding one), or bpe:VOCAB to train a "
        "byte-level BPE of VOCAB ids on the input now",
    )
    prep.add_argument("--out", required=True, help="the dataset folder to create (new or empty)")
    prep.add_argument("--val-fraction", type=float, default=0.05)
    prep.set_defaults(func=cmd_prepare)


def cmd_prepare(args) -> int:
    from paracube.data.tokenized import prepare

    stats = prepare(args.input, args.tokenizer, args.out, args.val_fraction)
    tokens = sum(s["tokens"] for s in stats["splits"].values())
    print(
        f"paracube: {stats['source']}: {stats['documents']:,} documents, "
        f"{stats['text_bytes'] / 1e6:,.1f} MB of text → {tokens:,} tokens "
        f"({stats['text_bytes'] / max(tokens, 1):.2f} bytes/token, vocabulary {stats['vocab_size']:,}, "
        f"{stats['dtype']}) in {args.out}; {stats['seconds']:.1f} s "
        f"({tokens / stats['seconds']:,.0f} tokens/s; encoding alone {stats['encode_seconds']:.1f} s)"
    )
    return 0
