"""Bad input found by probing as a user would (issue 16): each is refused in one line with exit 2
before any rank starts, never a hang, a traceback, or a finished sweep whose results are lost.

These run the CLI in this process (no rank is ever started, so nothing needs a subprocess); a
regression that did start ranks would show as a missing refusal, or hit the test's timeout."""
from __future__ import annotations

import os

import pytest

from wirespeed.cli.main import main

pytestmark = pytest.mark.timeout(60)


def refused(capsys, *args, env=None) -> str:
    """Run `wirespeed ARGS`; assert it exits 2 with one error line; return that line."""
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            main([str(a) for a in args])
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out, err = capsys.readouterr()
    assert e.value.code == 2, (args, e.value.code, out, err)
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("wirespeed: error: "), err
    assert "# wirespeed" not in out  # no rank ran (the header comes after rendezvous)
    return err


@pytest.mark.parametrize("cmd", [["bench", "-b", "8", "-e", "8"], ["objects", "-N", "2"],
                                 ["model", "--model", "resnet18"], ["links", "-N", "2"]])
@pytest.mark.parametrize("port", ["0", "70000", "-1"])
def test_master_port_out_of_range(capsys, cmd, port):
    # 0 used to hang (every rank looked for the rendezvous at port 0); 70000 was an OverflowError.
    err = refused(capsys, *cmd, "--master-port", port)
    assert "--master-port" in err


def test_master_port_from_the_launcher_environment(capsys):
    env = dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="70000")
    assert "MASTER_PORT='70000' is not a port" in refused(capsys, "bench", "-b", "8", "-e", "8", env=env)


@pytest.mark.parametrize("flag,path,why", [
    ("--json", "/tmp", "is a directory"),
    ("--json", "/proc/x", "cannot write there"),
    ("--csv", "/sys/x", "cannot write there"),
    ("--plot", "/proc/x.png", "cannot write there"),
    ("--save-dir", "/proc/runs", "cannot create directory"),
    ("--save-dir", "/etc/hostname", "is a file, not a directory"),
])
def test_bench_output_paths_are_checked_before_the_run(capsys, flag, path, why):
    err = refused(capsys, "bench", "-N", "2", "-b", "8", "-e", "8", flag, path)
    assert f"{flag} {path}" in err and why in err, err


def test_bench_output_check_leaves_nothing_behind(tmp_path, capsys):
    # A writable --json in a new directory passes the check; the probe removes what it made.
    target = tmp_path / "new" / "deeper" / "r.jsonl"
    err = refused(capsys, "bench", "-N", "2", "-r", "5", "-b", "8", "-e", "8", "--json", target)
    assert "--root 5" in err  # refused after the output check, which passed
    assert list(tmp_path.iterdir()) == []


def test_every_rank_spawning_command_refuses_too_many_ranks_with_one_message(capsys):
    # Up to " but": the memory available, said after it, changes from one call to the next.
    lines = {refused(capsys, *cmd).split(" but ")[0] for cmd in (
        ["bench", "-N", "1000", "-b", "8", "-e", "8"],
        ["objects", "-N", "2,1000"],
        ["model", "--model", "resnet18", "-N", "1000"],
        ["batching", "-N", "1000", "--total", "1M"],
        ["links", "-N", "1000"])}
    assert len(lines) == 1, lines
    assert "-N 1000: 1000 ranks on this host need" in lines.pop()


@pytest.mark.parametrize("args,needle", [
    (["--sizes", ""], "--sizes is empty"),
    (["--sizes", "4K", "-b", "1K"], "-b/--minbytes would be ignored"),
    (["--sizes", "4K", "-e", "1M"], "-e/--maxbytes would be ignored"),
    (["--sizes", "4K", "-f", "4"], "-f/--stepfactor would be ignored"),
    (["-f", "4", "-i", "1M"], "give one of them"),
    (["--ranks-per-host", "2"], "add --cluster"),
])
def test_flags_that_would_be_silently_ignored(capsys, args, needle):
    assert needle in refused(capsys, "bench", *args)


def test_a_flag_set_through_its_environment_twin_counts_as_given(capsys):
    err = refused(capsys, "bench", "--sizes", "4K", env={"WIRESPEED_MAXBYTES": "1M"})
    assert "-e/--maxbytes would be ignored" in err


def test_compare_refuses_ranks_per_host_without_cluster_and_bad_outputs(capsys):
    assert "add --cluster" in refused(capsys, "compare", "--ranks-per-host", "2")
    assert "--json /proc/x" in refused(capsys, "compare", "--json", "/proc/x")


@pytest.fixture
def bad_files(tmp_path):
    files = {"binary": b"\xff\xfe\x00\x81garbage\n", "list": b"[1, 2]\n", "text": b"hello\n",
             "numbers": b'{"collective": "all_reduce", "backend": "gloo", "dtype": "float32", '
                        b'"op": "sum", "device": "cpu", "world_size": 2, "bytes": "many", '
                        b'"count": 1, "inplace": true, "time_us": 1, "algbw_gbps": 1, '
                        b'"busbw_gbps": 1, "wrong": 0}\n'}
    paths = {}
    for name, data in files.items():
        paths[name] = tmp_path / f"{name}.jsonl"
        paths[name].write_bytes(data)
    return paths


@pytest.mark.parametrize("kind,needle", [("binary", "not a text file"), ("list", "not a record"),
                                         ("text", "not a JSON line"), ("numbers", "non-numeric bytes")])
def test_plot_and_compare_from_refuse_corrupt_records(capsys, tmp_path, bad_files, kind, needle):
    assert needle in refused(capsys, "plot", bad_files[kind], "-o", tmp_path / "p.png")
    assert needle in refused(capsys, "compare", "--from", bad_files[kind])


def test_plot_output_that_cannot_be_written(capsys, tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"collective": "all_reduce", "backend": "gloo", "dtype": "float32", "op": "sum", '
                    '"device": "cpu", "world_size": 2, "bytes": 64, "count": 16, "inplace": true, '
                    '"time_us": 10.0, "algbw_gbps": 0.0064, "busbw_gbps": 0.0064, "wrong": 0}\n')
    assert "-o /proc/x.png: cannot write there" in refused(capsys, "plot", good, "-o", "/proc/x.png")
    assert main(["plot", str(good), "-o", str(tmp_path / "ok.png")]) == 0  # the same records plot
    assert (tmp_path / "ok.png").stat().st_size > 0


@pytest.mark.parametrize("cmd", [["bench", "-N", "2", "--sizes", "4K", "-n", "2"], ["links", "-N", "2"]])
def test_an_open_file_limit_too_low_is_named_before_any_rank_starts(cmd):
    # On 482a6d1: gloo's "pipe: Too many open files", then torch's C++ stack from the other rank
    # (29 lines, exit 1); across emulated hosts, a link probe calling a host's link down.
    import resource
    import subprocess
    import sys

    def low():
        resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
    p = subprocess.run([sys.executable, "-m", "wirespeed.cli.main", *cmd], capture_output=True, text=True,
                       timeout=60, preexec_fn=low)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.count("\n") == 1 and "the open-file limit (ulimit -n) is 16" in p.stderr, p.stderr


def test_a_low_soft_open_file_limit_is_raised_to_what_a_command_needs():
    import resource
    import subprocess
    import sys

    def low():
        resource.setrlimit(resource.RLIMIT_NOFILE, (16, 4096))
    code = ("import resource; from wirespeed.limits import check_open_files, OPEN_FILES_MIN; "
            "check_open_files(); print(resource.getrlimit(resource.RLIMIT_NOFILE)[0] == OPEN_FILES_MIN)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=low)
    assert p.stdout.strip() == "True", (p.stdout, p.stderr)
