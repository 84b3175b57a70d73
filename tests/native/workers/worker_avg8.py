"""Worker (4 ranks): the mean of 8-bit integers on the wirespeed backend is exact on one host
(summed in 32 bits before dividing) and refused in one clear error across hosts (where partial
sums would be stored in 8 bits), never a silently wrong mean."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
from native.ranks import report  # noqa: E402
import wirespeed.native  # noqa: E402,F401

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
out = {"rank": rank}
os.environ["WIRESPEED_HOSTID"] = "one-host"
one = dist.new_group(backend="wirespeed")
os.environ["WIRESPEED_HOSTID"] = f"host{rank // 2}"  # ranks 0,1 on one "host", 2,3 on another
two = dist.new_group(backend="wirespeed")
# 38 everywhere: an 8-bit sum of 4 wraps (152 -> -104) and would "average" to -26.
for name, dtype, values in (("int8", torch.int8, [38, -128, 127, -3 + rank]),
                            ("uint8", torch.uint8, [200, 255, 0, 3 + rank])):
    t = torch.tensor(values, dtype=dtype)
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=one)
    out[f"{name}_one_host"] = t.tolist()
    t = torch.tensor([38] * 1000, dtype=dtype)
    dist.reduce_scatter_tensor(s := torch.empty(250, dtype=dtype), t, op=dist.ReduceOp.AVG, group=one)
    out[f"{name}_rs_one_host"] = sorted(set(s.tolist()))
    calls = {"all_reduce": lambda t: dist.all_reduce(t, op=dist.ReduceOp.AVG, group=two),
             "reduce": lambda t: dist.reduce(t, dst=1, op=dist.ReduceOp.AVG, group=two),
             "reduce_scatter": lambda t: dist.reduce_scatter_tensor(torch.empty(2, dtype=dtype), t,
                                                                    op=dist.ReduceOp.AVG, group=two)}
    for call, fn in calls.items():
        try:
            fn(torch.full((8,), 38, dtype=dtype))
            out[f"{name}_{call}_two_hosts"] = "no error"
        except Exception as e:  # noqa: BLE001
            out[f"{name}_{call}_two_hosts"] = f"{type(e).__name__}: {e}"
    t = torch.full((8,), 38, dtype=dtype)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=two)  # the group is still usable
    out[f"{name}_sum_after"] = sorted(set(t.tolist()))
report(out)
dist.barrier()
os._exit(0)
