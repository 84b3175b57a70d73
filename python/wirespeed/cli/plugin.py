"""`wirespeed plugin-path`: the absolute path of the built NCCL network plugin (for NCCL_NET_PLUGIN)."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("plugin-path", help="print the absolute path of the NCCL network plugin "
                       "(libnccl-net-wirespeed.so), for NCCL_NET_PLUGIN",
                       description="Print the absolute path of the built NCCL network plugin. Use it "
                       "as NCCL_NET_PLUGIN=$(wirespeed plugin-path) NCCL_NET=wirespeed, or let "
                       "`wirespeed launch --fast-net` / `wirespeed bench --fast-net` set both.")
    p.set_defaults(func=main)


def main(args, argv) -> int:
    from ..netplugin import require
    print(require())
    return 0
