"""`wirespeed plugin-path`: the absolute path of the built NCCL network plugin (for NCCL_NET_PLUGIN);
`wirespeed plugin-check LOG...`: whether NCCL's own log shows the plugin carried the traffic."""
from __future__ import annotations

from .common import positive_int


def register(sub) -> None:
    p = sub.add_parser("plugin-path", help="print the absolute path of the NCCL network plugin "
                       "(libnccl-net-wirespeed.so), for NCCL_NET_PLUGIN",
                       description="Print the absolute path of the built NCCL network plugin. Use it "
                       "as NCCL_NET_PLUGIN=$(wirespeed plugin-path) NCCL_NET=wirespeed, or let "
                       "`wirespeed launch --fast-net` / `wirespeed bench --fast-net` set both.")
    p.set_defaults(func=main)
    c = sub.add_parser("plugin-check", help="check NCCL's log (NCCL_DEBUG=INFO) for proof that the "
                       "wirespeed plugin carried the traffic between hosts",
                       description="Read the NCCL_DEBUG=INFO output of a --fast-net run (files, or - "
                       "for stdin) and exit 0 only if every NCCL process said `Using network "
                       "wirespeed` and connections went `via NET/wirespeed`; otherwise say what the "
                       "log shows instead (NCCL falls back to its socket transport silently when a "
                       "plugin does not load) and exit 1.")
    c.add_argument("logs", nargs="+", metavar="LOG", help="NCCL log files (NCCL_DEBUG_FILE's, or "
                   "the ranks' output), - for stdin")
    c.add_argument("--ranks", type=positive_int("--ranks", 1), default=None,
                   help="how many NCCL processes the run had (each must have logged its network)")
    c.set_defaults(func=check)


def main(args, argv) -> int:
    from ..netplugin import require
    print(require())
    return 0


# The most of a log plugin-check reads (a file, or stdin): NCCL_DEBUG=INFO writes a few KB per
# process; past this a log is refused rather than read (/dev/zero would be read forever).
MAX_LOG_BYTES = 256 << 20


def check(args, argv) -> int:
    import sys

    from ..errors import UsageError
    from ..plans.format import read_bytes
    from ..sizes import human_bytes
    texts = []
    for path in args.logs:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_LOG_BYTES + 1)
            if len(data) > MAX_LOG_BYTES:
                raise UsageError(f"NCCL log on stdin: more than {human_bytes(MAX_LOG_BYTES)}, the most "
                                 "plugin-check reads (MAX_LOG_BYTES)")
        else:
            data = read_bytes(path, f"NCCL log {path!r}", "NCCL log", UsageError, MAX_LOG_BYTES, "MAX_LOG_BYTES")
        texts.append(data.decode("utf-8", errors="replace"))
    from ..nccl_log import fast_net_problem, fast_net_summary
    text = "\n".join(texts)
    problem = fast_net_problem(text, processes=args.ranks)
    if problem is not None:
        sys.stderr.write(f"wirespeed plugin-check: FAILED: {problem}\n")
        return 1
    print(f"wirespeed plugin-check: ok: {fast_net_summary(text)}")
    return 0
