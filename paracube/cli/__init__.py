"""``paracube`` command line: one module per command — ``train``, ``data``, ``plan``,
``schedule``, ``calibrate``, ``export``, ``import``, ``diagnose``, ``scale`` — over the shared :mod:`paracube.report`.

Every configuration error is reported as one line, ``paracube: error: …``, with exit
status 2, before any process or collective is started. Parsing and validation do not
import torch, so a bad command line fails in a fraction of a second.
"""

from __future__ import annotations

import argparse
import sys

from paracube.cli import (
    calibrate,
    data,
    diagnose,
    export,
    import_hf,
    plan,
    scale,
    schedule,
    train,
)
from paracube.cli.train import config_from_args
from paracube.errors import ParacubeError

__all__ = ["build_parser", "config_from_args", "main"]

COMMANDS = (train, data, schedule, plan, calibrate, export, import_hf, diagnose, scale)


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as paracube's one line (no usage dump) and exit 2."""

    def error(self, message: str):
        self.exit(2, f"paracube: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="paracube", description="Distributed training on PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()  # a reader that left is found here, not in the interpreter's exit
        return status
    except ParacubeError as e:
        print(f"paracube: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader left (``paracube plan … | head``): stop quietly, as a process killed by
        # SIGPIPE would (status 128 + 13), pointing stdout at devnull so that flushing it at
        # exit cannot fail again (the Python documentation's recipe, "Note on SIGPIPE")
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
