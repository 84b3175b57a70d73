"""SLURM across the emulated cluster's hosts: a controller and one slurmd per host, as on a small
real cluster, then `srun` and `sbatch` as users type them.

The fixture writes a scratch slurm.conf (auth/none, so no munge; root runs every daemon; no
cgroups: proctrack/linuxproc, task/none), starts slurmctld on h0 and one slurmd on each host, all
through `wirespeed cluster exec`, and waits until `sinfo` shows every node idle. The controller runs
on h0, the way a small cluster's head node doubles as a compute node: the cluster's addresses exist
only inside it (the machine itself has no interface on the bridge), and srun must be reachable by
every slurmd, so it runs on a host too. Each cluster has its own network namespaces, so SLURM's
default ports never meet another test's. Afterwards: jobs cancelled, daemons stopped, the scratch
directory removed, and (the cluster_name fixture) nothing left running in the cluster.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import pytest
from netem_util import cluster_name  # noqa: F401 (a fixture)
from netem_util import cli, needs_netns
from test_real_engines import (HEADER, RANK_TIMEOUT, RATE, STARTUP, Job, _check_records,
                               _table_names_every_rank)

pytestmark = [pytest.mark.netns, needs_netns]

DAEMONS = ("slurmctld", "slurmd", "srun", "sbatch", "sinfo", "scontrol", "scancel", "squeue")
READY_S = 60     # daemons up and nodes idle (seconds on an idle machine; minutes when loaded)


def _why_not() -> str | None:
    for t in ("nsenter", "unshare"):
        if shutil.which(t) is None:
            return f"`{t}` is not installed (util-linux)"
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return (f"SLURM is not installed ({', '.join(missing)} missing): "
                "apt-get install slurmctld slurmd slurm-client")
    # The scratch config authenticates with auth/none, so that no munge daemon and key are needed;
    # newer SLURM releases dropped that plugin.
    import glob
    for d in glob.glob("/usr/lib/*/slurm-wlm") + ["/usr/lib/slurm", "/usr/lib64/slurm",
                                                 "/usr/local/lib/slurm"]:
        if glob.glob(os.path.join(d, "select_*.so")) and not os.path.exists(os.path.join(d, "auth_none.so")):
            return f"this SLURM has no auth/none plugin ({d}): the test's config runs without munge"
    return None


def _env(**extra) -> dict:
    """The test's environment without any launcher's variables (pytest itself may run in a job)."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "_WIRESPEED_LOCAL_SPAWN")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SLURM_")}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


CONF = """\
ClusterName={cluster}
SlurmctldHost={h0}({addr0})
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
{nodes}
PartitionName=ws Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class Slurm:
    name: str                 # the emulated cluster's (and SLURM's ClusterName)
    dir: str                  # scratch directory: slurm.conf, state, spool, logs
    hosts: list[str]          # node names = the hosts' names
    daemons: list = field(default_factory=list)

    @property
    def conf(self) -> str:
        return os.path.join(self.dir, "slurm.conf")

    def on(self, host: str, *cmd) -> list[str]:
        """CMD as a process of `host`, pointed at this cluster's slurm.conf."""
        return cli("cluster", "exec", "--cluster", self.name, host, "--", "env",
                   f"SLURM_CONF={self.conf}", *map(str, cmd))

    def run(self, *cmd, host="h0", timeout=60) -> subprocess.CompletedProcess:
        return subprocess.run(self.on(host, *cmd), capture_output=True, text=True,
                              timeout=timeout, env=_env(), stdin=subprocess.DEVNULL)

    def logs(self) -> str:
        out = []
        for root, _, files in os.walk(os.path.join(self.dir, "log")):
            for f in sorted(files):
                with open(os.path.join(root, f), errors="replace") as fh:
                    out.append(f"--- {f}\n" + fh.read()[-1500:])
        return "\n".join(out)


def _start(s: Slurm, addrs: list[str]) -> None:
    from wirespeed.netem import cluster as C
    for sub in ("state", "log", *(f"spool/{h}" for h in s.hosts)):
        os.makedirs(os.path.join(s.dir, sub), exist_ok=True)
    nodes = "\n".join(f"NodeName={h} NodeAddr={a} CPUs=2 State=UNKNOWN" for h, a in zip(s.hosts, addrs))
    with open(s.conf, "w") as f:
        f.write(CONF.format(cluster=s.name, h0=s.hosts[0], addr0=addrs[0], d=s.dir, nodes=nodes))
    # -D: in the foreground, so each daemon is the process started here (cluster exec execs it).
    log = open(os.path.join(s.dir, "log", "daemons.out"), "w")
    starts = [("h0", ["slurmctld", "-D", "-f", s.conf])]
    starts += [(f"h{i}", ["slurmd", "-D", "-f", s.conf, "-N", h]) for i, h in enumerate(s.hosts)]
    for host, argv in starts:
        s.daemons.append(subprocess.Popen(
            cli("cluster", "exec", "--cluster", s.name, host, "--", *argv), stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env()))
    log.close()
    deadline = time.monotonic() + READY_S
    states = ""
    while time.monotonic() < deadline:
        if any(d.poll() is not None for d in s.daemons):
            break
        p = s.run("sinfo", "-h", "-N", "-o", "%N %t", timeout=30)
        states = p.stdout
        seen = dict(line.split() for line in states.splitlines() if len(line.split()) == 2)
        if p.returncode == 0 and all(seen.get(h) == "idle" for h in s.hosts):
            assert C.host_ns(s.name, 0) == s.hosts[0]
            return
        time.sleep(0.5)
    pytest.fail(f"SLURM did not come up within {READY_S} s (sinfo: {states!r}):\n{s.logs()}")


def _stop(s: Slurm) -> None:
    if all(d.poll() is None for d in s.daemons[:1]):
        # Cancel whatever a failed test left queued or running; slurmd's step daemons end with it.
        s.run("scancel", "--full", "--partition", "ws", timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and s.run("squeue", "-h", timeout=30).stdout.strip():
            time.sleep(0.5)
    for d in reversed(s.daemons):   # the slurmds first, then the controller
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
    for d in s.daemons:
        try:
            d.wait(timeout=15)
        except subprocess.TimeoutExpired:
            d.kill()
            d.wait()
    shutil.rmtree(s.dir, ignore_errors=True)


@pytest.fixture
def slurm(cluster_name):  # noqa: F811 (the fixture imported above)
    """A SLURM cluster over a fresh 2-host emulated cluster: node names = the hosts' names."""
    if (why := _why_not()) is not None:
        pytest.skip(why)
    from wirespeed.netem import cluster as C
    c, _ = C.up(2, RATE, name=cluster_name, measure=False)
    # A short path: slurmd's sockets live under the spool directory, and a Unix socket's path
    # must fit in 108 bytes.
    s = Slurm(cluster_name, tempfile.mkdtemp(prefix="wsslurm-"), [h.netns for h in c.hosts])
    try:
        _start(s, [h.addr for h in c.hosts])
        yield s
    finally:
        _stop(s)
    assert not os.path.exists(s.dir)


def _bench(backend: str, *extra) -> list[str]:
    return [sys.executable, "-m", "wirespeed.cli.main", "bench", "--backend", backend, "--no-save",
            "--no-progress", "-w", 1, "--timeout", RANK_TIMEOUT, *extra]


@pytest.mark.slow
@pytest.mark.timeout(READY_S + STARTUP + 120)
@pytest.mark.parametrize("backend", ["gloo", "wirespeed"])
def test_srun_across_hosts(slurm, tmp_path, backend):
    """srun -N 2 -n 4: each rank reads SLURM_PROCID/NTASKS/LOCALID and meets at the step's first
    node (from SLURM_STEP_NODELIST), on a port derived from the job id."""
    out = tmp_path / "records.jsonl"
    job = Job(tmp_path, [slurm.on("h0", "srun", "-N", 2, "-n", 4, "--time", 5,
                                  *_bench(backend, "--sizes", "64K,1M", "-n", 5, "--json", out))])
    codes = job.wait(STARTUP)
    assert codes == [0], job.text()[-4000:] + slurm.logs()
    _check_records(out, backend, slurm.name)
    # srun's block distribution: tasks 0-1 on the first node.
    hosts = json.loads(out.read_text().splitlines()[0])["env"]["hosts"]
    assert hosts == [slurm.hosts[0]] * 2 + [slurm.hosts[1]] * 2, hosts
    _table_names_every_rank(job.text(), slurm.name)


# The batch script as the networking guides write it: one torchrun per node through srun, its
# c10d rendezvous at the allocation's first node, found with scontrol.
BATCH = """\
#!/bin/bash
#SBATCH --job-name=wirespeed-bench
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:05:00
#SBATCH --output={out}/slurm-%j.out

head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export OMP_NUM_THREADS=1

srun {python} -m torch.distributed.run \\
    --nnodes "$SLURM_NNODES" --nproc-per-node 2 \\
    --rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d --rdzv-endpoint "$head_node:29400" \\
    -m wirespeed.cli.main bench --backend gloo --no-save --no-progress -w 1 --timeout {timeout} \\
    --sizes 64K,1M -n 5 --json {out}/records.jsonl
"""


@pytest.mark.slow
@pytest.mark.timeout(READY_S + STARTUP + 120)
def test_sbatch_of_a_guide_style_batch_script(slurm, tmp_path):
    try:
        import torch.distributed.run  # noqa: F401
    except ImportError:
        pytest.skip("torch.distributed.run (torchrun) is not importable")
    script = tmp_path / "bench.sbatch"
    script.write_text(BATCH.format(out=tmp_path, python=sys.executable, timeout=RANK_TIMEOUT))
    p = slurm.run("sbatch", "--parsable", "--wait", script, timeout=STARTUP)
    outs = sorted(tmp_path.glob("slurm-*.out"))
    text = outs[0].read_text() if outs else ""
    assert p.returncode == 0, p.stdout + p.stderr + text[-4000:] + slurm.logs()
    assert [o.name for o in outs] == [f"slurm-{p.stdout.strip().split(';')[0]}.out"]
    assert "# Out of bounds values : 0 OK" in text, text[-4000:]
    _check_records(tmp_path / "records.jsonl", "gloo", slurm.name)
    _table_names_every_rank(text, slurm.name)
    assert slurm.run("squeue", "-h").stdout.strip() == ""


def _ranks_on(ns: str) -> list[tuple[int, int]]:
    """(pid, SLURM_PROCID) of the bench ranks running in a host, oldest first."""
    from wirespeed.netem.ns import netns_pids
    found = []
    for pid in sorted(netns_pids(ns)):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0")
                           if "=" in kv)
        except OSError:
            continue
        if "wirespeed.cli.main" in argv and "SLURM_PROCID" in env:
            found.append((pid, int(env["SLURM_PROCID"])))
    return found


@pytest.mark.slow
@pytest.mark.timeout(READY_S + STARTUP + RANK_TIMEOUT + 120)
def test_killed_rank_ends_the_srun_job_within_the_timeout(slurm, tmp_path):
    job = Job(tmp_path, [slurm.on("h0", "srun", "-N", 2, "-n", 4, "--time", 5,
                                  *_bench("wirespeed", "--sizes", "8M", "-n", 2000))])
    job.wait_for(HEADER, STARTUP)
    time.sleep(2.0)   # into the timed loop
    assert all(p.poll() is None for p in job.procs), "the job ended before the kill: make it longer"
    victims = _ranks_on(slurm.hosts[1])
    assert len(victims) == 2, victims
    pid, rank = victims[-1]
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    codes = job.wait(RANK_TIMEOUT + 30)
    took = time.monotonic() - t0
    text = job.text()
    assert codes != [0], text[-4000:]
    assert took < RANK_TIMEOUT + 10, (took, text[-4000:])
    # srun names the task that died and how.
    assert f"task {rank}: Killed" in text, text[-4000:]
    deadline = time.monotonic() + 20
    while _ranks_on(slurm.hosts[0]) + _ranks_on(slurm.hosts[1]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ranks_on(slurm.hosts[0]) + _ranks_on(slurm.hosts[1]) == [], "a rank outlived the job"
