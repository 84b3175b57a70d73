"""`wirespeed env`: what a bug report needs (versions, backends and why not, CPUs, GPUs, NICs)."""
from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("env", help="print versions, backends, CPUs, GPUs and NICs for a bug report")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=main)


def main(args, argv) -> int:
    from ..envinfo import full_report
    rep = full_report()
    if args.json:
        print(json.dumps(rep, indent=2))
        return 0
    print(f"host      {rep['host']}  ({rep['platform']})")
    print(f"cpu       {rep['cpu']}  x{rep['cpus']}  memory {rep['mem_gib']} GiB")
    print(f"gpus      {', '.join(rep['gpus']) or 'none visible'}")
    print("versions  " + ", ".join(f"{k} {v}" for k, v in rep["versions"].items()))
    print("backends")
    for name, status in rep["backends"].items():
        print(f"  {name:<10} {status}")
    print(f"nccl-net  wirespeed plugin {rep['nccl_plugin']}")
    print("nics")
    for n in rep["nics"]:
        speed = f"{n['speed_mbps']} Mb/s" if n["speed_mbps"] else "speed unknown"
        print(f"  {n['name']:<12} {n['state'] or '?':<8} mtu {n['mtu']:<6} {speed:<14} "
              f"{' '.join(n['ipv4']) or '-'}")
    return 0
