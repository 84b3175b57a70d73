"""`wirespeed`: registers the subcommands; each lives in its own module with `register(sub)`."""
from __future__ import annotations

import sys

from ..errors import WirespeedError
from . import (batching, bench, cluster, compare, env, launch, links, model, objects, plot, plugin,
               predict, tune)
from .common import Parser, fail

SUBCOMMANDS = (bench, batching, cluster, compare, env, launch, links, model, objects, plot, plugin,
               predict, tune)


def build_parser() -> Parser:
    parser = Parser(prog="wirespeed", description="Measure, compare and accelerate collective "
                    "communication for distributed training.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return args.func(args, argv) or 0
    except WirespeedError as e:
        fail(e)
    except KeyboardInterrupt:
        sys.stderr.write("wirespeed: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
