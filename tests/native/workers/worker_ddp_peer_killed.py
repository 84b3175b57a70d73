"""Driver (one process): ROUNDS jobs of DDP on wirespeed, each of 2 or 3 ranks forked from here
(torch is imported once, so a round costs well under a second rather than an interpreter per
rank), and in each the last rank SIGKILLs itself mid-step: between its forward and its backward,
or inside its backward (a gradient hook), at a step that varies by round. Every survivor's backward
meets the dead peer in DDP's bucket all_reduces (the futures of Work.get_future, read by DDP's C++
reducer, or by a Python comm hook) and must raise; what it raised, as faults.py reads it, goes
back through a pipe. Reports one entry per round: the victim's and each survivor's exit status
(a signal death is negative) and each survivor's error."""
import datetime
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
from native.ranks import free_port, report  # noqa: E402
import wirespeed.native  # noqa: E402,F401 - registers the backend
from wirespeed.faults import rank_error  # noqa: E402
from wirespeed.launch.local import rank_env  # noqa: E402

ROUNDS = int(sys.argv[1])
# What DDP imports on first use (torch._dynamo, seconds of it), imported here once for every fork.
import torch._dynamo  # noqa: E402,F401
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook  # noqa: E402


def rank_main(rank: int, world: int, kill_step: int, where: str, hook: bool, w) -> None:
    dist.init_process_group("wirespeed", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=20))
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    ddp = DDP(model, bucket_cap_mb=0.01)   # several buckets: all_reduces in flight during backward
    if hook:
        ddp.register_comm_hook(None, allreduce_hook)
    victim = rank == world - 1
    if victim and where == "backward":
        step_now = [0]
        model[0].weight.register_hook(lambda g: os.kill(os.getpid(), signal.SIGKILL)
                                      if step_now[0] == kill_step else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    out = {"rank": rank}
    try:
        for step in range(kill_step + 50):
            if victim and where == "backward":
                step_now[0] = step
            opt.zero_grad()
            loss = nn.functional.mse_loss(ddp(torch.randn(8, 16)), torch.randn(8, 3))
            if victim and where == "forward" and step == kill_step:
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()
            opt.step()
        out["error"] = "none"
    except Exception as e:  # noqa: BLE001
        err = rank_error(rank, e)
        out["error"] = type(err).__name__
        out["message"] = str(err)
    os.write(w, (json.dumps(out) + "\n").encode())


rounds = []
for n in range(ROUNDS):
    world, kill_step = 2 + n % 2, n % 3
    where, hook = ("forward", "backward")[n // 2 % 2], n % 4 == 3; port = free_port()
    r_fd, w_fd = os.pipe()
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(r_fd)
                os.environ.update(rank_env(rank, world, port))
                rank_main(rank, world, kill_step, where, hook, w_fd)
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        pids.append(pid)
    os.close(w_fd)
    with os.fdopen(r_fd) as f:
        said = [json.loads(line) for line in f]
    codes = []
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        codes.append(os.waitstatus_to_exitcode(status))
    rounds.append({"world": world, "kill_step": kill_step, "where": where, "hook": hook, "codes": codes,
                   "said": sorted(said, key=lambda s: s["rank"])})
report(rounds)
