"""Worker: dtensor_checks.py on a wirespeed mesh and on a gloo mesh of the same ranks (the
control). argv: the checks to run. Reports {backend: {check: result}}."""
import datetime
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
from native import dtensor_checks as dc  # noqa: E402
from native.ranks import report  # noqa: E402
import wirespeed.native  # noqa: E402,F401

torch.set_num_threads(1)
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("wirespeed", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402

gloo = dist.new_group(backend="gloo")


def mesh_2d(backend):
    """A 2 x world/2 ("dp", "tp") mesh whose groups are of `backend`."""
    grid = torch.arange(world).reshape(2, world // 2)
    dp = tp = None
    for col in grid.t().tolist():          # every rank creates every group, in the same order
        g = dist.new_group(col, backend=backend)
        dp = g if rank in col else dp
    for row in grid.tolist():
        g = dist.new_group(row, backend=backend)
        tp = g if rank in row else tp
    return DeviceMesh.from_group([dp, tp], "cpu", mesh=grid, mesh_dim_names=("dp", "tp"))


meshes = {"wirespeed": DeviceMesh.from_group(dist.group.WORLD, "cpu"), "gloo": DeviceMesh.from_group(gloo, "cpu")}
CHECKS = {
    "redistribute": lambda b: dc.redistributions(rank, world, meshes[b]),
    "matmul": lambda b: dc.matmuls(rank, world, meshes[b]),
    "tp": lambda b: dc.tp_training(rank, world, meshes[b]),
    "fsdp_tp": lambda b: dc.fsdp_tp_training(rank, world, mesh_2d(b)),
}
out = {b: {} for b in meshes}
for name in sys.argv[1:]:
    for backend in meshes:
        try:
            out[backend][name] = CHECKS[name](backend)
        except Exception:  # noqa: BLE001 - reported with its traceback
            out[backend][name] = {"crash": traceback.format_exc()[-2500:]}
        dist.barrier(group=gloo)
report(out)
dist.destroy_process_group()
os._exit(0)
