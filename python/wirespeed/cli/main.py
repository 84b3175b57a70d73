"""`wirespeed`: registers the subcommands; each lives in its own module with `register(sub)`."""
from __future__ import annotations

import os
import sys

from ..errors import WirespeedError
from ..limits import check_open_files
from . import (batching, bench, cluster, compare, env, flags, launch, links, model, objects, plan,
               plot, plugin, predict, train, tune)
from .common import Parser, fail

SUBCOMMANDS = (bench, batching, cluster, compare, env, launch, links, model, objects, plan, plot,
               plugin, predict, train, tune)


def build_parser() -> Parser:
    parser = Parser(prog="wirespeed", description="Measure, compare and accelerate collective "
                    "communication for distributed training.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def check_outputs_here(args) -> None:
    """Every command's outputs, proven writable before it does any work (flags.output). In the
    ranks of a rank-running command only rank 0 of an outer launcher (torchrun, srun, mpirun)
    checks: rank 0 writes, and nobody checked before it started. Under wirespeed's own spawn the
    shell that started the ranks checked already, and ranks probing one path at once would trip
    over each other's probe files."""
    if getattr(args, "_runs_ranks", False):
        from ..launch.environment import rank_info, spawned_here
        info = rank_info(need_master=False)
        if info is not None and (info.rank != 0 or spawned_here()):
            return
    flags.check_outputs(args)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        check_open_files()
        check_outputs_here(args)
        return args.func(args, argv) or 0
    except WirespeedError as e:
        fail(e)
    except KeyboardInterrupt:
        sys.stderr.write("wirespeed: interrupted\n")
        return 130


def run() -> None:
    """The `wirespeed` program (console script and `python -m wirespeed.cli.main`): main(), then
    leave at once with its status. Once torch is imported, the interpreter's normal teardown takes
    1.5-2 s on a small machine, and in a rank whose peer is gone a library destructor can wait on
    a dead socket for longer still: a failed job must end within its timeout, not seconds after.
    Everything wirespeed writes is closed when main() returns; stdout and stderr are flushed here."""
    try:
        code = main()
    except SystemExit as e:
        if isinstance(e.code, str):
            sys.stderr.write(e.code + "\n")
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    code = code or 0
    if "torch" not in sys.modules:
        sys.exit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":
    run()
