"""Worker: every case of entry_paths.py (or those named in argv) on the wirespeed group and, as the
control that says the case itself is right, on a gloo group of the same ranks. Reports {backend: {case: problems}}; a
case that raised reports its error as its one problem."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
from native.entry_paths import CASES, run_case  # noqa: E402
from native.ranks import report  # noqa: E402
import wirespeed.native  # noqa: E402,F401

torch.set_num_threads(1)
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("wirespeed", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
groups = {"wirespeed": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
out = {b: {} for b in groups}
for name in sys.argv[1:] or CASES:
    for backend, g in groups.items():
        try:
            out[backend][name] = run_case(name, rank, world, g)
        except Exception as e:  # noqa: BLE001 - reported as the case's problem
            out[backend][name] = [f"raised {type(e).__name__}: {str(e)[:400]}"]
        dist.barrier(group=groups["gloo"])
report(out)
dist.destroy_process_group()
os._exit(0)
