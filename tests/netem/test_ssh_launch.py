"""`wirespeed launch --hosts` over real ssh across the emulated cluster's hosts.

The fixture gives every host an sshd (its own scratch config, a throwaway ed25519 host key and
client key, root login by key only, port 22 in the host's own network namespace, so nothing
meets the machine's or another test's sshd) and removes it all afterwards. The launcher runs on
h0, as a user logged in to the first node would: the cluster's addresses exist only inside it.
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
from test_real_engines import RANK_TIMEOUT, RATE, STARTUP, _check_records, _table_names_every_rank

pytestmark = [pytest.mark.netns, needs_netns]

READY_S = 30
SSHD = "/usr/sbin/sshd"   # sshd refuses to start unless run by its absolute path


def _why_not() -> str | None:
    for t in ("nsenter", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(t) is None:
            return f"`{t}` is not installed"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not installed (apt-get install openssh-server)"
    return None


def _env() -> dict:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "_WIRESPEED_LOCAL_SPAWN")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SLURM_")}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


SSHD_CONFIG = """\
Port 22
HostKey {d}/host_key
AuthorizedKeysFile {d}/authorized_keys
PermitRootLogin yes
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
LogLevel ERROR
"""


@dataclass
class Sshd:
    name: str                  # the emulated cluster
    dir: str                   # keys, sshd_config
    hosts: list[str]           # the hosts' names, as ssh reaches them
    daemons: list = field(default_factory=list)

    @property
    def ssh(self) -> str:
        """The client command, for `wirespeed launch --ssh` (the host keys are throwaway ones)."""
        return (f"ssh -o BatchMode=yes -o ConnectTimeout=10 -o StrictHostKeyChecking=no "
                f"-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -i {self.dir}/key")

    def on(self, host: str, *cmd) -> list[str]:
        return cli("cluster", "exec", "--cluster", self.name, host, "--", *map(str, cmd))


@pytest.fixture
def sshd(cluster_name):  # noqa: F811 (the fixture imported above)
    if (why := _why_not()) is not None:
        pytest.skip(why)
    from wirespeed.netem import cluster as C
    c, _ = C.up(2, RATE, name=cluster_name, measure=False)
    s = Sshd(cluster_name, tempfile.mkdtemp(prefix="wsssh-"), [h.netns for h in c.hosts])
    try:
        for key in ("host_key", "key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "wirespeed-test",
                            "-f", os.path.join(s.dir, key)], check=True, timeout=30,
                           stdin=subprocess.DEVNULL)
        shutil.copy(os.path.join(s.dir, "key.pub"), os.path.join(s.dir, "authorized_keys"))
        with open(os.path.join(s.dir, "sshd_config"), "w") as f:
            f.write(SSHD_CONFIG.format(d=s.dir))
        # sshd's privilege separation directory; Debian's service creates it at boot.
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        log = open(os.path.join(s.dir, "sshd.log"), "w")
        for i in range(len(s.hosts)):
            s.daemons.append(subprocess.Popen(
                s.on(f"h{i}", SSHD, "-D", "-e", "-f", os.path.join(s.dir, "sshd_config")),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env()))
        log.close()
        # Ready when h0 reaches every host (itself included) by name.
        deadline = time.monotonic() + READY_S
        waiting = list(s.hosts)
        while waiting and time.monotonic() < deadline:
            if any(d.poll() is not None for d in s.daemons):
                break
            p = subprocess.run(s.on("h0", *s.ssh.split(), waiting[0], "hostname"),
                               capture_output=True, text=True, timeout=30, env=_env(),
                               stdin=subprocess.DEVNULL)
            if p.returncode == 0 and p.stdout.strip() == waiting[0]:
                waiting.pop(0)
            else:
                time.sleep(0.3)
        if waiting:
            with open(os.path.join(s.dir, "sshd.log")) as f:
                pytest.fail(f"sshd did not answer on {waiting} within {READY_S} s:\n{f.read()[-3000:]}")
        yield s
    finally:
        for d in s.daemons:
            if d.poll() is None:
                d.send_signal(signal.SIGTERM)
        for d in s.daemons:
            try:
                d.wait(timeout=10)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()
        shutil.rmtree(s.dir, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(READY_S + STARTUP + 120)
@pytest.mark.parametrize("backend", ["gloo", "wirespeed"])
def test_launch_over_ssh_across_hosts(sshd, tmp_path, backend):
    """2 hosts x 2 ranks, each rank one ssh session, checked."""
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"{h} slots=2\n" for h in sshd.hosts))
    out = tmp_path / "records.jsonl"
    # sshd hands a session a fresh environment: -x passes on PYTHONPATH, where the package is
    # not installed (the launcher hands on the emulated links' rates itself).
    exports = ["-x", "PYTHONPATH"] if os.environ.get("PYTHONPATH") else []
    launch = sshd.on("h0", sys.executable, "-m", "wirespeed.cli.main", "launch", "--hosts", hosts,
                     "--ifname", "ws0", "--ssh", sshd.ssh, *exports, "--",
                     sys.executable, "-m", "wirespeed.cli.main", "bench", "--backend", backend,
                     "--no-save", "--no-progress", "-w", 1, "--timeout", RANK_TIMEOUT,
                     "--sizes", "64K,1M", "-n", 5, "--json", out)
    p = subprocess.run(launch, capture_output=True, text=True, timeout=STARTUP, env=_env(),
                       cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    _check_records(out, backend, sshd.name)
    # The launcher numbers ranks host by host in file order.
    got = json.loads(out.read_text().splitlines()[0])["env"]["hosts"]
    assert got == [sshd.hosts[0]] * 2 + [sshd.hosts[1]] * 2, got
    _table_names_every_rank(p.stdout, sshd.name)
