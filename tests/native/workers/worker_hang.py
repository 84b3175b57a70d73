"""Worker (3 ranks on wirespeed, 3 s timeout; argv "async": the third all_reduce async, then
waited on): rank 1 skips the third all_reduce, as a rank with a bug would. Ranks 0 and 2 report the error their third all_reduce ends in; rank 1 waits (alive, not
in a collective) until they have, and until its flight-recorder dump appears when one is asked
for (TORCH_FR_DUMP_TEMP_FILE), written by the watch that a peer's failure wakes; rank 0, which
holds the store, leaves last."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
from native.ranks import report  # noqa: E402
import wirespeed.native  # noqa: E402,F401

ASYNC = sys.argv[1:] == ["async"]     # the third all_reduce issued async and waited on
dist.init_process_group("wirespeed", timeout=datetime.timedelta(seconds=3))
rank, world = dist.get_rank(), dist.get_world_size()
store = dist.distributed_c10d._get_default_store()
out = {"rank": rank}
t = torch.ones(256)
for step in range(3):
    if step == 2 and rank == 1:
        break
    try:
        if step == 2 and ASYNC:
            dist.all_reduce(t, async_op=True).wait()
        else:
            dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001 - what the user sees is the result
        out["error"] = [type(e).__name__, str(e)]
        break
store.set(f"test/reported/{rank}", "1")
store.wait([f"test/reported/{r}" for r in range(world)], datetime.timedelta(seconds=60))
prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
if prefix:
    deadline = time.monotonic() + 20
    while not os.path.exists(f"{prefix}{rank}") and time.monotonic() < deadline:
        time.sleep(0.1)
    out["dumped"] = os.path.exists(f"{prefix}{rank}")
store.set(f"test/done/{rank}", "1")
if rank == 0:
    store.wait([f"test/done/{r}" for r in range(world)], datetime.timedelta(seconds=60))
report(out)
os._exit(0)      # the group is broken by design; no teardown to wait on
