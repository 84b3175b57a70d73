"""torchrun and Open MPI's mpirun across the emulated cluster's hosts, started as a user would.

Each launcher runs on the hosts through `wirespeed cluster exec` (the host's network, name, hosts
file and /dev/shm; the machine's /sys), exactly as docs/cluster.md's "Real engines" section shows:

- torchrun: one agent per host, c10d rendezvous at h0's address; the agents hand their workers
  the first node's host name as MASTER_ADDR, which only works if hosts resolve each other;
- mpirun: started on h0 with a hosts file of the hosts' names and the cluster's rsh agent, which
  enters a host instead of ssh-ing to it.

Through each: `wirespeed bench` with gloo and with wirespeed's own backend, 2 hosts x 2 ranks,
checked (0 wrong), its records naming 4 ranks on two distinct hosts; and a rank SIGKILLed
mid-collective ends the whole job within the ranks' timeout. Then `wirespeed links` under
torchrun names a slowed host, and `wirespeed model` runs under mpirun (SLURM and ssh have files of their own: test_slurm.py, test_ssh_launch.py).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from netem_util import cluster_name  # noqa: F401 (a fixture)
from netem_util import cli, needs_netns, netns_processes, run_here

pytestmark = [pytest.mark.netns, needs_netns]

STARTUP = 240    # two launchers and four ranks importing torch on a shared 2-core machine
RANK_TIMEOUT = 30
HEADER = "# wirespeed"   # rank 0 prints it once every rank joined
RATE = 400 * 10**6
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "_WIRESPEED_LOCAL_SPAWN")


def _why_not(tool: str) -> str | None:
    for t in ("nsenter", "unshare"):
        if shutil.which(t) is None:
            return f"`{t}` is not installed (util-linux)"
    if tool == "mpirun" and shutil.which("mpirun") is None:
        return "mpirun is not installed (Open MPI: apt-get install openmpi-bin)"
    if tool == "torchrun":
        try:
            import torch.distributed.run  # noqa: F401
        except ImportError:
            return "torch.distributed.run (torchrun) is not importable"
    return None


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _exec(name: str, host: str, *cmd) -> list[str]:
    return cli("cluster", "exec", "--cluster", name, host, "--", *map(str, cmd))


def _bench_args(backend: str, *extra) -> list[str]:
    return ["bench", "--backend", backend, "--no-save", "--no-progress", "-w", "1",
            "--timeout", RANK_TIMEOUT, *map(str, extra)]


def _torchrun(name: str, port: int, host: str, backend: str, *extra) -> list[str]:
    return _torchrun_running(name, port, host, 2, 2, _bench_args(backend, *extra))


def _torchrun_running(name: str, port: int, host: str, nnodes: int, nproc: int, wargs) -> list[str]:
    """torchrun's agent on `host`, running `wirespeed WARGS` in `nproc` workers."""
    from wirespeed.netem import cluster as C
    # h0's host name as the endpoint, as on a real cluster: it resolves on every host.
    return _exec(name, host, sys.executable, "-m", "torch.distributed.run", "--nnodes", nnodes,
                 "--nproc-per-node", nproc, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                 f"{C.host_ns(name, 0)}:{port}", "--rdzv-id", f"ws{port}", "--max-restarts", 0,
                 "-m", "wirespeed.cli.main", *map(str, wargs))


def _mpirun(name: str, hostfile, port: int | None, backend: str, *extra) -> list[str]:
    return _mpirun_running(name, hostfile, port, _bench_args(backend, *extra))


def _mpirun_running(name: str, hostfile, port: int | None, wargs) -> list[str]:
    """mpirun on h0 over the hosts file, 4 ranks running `wirespeed WARGS`; port None exports no
    MASTER_ADDR/PORT (the ranks then ask MPI where rank 0 runs)."""
    from wirespeed.netem import cluster as C
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    master = [] if port is None else ["-x", f"MASTER_ADDR={C.host_ns(name, 0)}",
                                      "-x", f"MASTER_PORT={port}"]
    return _exec(name, "h0", "mpirun", *root, "-np", 4, "--hostfile", hostfile,
                 "--mca", "plm_rsh_agent", C.agent_path(name),
                 "--mca", "oob_tcp_if_include", "ws0", "--mca", "btl_tcp_if_include", "ws0",
                 *[a for v in ("PATH", "PYTHONPATH", "OMP_NUM_THREADS") if v in _env()
                   for a in ("-x", v)],
                 *master, sys.executable, "-m", "wirespeed.cli.main", *map(str, wargs))


def _port(name: str) -> int:
    from wirespeed.launch.cluster import free_port_in
    from wirespeed.netem import cluster as C
    return free_port_in(C.host_ns(name, 0), "10.77.0.1")


def _hostfile(capsys, name: str, tmp_path):
    code, out, err = run_here(capsys, "cluster", "hostfile", "--cluster", name, "--names",
                              "--slots", 2)
    assert code == 0, err
    path = tmp_path / "hosts"
    path.write_text(out)
    return path


class Job:
    """Launcher processes started together, each writing its own output file."""

    def __init__(self, tmp_path, commands):
        self.paths = [tmp_path / f"launcher{i}.log" for i in range(len(commands))]
        self.procs = []
        for cmd, path in zip(commands, self.paths):
            with open(path, "w") as f:
                self.procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                                   env=_env(), stdin=subprocess.DEVNULL))

    def text(self) -> str:
        return "\n".join(p.read_text() for p in self.paths)

    def wait(self, limit_s: float) -> list[int]:
        deadline = time.monotonic() + limit_s
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"the job was still running after {limit_s:g} s:\n{self.text()[-3000:]}")
        return codes

    def wait_for(self, text: str, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if text in self.text():
                return
            if all(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.2)
        self.kill()
        pytest.fail(f"the job did not start:\n{self.text()[-3000:]}")

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def _check_records(path, backend: str, name: str) -> None:
    from wirespeed.netem import cluster as C
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert records, "no records"
    for r in records:
        assert r["backend"] == backend and r["world_size"] == 4, r
        assert r["wrong"] == 0, r
        assert r["link_rate_gbps"] == RATE / 1e9, r
    hosts = records[0]["env"]["hosts"]   # every rank's host name, in rank order
    # Two ranks per host, each host's ranks numbered together (torchrun numbers nodes in the
    # order they joined, so which host holds ranks 0-1 may differ run to run).
    assert sorted(hosts) == sorted([C.host_ns(name, 0), C.host_ns(name, 1)] * 2), hosts
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts


def _table_names_every_rank(text: str, name: str) -> None:
    from wirespeed.netem import cluster as C
    on = [line.split(" on ")[1].strip() for line in text.splitlines() if line.startswith("#  Rank ")]
    assert len(on) == 4 and set(on) == {C.host_ns(name, 0), C.host_ns(name, 1)}, text[-3000:]


@pytest.mark.timeout(120)
def test_cluster_exec_runs_on_a_host_that_looks_like_one(capsys, cluster_name, tmp_path):
    if (why := _why_not("exec")) is not None:
        pytest.skip(why)
    from wirespeed.netem import cluster as C
    c, _ = C.up(2, RATE, name=cluster_name, measure=False)
    h0, h1 = C.host_ns(cluster_name, 0), C.host_ns(cluster_name, 1)
    script = ("hostname; getent ahostsv4 %s | head -1; ls /sys/class/net | tr '\\n' ' '; echo; "
              "test -d /sys/fs/cgroup && echo cgroups; pwd; exit 7" % h0)
    p = subprocess.run(_exec(cluster_name, "h1", "sh", "-c", script), capture_output=True,
                       text=True, timeout=60, env=_env(), cwd=tmp_path)
    assert p.returncode == 7, p.stderr       # the command's own exit status
    lines = p.stdout.splitlines()
    assert lines[0] == h1                     # its own host name
    assert lines[1].split()[0] == c.hosts[0].addr and lines[1].split()[-1] == h0   # h0 resolves
    assert lines[2].split() == ["lo", "ws0"]  # the host's interfaces, not the machine's
    assert lines[3] == "cgroups"              # the machine's /sys otherwise (slurmd needs it)
    assert lines[4] == str(tmp_path)          # the working directory is kept

    # The rsh agent `up` wrote: host names, short names and addresses all reach the host.
    agent = C.agent_path(cluster_name)
    for name in (h0, "h0", c.hosts[0].addr):
        out = subprocess.run([agent, name, "hostname;", "echo", "$WS_X"], capture_output=True,
                             text=True, timeout=30, env={**_env(), "WS_X": "kept"}).stdout.split()
        assert out == [h0, "kept"], (name, out)

    code, out, _ = run_here(capsys, "cluster", "hostfile", "--cluster", cluster_name, "--names",
                            "--slots", 2)
    assert code == 0 and out.splitlines() == [f"{h0} slots=2", f"{h1} slots=2"]

    for args, says in ((["h5", "--", "true"], "is not in cluster"),
                       (["h1"], "no command to run")):
        p = subprocess.run(cli("cluster", "exec", "--cluster", cluster_name, *args),
                           capture_output=True, text=True, timeout=60, env=_env())
        assert p.returncode == 2 and says in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr
    p = subprocess.run(_exec(cluster_name, "h0", "no-such-command-here"), capture_output=True,
                       text=True, timeout=60, env=_env())
    assert p.returncode == 127 and "no-such-command-here: command not found" in p.stderr, p.stderr
    if shutil.which("setpriv"):  # a user without the rights: one line, exit 2
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            "--inh-caps=-all", *_exec(cluster_name, "h0", "true")],
                           capture_output=True, text=True, timeout=60, cwd="/")
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert "root or CAP_NET_ADMIN" in p.stderr, p.stderr
    assert netns_processes(cluster_name) == {}


@pytest.mark.slow
@pytest.mark.timeout(STARTUP + 120)
@pytest.mark.parametrize("backend", ["gloo", "wirespeed"])
def test_torchrun_across_hosts(cluster_name, tmp_path, backend):
    if (why := _why_not("torchrun")) is not None:
        pytest.skip(why)
    from wirespeed.netem import cluster as C
    C.up(2, RATE, name=cluster_name, measure=False)
    port = _port(cluster_name)
    out = tmp_path / "records.jsonl"
    job = Job(tmp_path, [_torchrun(cluster_name, port, h, backend, "--sizes", "64K,1M", "-n", 5,
                                   "--json", out) for h in ("h0", "h1")])
    codes = job.wait(STARTUP)
    assert codes == [0, 0], job.text()[-4000:]
    _check_records(out, backend, cluster_name)
    _table_names_every_rank(job.text(), cluster_name)
    assert netns_processes(cluster_name) == {}


@pytest.mark.slow
@pytest.mark.timeout(STARTUP + 120)
@pytest.mark.parametrize("backend,export_master", [("gloo", True), ("wirespeed", False)])
def test_mpirun_across_hosts(capsys, cluster_name, tmp_path, backend, export_master):
    """With MASTER_ADDR exported, as on any cluster; and without it, the ranks asking MPI."""
    if (why := _why_not("mpirun")) is not None:
        pytest.skip(why)
    if not export_master and importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed: ranks cannot ask MPI where rank 0 runs")
    from wirespeed.netem import cluster as C
    C.up(2, RATE, name=cluster_name, measure=False)
    out = tmp_path / "records.jsonl"
    job = Job(tmp_path, [_mpirun(cluster_name, _hostfile(capsys, cluster_name, tmp_path),
                                 _port(cluster_name) if export_master else None, backend,
                                 "--sizes", "64K,1M", "-n", 5, "--json", out)])
    codes = job.wait(STARTUP)
    assert codes == [0], job.text()[-4000:]
    _check_records(out, backend, cluster_name)
    # mpirun places ranks by slot in hosts-file order: ranks 0-1 on h0, 2-3 on h1.
    hosts = json.loads(out.read_text().splitlines()[0])["env"]["hosts"]
    assert hosts == [C.host_ns(cluster_name, 0)] * 2 + [C.host_ns(cluster_name, 1)] * 2, hosts
    _table_names_every_rank(job.text(), cluster_name)
    assert netns_processes(cluster_name) == {}


def _ranks_in(ns: str) -> list[int]:
    """Ranks (not launchers or Open MPI's daemons) running in a host, oldest first."""
    from wirespeed.netem.ns import netns_pids
    found = []
    for pid in netns_pids(ns):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "wirespeed.cli.main" in argv and "torch.distributed.run" not in argv:
            found.append(pid)
    return sorted(found)


def _rank_of(pid: int) -> int:
    """A rank's place in the job, as its launcher told it."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0") if "=" in kv)
    return int(env.get("RANK", env.get("OMPI_COMM_WORLD_RANK", "-1")))


def _gone(name: str, limit_s: float) -> dict:
    deadline = time.monotonic() + limit_s
    while (left := netns_processes(name)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


# Each launcher once and each backend once (not all four pairs: every run costs a minute or more
# on the shared 2-core machine): torchrun with gloo, the library most torchrun jobs use;
# mpirun with wirespeed's own backend.
@pytest.mark.slow
@pytest.mark.timeout(STARTUP + RANK_TIMEOUT + 120)
@pytest.mark.parametrize("launcher,backend", [("torchrun", "gloo"), ("mpirun", "wirespeed")])
def test_killed_rank_ends_the_job_within_the_timeout(capsys, cluster_name, tmp_path, launcher,
                                                     backend):
    if (why := _why_not(launcher)) is not None:
        pytest.skip(why)
    from wirespeed.netem import cluster as C
    C.up(2, RATE, name=cluster_name, measure=False)
    port = _port(cluster_name)
    extra = ("--sizes", "8M", "-n", 2000)   # minutes of work: the kill lands mid-collective
    if launcher == "torchrun":
        job = Job(tmp_path, [_torchrun(cluster_name, port, h, backend, *extra) for h in ("h0", "h1")])
    else:
        hostfile = _hostfile(capsys, cluster_name, tmp_path)
        job = Job(tmp_path, [_mpirun(cluster_name, hostfile, port, backend, *extra)])
    job.wait_for(HEADER, STARTUP)
    time.sleep(2.0)   # into the timed loop
    assert all(p.poll() is None for p in job.procs), "the job ended before the kill: make it longer"
    victims = _ranks_in(C.host_ns(cluster_name, 1))
    assert len(victims) == 2, victims
    victim_rank = _rank_of(victims[-1])
    os.kill(victims[-1], signal.SIGKILL)
    t0 = time.monotonic()
    codes = job.wait(RANK_TIMEOUT + 30)
    took = time.monotonic() - t0
    text = job.text()
    assert all(c != 0 for c in codes), (codes, text[-4000:])
    assert took < RANK_TIMEOUT + 10, (took, text[-4000:])   # within the ranks' own timeout
    if launcher == "torchrun":
        assert "Signal 9 (SIGKILL) received by PID" in text, text[-4000:]
    else:
        # mpirun names whichever failure it saw first: the kill, or a survivor's own error (the
        # survivor beside it on h1 sees the death through shared memory at once).
        assert (f"PID {victims[-1]} on node {C.host_ns(cluster_name, 1)} exited on signal 9" in text
                or f"peer rank {victim_rank} (pid {victims[-1]}) died" in text), text[-4000:]
    # A survivor that saw the death through shared memory names the dead rank by its rank in
    # the job (its index among h1's ranks once stood there instead).
    import re
    for named in re.findall(rf"peer rank (\d+) \(pid {victims[-1]}\) died", text):
        assert int(named) == victim_rank, text[-4000:]
    assert _gone(cluster_name, 15) == {}, "a rank or daemon outlived the job"


@pytest.mark.slow
@pytest.mark.timeout(STARTUP + 180)
def test_links_under_torchrun_names_the_slowed_host(cluster_name, tmp_path):
    """`wirespeed links` across 4 hosts, one torchrun agent and one rank on each, h2's link at a
    fifth of the others': the verdict names h2 and only it. Four hosts, not three: on three, half
    of all links touch the slow host and the median rule cannot single it out. gloo, the library
    most torchrun jobs use. (wirespeed's own backend once read a fifth of these links here: all 12
    streams per peer dropped 2 MiB messages in the shallow host queues; the stream probe at setup,
    hosts/probe.rs, now picks 4 and it names h2 too.)"""
    if (why := _why_not("torchrun")) is not None:
        pytest.skip(why)
    from wirespeed.netem import cluster as C
    hosts = ("h0", "h1", "h2", "h3")
    C.up(len(hosts), RATE, name=cluster_name, measure=False, host_rates={2: RATE // 5})
    port = _port(cluster_name)
    wargs = ["links", "--backend", "gloo", "--size", "2M", "-n", 2, "--lat-iters", 5,
             "--timeout", RANK_TIMEOUT, "--no-save"]
    job = Job(tmp_path, [_torchrun_running(cluster_name, port, h, len(hosts), 1, wargs)
                         for h in hosts])
    codes = job.wait(STARTUP + 120)
    assert codes == [0] * len(hosts), job.text()[-4000:]
    verdict = [line for line in job.text().splitlines() if line.startswith("slow: ")]
    assert len(verdict) == 1 and verdict[0].startswith("slow: h2 ("), job.text()[-3000:]
    assert not any(h in verdict[0] for h in ("h0", "h1", "h3")), verdict
    assert netns_processes(cluster_name) == {}


@pytest.mark.slow
@pytest.mark.timeout(STARTUP + 180)
def test_model_under_mpirun_across_hosts(capsys, cluster_name, tmp_path):
    """`wirespeed model` (resnet18's gradients, DDP's buckets) on 2 hosts x 2 ranks under mpirun:
    checked against the exact reference, one record per strategy, 4 ranks."""
    if (why := _why_not("mpirun")) is not None:
        pytest.skip(why)
    from wirespeed.netem import cluster as C
    C.up(2, RATE, name=cluster_name, measure=False)
    out = tmp_path / "model.jsonl"
    wargs = ["model", "--model", "resnet18", "--backend", "wirespeed", "-n", 2, "-w", 1,
             "--timeout", RANK_TIMEOUT, "--json", out]
    job = Job(tmp_path, [_mpirun_running(cluster_name, _hostfile(capsys, cluster_name, tmp_path),
                                         _port(cluster_name), wargs)])
    codes = job.wait(STARTUP + 120)
    assert codes == [0], job.text()[-4000:]
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert records and all(r["world_size"] == 4 and r["backend"] == "wirespeed" for r in records)
    assert all(r.get("wrong", 0) == 0 for r in records), records
    assert netns_processes(cluster_name) == {}
