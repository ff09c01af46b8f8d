"""``paracube import``: a Hugging Face checkpoint as paracube's GPT weights, for
``paracube train --init-from`` (:mod:`paracube.models.hf_convert`)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "import",
        help="write a Hugging Face checkpoint (Llama, Mistral, Qwen3, GPT-2) as paracube GPT "
        "weights, for train --init-from",
        description="Convert a local Hugging Face model (config.json; model.safetensors or its shards) into "
        "one safetensors file of paracube's GPT: train it with paracube train --init-from FILE "
        "under any layout (the model's shape comes from the file).",
    )
    p.add_argument("model", help="hf:DIR, a local Hugging Face model directory")
    p.add_argument("--out", required=True, help="the new .safetensors file to write")
    p.set_defaults(func=cmd_import)


def cmd_import(args) -> int:
    from paracube.errors import ConfigError
    from paracube.models.sources import parse_model
    from paracube.outputs import check_output

    source = parse_model(args.model)
    if source.kind != "hf":
        raise ConfigError(
            f"paracube import {args.model}: give a Hugging Face model directory, hf:DIR"
        )
    if not args.out.endswith(".safetensors"):
        raise ConfigError(f"--out {args.out}: give a .safetensors file name")
    check_output(args.out, "--out", "new", exists_hint="remove it first")
    from paracube.models.hf_convert import import_hf

    cfg = import_hf(source.where, args.out)
    print(
        f"paracube: imported {source.where} ({cfg.name}, {cfg.n_layers} layers of {cfg.hidden}) "
        f"to {args.out}: paracube train --init-from {args.out}"
    )
    return 0
