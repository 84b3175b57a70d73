"""Worker: an unchanged training script's view of the wirespeed backend - it never imports
wirespeed; torch's backend autoloading has to make "wirespeed" a backend. Prints one RESULT line
(by hand: importing the tests' helpers would import wirespeed)."""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

loaded_at_import = sorted(m for m in sys.modules if m == "wirespeed" or m.startswith("wirespeed."))
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("wirespeed", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
t = torch.full((1024,), float(rank + 1))
dist.all_reduce(t)
print("RESULT " + json.dumps({"loaded_at_import": loaded_at_import, "sum": t.unique().tolist(),
                              "group": type(dist.group.WORLD).__name__,
                              "backend": dist.get_backend()}), flush=True)
dist.destroy_process_group()
