"""``paracube export``: a checkpoint's weights as one safetensors file for the serial GPT."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write a checkpoint's weights as one safetensors file (loads into the serial GPT)",
        description="Consolidate a checkpoint (any layout) into serial fp32 weights.",
    )
    p.add_argument("checkpoint", help="a checkpoint folder, or a --save-dir (its newest)")
    p.add_argument("--out", required=True, help="the .safetensors file to write")
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    from paracube.checkpoint.store import resolve
    from paracube.errors import ParacubeError
    from paracube.outputs import check_output

    if not args.out.endswith(".safetensors"):
        raise ParacubeError(f"--out {args.out}: the file must end in .safetensors")
    check_output(args.out, "--out", "new", exists_hint="remove it first")
    path = resolve(args.checkpoint, None, flag="export")
    from paracube.checkpoint.export import export

    cfg, step = export(path, args.out)
    print(f"paracube: exported {path} (step {step}, {cfg.name}) to {args.out}")
    return 0
