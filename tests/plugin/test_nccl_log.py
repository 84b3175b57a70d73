"""The --fast-net proof: NCCL's own log read for `Using network wirespeed` and `via NET/wirespeed`.

The log text here is written for the test in NCCL's format (init.cc's "Using network %s",
transport/net.cc's "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d..."), one case per
way a run can look right and not be: the socket fallback, one rank without the plugin, ranks
that never crossed a host, a log without INFO.
"""
import pytest
from wsutil import run_here

from wirespeed.nccl_log import fast_net_problem, read_net_use


def _rank(host, pid, net="wirespeed", via=("wirespeed",), peer=1):
    lines = [f"{host}:{pid}:{pid} [0] NCCL INFO NCCL_NET_PLUGIN set by environment to /x/libnccl-net-wirespeed.so",
             f"{host}:{pid}:{pid} [0] NCCL INFO NET/wirespeed : wirespeed-net 0.1.0 ready: WIRESPEED_NSTREAMS=12",
             f"{host}:{pid}:{pid} [0] NCCL INFO Using network {net}",
             f"{host}:{pid}:{pid} [0] NCCL INFO comm 0x55d0 rank 0 nRanks 2 nNodes 2 localRanks 1"]
    for v in via:
        kind = v if v in ("SHM", "P2P") else None
        for ch in range(2):
            tail = f"via {kind}/direct pointer" if kind else f"via NET/{v}/0"
            lines.append(f"{host}:{pid}:{pid + 9} [0] NCCL INFO Channel {ch:02d}/0 : 0[0] -> {peer}[0] [send] {tail}")
            lines.append(f"{host}:{pid}:{pid + 9} [0] NCCL INFO Channel {ch:02d}/0 : {peer}[0] -> 0[0] [receive] {tail}")
    return "\n".join(lines) + "\n"


GOOD = ("# wirespeed 0.1.0 bench: backend nccl, device cuda, 2 ranks\n"
        + _rank("wsnet-g-h0", 4242) + _rank("wsnet-g-h1", 4300) + "# Out of bounds values : 0 OK\n")


def test_a_run_through_the_plugin_passes():
    assert fast_net_problem(GOOD) is None
    assert fast_net_problem(GOOD, processes=2) is None
    use = read_net_use(GOOD)
    assert set(use.networks) == {("wsnet-g-h0", 4242), ("wsnet-g-h1", 4300)}
    assert use.connections == {"wirespeed": 8}


def test_a_proxied_connection_counts():
    pxn = _rank("n0", 10).replace("via NET/wirespeed/0", "via NET/wirespeed/0(1)/Shared")
    assert fast_net_problem(pxn) is None


def test_the_silent_socket_fallback_fails_naming_it():
    text = _rank("n0", 10, net="Socket", via=("Socket",)) + _rank("n1", 20, net="Socket", via=("Socket",))
    text += "n0:10:10 [0] NCCL INFO NET/Plugin: Could not find: /x/libnccl-net-wirespeed.so.\n"
    problem = fast_net_problem(text)
    assert "NCCL used network Socket, not wirespeed, in 2 of 2 processes" in problem
    assert "\n" not in problem


def test_one_rank_without_the_plugin_fails():
    text = _rank("n0", 10) + _rank("n1", 20, net="Socket", via=("Socket",))
    text += "n1:20:20 [0] NCCL WARN NET/Plugin: Failed to find ncclNetPlugin_v12 symbol.\n"
    problem = fast_net_problem(text)
    assert "in 1 of 2 processes (n1:20)" in problem and "ncclNetPlugin_v12" in problem


def test_no_info_lines_says_how_to_get_them():
    assert "NCCL_DEBUG=INFO" in fast_net_problem("# wirespeed bench ...\n#  Rank 0 on h0\n")


def test_ranks_on_one_host_never_used_the_network():
    text = _rank("n0", 10, via=("SHM",)) + _rank("n0", 11, via=("P2P",))
    problem = fast_net_problem(text)
    assert "no connection went through it" in problem and "different hosts" in problem


def test_a_missing_rank_log_is_named():
    assert "only 1 of 2 NCCL processes" in fast_net_problem(_rank("n0", 10), processes=2)


@pytest.mark.parametrize("text,code,says", [(GOOD, 0, "ok: NCCL used network wirespeed in all 2 processes"),
                                            (_rank("n0", 1, net="Socket", via=("Socket",)), 1, "FAILED")])
def test_plugin_check_command(capsys, tmp_path, text, code, says):
    log = tmp_path / "nccl.log"
    log.write_text(text)
    got, out, err = run_here(capsys, "plugin-check", log)
    assert got == code and says in out + err
    assert len((out + err).splitlines()) == 1


def test_plugin_check_bad_input_is_one_line(capsys, tmp_path):
    for args in ((tmp_path / "missing.log",), (tmp_path, "--ranks", "0")):
        code, out, err = run_here(capsys, "plugin-check", *args)
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err


def test_train_fast_net_needs_nccl_in_the_list(capsys):
    code, _, err = run_here(capsys, "train", "--model", "gpt", "--backend", "gloo", "--fast-net")
    assert code == 2 and "has no nccl" in err and err.count("\n") == 1, err


def test_gpu_check_script_parses_and_says_its_usage():
    import subprocess
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    p = subprocess.run(["bash", script], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "usage: benchmarks/gpu_check.sh DIR" in p.stderr


@pytest.mark.parametrize("version,multi_rank", [("2.30.7", True), ("2.31.0", True), ("3.0", True),
                                                ("2.29.7", False), ("2.28.9", False), ("2.3", False),
                                                ("unknown", False)])
def test_gpu_check_sets_multi_rank_gpu_enable_from_nccl_2_30(version, multi_rank):
    import subprocess
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.sh"
    p = subprocess.run(["bash", script, "--sharing", version], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.count("\n") == 1, p.stdout + p.stderr
    assert p.stdout.startswith(f"NCCL {version}: ")
    assert ("NCCL_MULTI_RANK_GPU_ENABLE=1;" in p.stdout) == multi_rank, p.stdout
    assert "as two hosts (emulated, else host ids)" in p.stdout


# --- bench --fast-net: each rank reads its own NCCL log after the run ---

class _TwoRanks:
    """A backend stand-in: this process is rank 0, the other rank's row is given."""

    def __init__(self, other):
        self.other = other

    def allgather_floats(self, values):
        return [list(values), list(self.other)]


def _own_log(tmp_path, text):
    import os
    import socket
    (tmp_path / f"nccl.{socket.gethostname().split('.')[0]}.{os.getpid()}.log").write_text(text)


@pytest.fixture
def fast_net(monkeypatch, tmp_path):
    from wirespeed.nccl_log import LOG_DIR_VAR
    monkeypatch.setenv(LOG_DIR_VAR, str(tmp_path))
    monkeypatch.setenv("NCCL_NET", "wirespeed")
    return tmp_path


def _unproven(other):
    from types import SimpleNamespace

    from wirespeed.bench.fastnet import fast_net_unproven
    return fast_net_unproven(_TwoRanks(other), SimpleNamespace(rank=0, world_size=2))


def test_bench_fast_net_passes_when_every_rank_used_the_plugin(fast_net, capsys):
    _own_log(fast_net, _rank("n0", 10))
    assert _unproven([0.0, 4.0]) is False
    assert "every rank took network wirespeed; 8 connection setups via NET/wirespeed" in capsys.readouterr().out


def test_bench_fast_net_fails_on_the_socket_fallback(fast_net, capsys):
    _own_log(fast_net, _rank("n0", 10, net="Socket", via=("Socket",)))
    assert _unproven([0.0, 0.0]) is True
    err = capsys.readouterr().err
    assert "rank 0: NCCL used network Socket, not wirespeed" in err
    assert "did not use the wirespeed plugin in rank 0:" in err


def test_bench_fast_net_fails_naming_another_rank(fast_net, capsys):
    _own_log(fast_net, _rank("n0", 10))
    assert _unproven([1.0, 0.0]) is True
    assert "in rank 1:" in capsys.readouterr().err


def test_bench_fast_net_fails_when_no_rank_crossed_a_host(fast_net, capsys):
    _own_log(fast_net, _rank("n0", 10, via=("SHM",)))
    assert _unproven([0.0, 0.0]) is True
    assert "no connection went through it" in capsys.readouterr().err


def test_bench_fast_net_fails_without_a_log(fast_net, capsys):
    assert _unproven([0.0, 3.0]) is True
    assert "NCCL wrote no log for this process" in capsys.readouterr().err


def test_one_rank_alone_has_nothing_to_prove(fast_net):
    from types import SimpleNamespace

    from wirespeed.bench.fastnet import fast_net_unproven
    assert fast_net_unproven(None, SimpleNamespace(rank=0, world_size=1)) is False


def test_bench_without_fast_net_checks_nothing(monkeypatch):
    from wirespeed.nccl_log import LOG_DIR_VAR
    monkeypatch.delenv(LOG_DIR_VAR, raising=False)
    assert _unproven([1.0, 0.0]) is False


def test_debug_env_leaves_the_users_own_log_settings():
    from wirespeed.nccl_log import LOG_DIR_VAR, debug_env
    env = debug_env({})
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert env["NCCL_DEBUG_FILE"] == env[LOG_DIR_VAR] + "/nccl.%h.%p.log"
    assert "NCCL_DEBUG" not in debug_env({"NCCL_DEBUG": "TRACE"})
    assert "NCCL_DEBUG_SUBSYS" not in debug_env({"NCCL_DEBUG_SUBSYS": "ALL"})
    assert debug_env({"NCCL_DEBUG_FILE": "/logs/x.%p"}) == {}      # the user's own file: plugin-check it
    assert debug_env({LOG_DIR_VAR: "/tmp/x"}) == {}                 # the launching process set them
