"""Worker (2 ranks, backend in argv[1], trace file prefix in argv[2]): the collectives and
point-to-point ops of one step under torch.profiler, exported with export_chrome_trace; reports
the names, thread and args of the spans named "<backend>:...", and the span of an async all_reduce
(issued, then waited on after a sleep: its span must cover the wait)."""
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
from native.ranks import report  # noqa: E402
import wirespeed.native  # noqa: E402,F401

backend, prefix = sys.argv[1], sys.argv[2]
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.arange(1024, dtype=torch.float32)
out = {"rank": rank}
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    dist.all_reduce(t)
    dist.all_gather([torch.empty(1024) for _ in range(world)], t)
    dist.reduce_scatter(torch.empty(1024), [torch.ones(1024) for _ in range(world)])
    dist.broadcast(t, 0)
    peer = 1 - rank
    for sender in (0, 1):            # each rank sends once and receives once
        if rank == sender:
            dist.send(t, peer)
        else:
            dist.recv(t, peer)
    work = dist.all_reduce(t, async_op=True)
    time.sleep(0.05)
    work.wait()
path = f"{prefix}{rank}.json"
prof.export_chrome_trace(path)
spans = [e for e in json.load(open(path))["traceEvents"]
         if e.get("ph") == "X" and e.get("name", "").startswith(f"{backend}:")]
out["names"] = sorted({e["name"] for e in spans})
out["c10d"] = sorted({e["name"] for e in json.load(open(path))["traceEvents"] if e.get("name", "").startswith("c10d::")})
out["threads"] = sorted({e["tid"] for e in spans})
out["main_thread"] = __import__("threading").get_native_id()
out["spans"] = [{"name": e["name"], "dur_us": e.get("dur"), "args": e.get("args", {})} for e in spans]
report(out)
dist.destroy_process_group()
