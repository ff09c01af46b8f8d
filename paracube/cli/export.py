"""``paracube export``: a checkpoint's weights as one safetensors file for the serial GPT."""

from __future__ import annotations

import os


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write a checkpoint's weights as one safetensors file (loads into the serial GPT)",
        description="Consolidate a checkpoint (any layout) into serial fp32 weights.",
    )
    p.add_argument("checkpoint", help="a checkpoint folder, or a --save-dir (its newest)")
    p.add_argument(
        "--out",
        required=True,
        help="the .safetensors file to write; or, for a Hugging Face model (--model hf:DIR), "
        "a new folder that transformers' from_pretrained loads",
    )
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    from paracube.checkpoint.export import export, export_hf
    from paracube.checkpoint.store import resolve
    from paracube.errors import ParacubeError
    from paracube.outputs import check_output

    folder = not args.out.endswith(".safetensors")
    if folder and os.path.exists(args.out):
        raise ParacubeError(f"--out {args.out} exists: give a new folder (or a .safetensors file)")
    if not folder:
        check_output(args.out, "--out", "new", exists_hint="remove it first")
    path = resolve(args.checkpoint, None, flag="export")
    cfg, step = (export_hf if folder else export)(path, args.out)
    print(f"paracube: exported {path} (step {step}, {cfg.name}) to {args.out}")
    return 0
