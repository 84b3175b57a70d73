"""Hosts files, rank placement and per-host commands: pure parts, no root or processes needed."""
from __future__ import annotations

import shlex

import pytest

from wirespeed.errors import UsageError
from wirespeed.launch.hosts import HostEntry, parse_hosts, ranks_per_host


def test_hosts_file_forms():
    hosts = parse_hosts("# cluster\nnode01 slots=4\nnode02:2  # MPICH\n\nnode03\n"
                        "node04 slots=2 max_slots=8\nnetns:wsnet-ws-h0 slots=3\n")
    assert hosts == [HostEntry("node01", 4), HostEntry("node02", 2), HostEntry("node03", None),
                     HostEntry("node04", 2), HostEntry("wsnet-ws-h0", 3, netns=True)]
    assert ranks_per_host(hosts, None) == [4, 2, 1, 2, 3]
    assert ranks_per_host(hosts, 2) == [2] * 5


@pytest.mark.parametrize("text, needle", [
    ("", "no hosts"), ("a slots=x\n", "cannot read"), ("a\na\n", "twice"), ("a:2 slots=3\n", "twice"),
    ("a slots=0\n", "at least 1"), ("bad/host\n", "not a host name"), ("netns:\n", "not a host name"),
])
def test_hosts_file_errors_name_the_line(text, needle):
    with pytest.raises(UsageError, match=needle):
        parse_hosts(text, "h.txt")


def test_placement_round_robin_and_blocks():
    from wirespeed.launch.cluster import placement
    assert placement(5, 2, None) == [0, 1, 0, 1, 0]
    assert placement(4, 3, 2) == [0, 0, 1, 1]
    with pytest.raises(UsageError, match="do not fit"):
        placement(7, 3, 2)


def test_ssh_plan_gives_every_rank_torchrun_env():
    from wirespeed.launch.remote import plan
    hosts = [HostEntry("node01", 2), HostEntry("node02", 2)]
    ranks = plan(hosts, [2, 2], ["wirespeed", "bench", "-e", "64M"], ifname="eth1",
                 exports=("FOO",), environ={"FOO": "a b"}, ssh="ssh -p 2222", workdir="/data/run")
    assert [r.host for r in ranks] == ["node01", "node01", "node02", "node02"]
    r3 = ranks[3].argv
    assert r3[:4] == ["ssh", "-p", "2222", "node02"]
    remote = shlex.split(r3[4])
    assert remote[:4] == ["cd", "/data/run", "&&", "exec"]
    env = dict(a.split("=", 1) for a in remote[5:] if "=" in a and not a.startswith("-"))
    assert env["RANK"] == "3" and env["WORLD_SIZE"] == "4" and env["LOCAL_RANK"] == "1"
    assert env["LOCAL_WORLD_SIZE"] == "2" and env["MASTER_ADDR"] == "node01"
    assert env["MASTER_PORT"] == "29500" and env["GLOO_SOCKET_IFNAME"] == "eth1"
    assert env["OMPI_MCA_btl_tcp_if_include"] == "eth1" and env["FOO"] == "a b"
    assert remote[-4:] == ["wirespeed", "bench", "-e", "64M"]
    assert not any(k.startswith("_WIRESPEED") for k in env)


def test_ssh_plan_from_an_emulated_host_hands_on_the_link_rates():
    from wirespeed.launch.remote import plan
    ranks = plan([HostEntry("wsnet-a-h1", 1)], [1], ["wirespeed", "bench"],
                 environ={"_WIRESPEED_CLUSTER": "a", "_WIRESPEED_LINK_RATE_BPS": "400000000"})
    remote = shlex.split(ranks[0].argv[-1])
    assert "_WIRESPEED_CLUSTER=a" in remote and "_WIRESPEED_LINK_RATE_BPS=400000000" in remote


def test_launch_dry_run_prints_commands_and_bad_input_is_one_line(capsys, tmp_path):
    from netem_util import run_here
    hosts = tmp_path / "hosts"
    hosts.write_text("node01 slots=2\nnode02\n")
    code, out, err = run_here(capsys, "launch", "--hosts", hosts, "--dry-run", "--master-addr", "10.0.0.1",
                              "--", "wirespeed", "bench", "-e", "1M")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "# rank 0 on node01" and lines[4] == "# rank 2 on node02"
    assert "WORLD_SIZE=3" in lines[5] and "MASTER_ADDR=10.0.0.1" in lines[5]
    assert "WIRESPEED_JOB_SECRET" not in out and "carry no WIRESPEED_JOB_SECRET" in err  # never a value
    for args, needle in (((), "--hosts FILE is required"), (("--hosts", hosts), "no command"),
                         (("--hosts", tmp_path / "none", "--", "x"), "cannot read hosts file"),
                         (("--hosts", hosts, "--ssh", "ssh -o 'open", "--", "x"), "cannot be read"),
                         (("--hosts", hosts, "--ssh", " ", "--", "x"), "--ssh is empty")):
        code, _, err = run_here(capsys, "launch", *args)
        assert code == 2 and err.count("\n") == 1 and needle in err, err
