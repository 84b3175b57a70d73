"""The NCCL network plugin from the CLI: plugin-path, env, and --fast-net on launch and bench.
(The plugin's own behaviour is tested by `cargo test -p wirespeed-nccl`, which drives it between
two processes.)"""
from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from wsutil import wirespeed
from wirespeed.launch.hosts import HostEntry


@pytest.fixture(scope="module")
def plugin() -> Path:
    p = wirespeed("plugin-path")
    assert p.returncode == 0, f"`make plugin` (part of `make setup`) must have built it: {p.stderr}"
    path = Path(p.stdout.strip())
    assert path.is_absolute() and path.name == "libnccl-net-wirespeed.so" and path.is_file()
    return path


def test_plugin_path_is_the_library_nccl_can_load(plugin):
    syms = subprocess.run(["nm", "-D", "--defined-only", plugin], capture_output=True, text=True,
                          check=True).stdout
    for v in range(8, 13):
        assert f" ncclNetPlugin_v{v}" in syms
    # NCCL opens libnccl-net.so when NCCL_NET_PLUGIN is unset: the link sits beside it.
    assert (plugin.parent / "libnccl-net.so").resolve() == plugin.resolve()


@pytest.mark.timeout(60)
def test_plugin_path_when_missing_is_one_line_usage_error(tmp_path):
    p = wirespeed("plugin-path", env={"WIRESPEED_NCCL_PLUGIN": str(tmp_path / "nope.so")})
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "nope.so: no such file" in p.stderr


@pytest.mark.timeout(60)
def test_env_says_whether_the_plugin_is_built(plugin):
    text = wirespeed("env", check=True).stdout
    line = next(l for l in text.splitlines() if l.startswith("nccl-net"))
    assert f"built: {plugin}" in line
    rep = json.loads(wirespeed("env", "--json", check=True).stdout)
    assert rep["nccl_plugin"].startswith("built:")
    from wirespeed.netplugin import api_for_nccl, torch_nccl_version
    nv = torch_nccl_version()
    if nv:  # a CUDA build of torch knows its NCCL even without a GPU
        assert f"torch's NCCL {'.'.join(map(str, nv))} would load ncclNetPlugin_v{api_for_nccl(nv)}" in line


def test_nccl_versions_map_to_the_api_they_load():
    from wirespeed.netplugin import api_for_nccl
    assert api_for_nccl((2, 28, 9)) == 11  # PyTorch 2.11's NCCL
    assert api_for_nccl((2, 30, 3)) == 12
    assert api_for_nccl((2, 26, 2)) == 10 and api_for_nccl((2, 24, 3)) == 9
    assert api_for_nccl((2, 20, 3)) == 8 and api_for_nccl((2, 19, 3)) is None


@pytest.mark.timeout(60)
def test_bench_fast_net_needs_the_nccl_backend():
    p = wirespeed("bench", "--fast-net", "--backend", "gloo", "-N", "2", "-e", "1K")
    assert p.returncode == 2
    assert "--fast-net" in p.stderr and "--backend nccl" in p.stderr and "Traceback" not in p.stderr


def test_launch_plan_sets_the_plugin_for_every_rank(plugin):
    from wirespeed.launch.remote import plan
    from wirespeed.netplugin import fast_net_env
    fast = fast_net_env({"LD_LIBRARY_PATH": "/opt/cuda/lib"})
    assert fast == {"NCCL_NET_PLUGIN": str(plugin), "NCCL_NET": "wirespeed",
                    "LD_LIBRARY_PATH": f"{plugin.parent}:/opt/cuda/lib"}
    # netns hosts (the emulated cluster): literal variables.
    hosts = [HostEntry("wsnet-a-h0", 1, netns=True), HostEntry("wsnet-a-h1", 1, netns=True)]
    resolve = lambda ns: ({"wsnet-a-h0": "10.0.0.1", "wsnet-a-h1": "10.0.0.2"}[ns], "ws0",
                          ["ip", "netns", "exec", ns])
    for r in plan(hosts, [1, 1], ["python", "train.py"], resolve=resolve, master_port=1234,
                  fast_net=fast):
        assert f"NCCL_NET_PLUGIN={plugin}" in r.argv and "NCCL_NET=wirespeed" in r.argv
        assert f"LD_LIBRARY_PATH={plugin.parent}:/opt/cuda/lib" in r.argv
    # ssh hosts: the remote shell prepends the folder to its own library path.
    ranks = plan([HostEntry("node01", 2)], [2], ["python", "train.py"], fast_net=fast)
    for r in ranks:
        remote = r.argv[-1]
        assert f"NCCL_NET_PLUGIN={plugin}" in shlex.split(remote)
        assert (f'LD_LIBRARY_PATH={shlex.quote(str(plugin.parent))}"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"'
                in remote)
        # What the remote shell makes of it, with and without a library path of its own.
        env_part = remote.split(" exec env ", 1)[1].split(" python ", 1)[0]
        for before, after in (("", str(plugin.parent)), ("/usr/cuda", f"{plugin.parent}:/usr/cuda")):
            out = subprocess.run(["sh", "-c", f"export LD_LIBRARY_PATH={before}; exec env {env_part} "
                                  "sh -c 'echo $LD_LIBRARY_PATH'"], capture_output=True, text=True)
            assert out.stdout.strip() == after
    # Without the flag nothing changes.
    assert not any("NCCL_NET" in a for r in plan([HostEntry("node01", 1)], [1], ["x"]) for a in r.argv)


@pytest.mark.timeout(60)
def test_launch_fast_net_dry_run(plugin, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("node01\nnode02\n")
    p = wirespeed("launch", "--hosts", hosts, "--fast-net", "--dry-run", "--", "python", "train.py",
                  check=True)
    cmds = [l for l in p.stdout.splitlines() if not l.startswith("#")]
    assert len(cmds) == 2 and all(f"NCCL_NET_PLUGIN={plugin}" in c and "NCCL_NET=wirespeed" in c
                                  for c in cmds)
