"""Worker: torch.distributed clients on a job whose default backend is wirespeed, each scenario's
results reported for test_clients.py to compare with gloo's (a gloo group of the same ranks in
the same job) or with an exact reference. argv: the scenarios to run."""
import datetime
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
from native import clients_api as api  # noqa: E402
from native import clients_models as models  # noqa: E402
from native.ranks import report  # noqa: E402
import wirespeed.native  # noqa: E402,F401

torch.set_num_threads(1)
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
dist.init_process_group("wirespeed", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
ws = dist.group.WORLD
gloo = dist.new_group(backend="gloo")


def fsdp2():
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    return {"wirespeed": models.fsdp2_training(rank, world, init_device_mesh("cpu", (world,))),
            "gloo": models.fsdp2_training(rank, world, DeviceMesh.from_group(gloo, "cpu"))}


def ddp_hooks():
    # gloo first: a hook that fails there is torch's failure, and must fail alike on wirespeed
    return {h: {"gloo": models.ddp_with_hook(rank, gloo, h), "wirespeed": models.ddp_with_hook(rank, ws, h)}
            for h in models.HOOKS}


def compiled(backend):
    t0 = time.monotonic()
    try:
        res = models.compiled_collective(rank, world, ws, backend)
    except Exception as e:  # noqa: BLE001 - reported: the test says whether torch could compile here
        res = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    res["seconds"] = time.monotonic() - t0
    return res


SCENARIOS = {
    "api": lambda: api.api_surface(rank, world),
    "dtypes": lambda: api.dtype_op_grid(rank, world, ws),
    "layouts": lambda: api.layouts(rank, world, ws),
    "data_dtypes": lambda: api.data_dtypes(rank, world, ws),
    "functional": lambda: api.functional(rank, world, ws),
    "mesh1d": lambda: models.dtensor_1d(rank, world, ws),
    "mesh2d": lambda: models.dtensor_2d(rank, world),
    "fsdp2": fsdp2,
    "ddp_hooks": ddp_hooks,
    "compile_aot_eager": lambda: compiled("aot_eager"),
    "compile_inductor": lambda: compiled("inductor"),
}

out = {"rank": rank}
for name in sys.argv[1:]:
    t0 = time.monotonic()
    try:
        out[name] = SCENARIOS[name]()
    except Exception:  # noqa: BLE001 - every scenario's failure is reported, with its traceback
        out[name] = {"crash": traceback.format_exc()[-3000:]}
    out.setdefault("seconds", {})[name] = round(time.monotonic() - t0, 2)
    dist.barrier(group=gloo)     # the next scenario starts together, whatever this one did
if os.environ.get("CLIENTS_REPORT_DIR"):   # launched by torchrun: ranks share one stdout
    with open(os.path.join(os.environ["CLIENTS_REPORT_DIR"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
else:
    report(out)
dist.destroy_process_group()
os._exit(0)
