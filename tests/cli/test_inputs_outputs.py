"""Inputs and outputs checked once, for every command (issue 27, items 3, 4, 5 and 8).

Every command that reads records (predict --from/--against, compare --from, plot) is run with
every record kind wirespeed writes (made by the real writer, report.records.record), with mixes,
and with malformed files (NaN, infinity, nested, truncated, empty, binary, a huge line); every
command is run with every output it declares pointed somewhere unwritable. Each either works,
saying what it skipped, or is refused in one line with exit 2: never a traceback, never a
finished run whose results are lost. The probes of the issue that end in a refusal are here too.

The CLI runs in this process: nothing here starts a rank (a regression that did would show as a
missing refusal, or hit the timeout)."""
from __future__ import annotations

import json
import math
import os
import time

import pytest

from wsutil import run_here
from wirespeed.cli.main import build_parser, check_outputs_here
from wirespeed.report.records import KINDS, MAX_LINE, record

pytestmark = pytest.mark.timeout(120)


def run(capsys, *args) -> tuple[int, str, str]:
    """`wirespeed ARGS` in this process: (exit status, stdout, stderr), never a traceback."""
    code, out, err = run_here(capsys, *args)
    assert "Traceback" not in err, err
    return code, out, err


def refused(capsys, *args) -> str:
    """Assert `wirespeed ARGS` is refused in one line with exit 2; return the line."""
    code, out, err = run(capsys, *args)
    assert code == 2, (args, code, out, err)
    assert err.count("\n") == 1 and err.startswith("wirespeed: error: "), err
    return err


# ---- records of every kind, written by the real writer --------------------------------------

def bench(world=2, nbytes=1 << 20, t=None, **extra) -> dict:
    # One host (env.hosts), timed as the model would: a fit on these is exact.
    t = 20.0 + nbytes * 1e-4 if t is None else t
    return record("bench", {"run_id": "r1", "collective": "all_reduce", "backend": "gloo",
                            "dtype": "float32", "op": "sum", "device": "cpu", "world_size": world,
                            "root": -1, "bytes": nbytes, "count": nbytes // 4, "inplace": True,
                            "time_us": t, "algbw_gbps": 1.0, "busbw_gbps": 1.0, "wrong": 0,
                            "env": {"hosts": ["a"] * world}, **extra})


OTHERS = {
    "model": {"model": "resnet18", "strategy": "allreduce", "backend": "gloo", "world_size": 2,
              "time_us": 4000.0, "total_bytes": 46758048},
    "batching": {"backend": "gloo", "world_size": 2, "total_bytes": 65536, "chunks": 4,
                 "time_us": 900.0},
    "objects": {"backend": "gloo", "world_size": 2, "method": "all_reduce", "time_us": 80.0},
    "tune": {"backend": "wirespeed", "knobs": ["WIRESPEED_ALGO"], "setting": {"WIRESPEED_ALGO": "rsag"},
             "min_bytes": 4096, "max_bytes": 65536, "gain": 1.3},
    "links": {"backend": "gloo", "world_size": 2, "src": 0, "dst": 1, "bytes": 1 << 24, "gbps": 2.5,
              "latency_us": 50.0},
    "train": {"backend": "gloo", "world_size": 2, "model": "resnet18", "parallel": "ddp",
              "samples_per_s": 120.0, "step_us": 130000.0, "compute_us": 90000.0,
              "exposed_pct": 30.8, "bytes_per_step": 46758048, "state_digest": "fbc41a0cfb13"},
}


def write(path, records) -> str:
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return str(path)


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    """A file per record kind, and a mix of every kind."""
    benches = [bench(nbytes=s) for s in (1 << 16, 1 << 20, 1 << 22)]
    out = {"bench": write(tmp_path / "bench.jsonl", benches)}
    for kind, fields in OTHERS.items():
        out[kind] = write(tmp_path / f"{kind}.jsonl", [record(kind, fields)])
    out["mixed"] = write(tmp_path / "mixed.jsonl",
                         [*benches, *(record(k, f) for k, f in OTHERS.items())])
    return out


def test_every_kind_wirespeed_writes_is_known_to_the_reader_and_covered_here():
    assert {k for k, _ in KINDS.values()} == {"bench", *OTHERS}


# What each command reads, and its command line for a records file.
# (kinds it uses, its command line for a records file f, a temporary directory and a good bench
# file to fit on, which --against needs besides f).
READERS = {
    "predict": (("bench",), lambda f, tmp, fit: ["predict", "--from", f, "--nprocs", 4,
                                                 "--ranks-per-host", 4]),
    "predict --against": (("bench",), lambda f, tmp, fit: ["predict", "--from", fit, "--against", f]),
    "compare": (("bench",), lambda f, tmp, fit: ["compare", "--from", f, "--plot-dir", tmp / "cmp"]),
    "plot": (("bench", "model", "batching", "objects"), lambda f, tmp, fit: ["plot", f, "-o", tmp / "p.png"]),
}


@pytest.mark.parametrize("kind", ["bench", *OTHERS])
@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_with_every_record_kind(capsys, tmp_path, files, reader, kind):
    uses, argv = READERS[reader]
    args = argv(files[kind], tmp_path, files["bench"])
    if kind in uses:
        code, out, err = run(capsys, *args)
        assert code == 0, (args, out, err)
        assert "skipped" not in out
    else:
        err = refused(capsys, *args)
        # Names the file, what it holds and what the command reads.
        assert files[kind] in err and f"1 {kind}" in err and f"give a file of {uses[0]}" in err, err


@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_with_every_kind_mixed_uses_its_own_and_counts_the_rest(capsys, tmp_path, files,
                                                                             reader):
    uses, argv = READERS[reader]
    code, out, err = run(capsys, *argv(files["mixed"], tmp_path, files["bench"]))
    assert code == 0, (out, err)
    skipped = [k for k in OTHERS if k not in uses]
    line = next(ln for ln in out.splitlines() if ln.startswith("# skipped"))
    assert line.startswith(f"# skipped {len(skipped)} records"), line
    for k in skipped:
        assert f"1 {k}" in line, line


def _malformed(tmp_path) -> dict[str, str]:
    good = json.dumps(bench())
    nan = json.dumps(bench(t=math.nan))          # json writes NaN: what a broken timer leaves
    inf = json.dumps(bench(t=math.inf))
    raw = {"nan": nan, "inf": inf, "negative": json.dumps(bench(t=-5.0)),
           "nested": '{"a": ' * 100_000 + "1" + "}" * 100_000, "nested_list": "[" * 100_000 + "]" * 100_000,
           "truncated": good[:80], "text": "hello", "list": "[1, 2]",
           "string_bytes": json.dumps({**bench(), "bytes": "many"}),
           "bad_env": json.dumps({**bench(), "env": 5}), "missing": json.dumps({"schema": "wirespeed.bench/1"})}
    out = {k: write(tmp_path / f"{k}.jsonl", []) for k in raw}
    for k, line in raw.items():
        with open(out[k], "w") as f:
            f.write(line + ("\n" if k != "truncated" else ""))
    out["empty"] = write(tmp_path / "empty.jsonl", [])
    with open(tmp_path / "binary.jsonl", "wb") as f:
        f.write(b"\xff\xfe\x00\x81garbage\n")
    out["binary"] = str(tmp_path / "binary.jsonl")
    with open(tmp_path / "huge.jsonl", "w") as f:
        f.write('{"x": "' + "a" * (MAX_LINE + 10) + '"}\n')
    out["huge"] = str(tmp_path / "huge.jsonl")
    return out


MALFORMED = ["nan", "inf", "negative", "nested", "nested_list", "truncated", "text", "list",
             "string_bytes", "bad_env", "missing", "empty", "binary", "huge"]
WHY = {"nan": "non-finite time_us", "inf": "non-finite time_us", "negative": "negative time_us",
       "nested": "nested too deep", "nested_list": "nested too deep", "truncated": "not a JSON line",
       "text": "not a JSON line", "list": "not a record", "string_bytes": "non-numeric bytes",
       "bad_env": "non-dict env", "missing": "lacks collective", "empty": "it is empty",
       "binary": "not a text file", "huge": f"a line over {MAX_LINE >> 20} MiB"}


@pytest.mark.parametrize("reader", list(READERS))
def test_malformed_records_alone_are_refused_in_one_line(capsys, tmp_path, files, reader):
    bad = _malformed(tmp_path)
    _, argv = READERS[reader]
    for name in MALFORMED:
        err = refused(capsys, *argv(bad[name], tmp_path, files["bench"]))
        assert WHY[name] in err, (name, err)


@pytest.mark.parametrize("reader", list(READERS))
def test_malformed_lines_among_good_ones_are_skipped_and_counted(capsys, tmp_path, files, reader):
    bad = _malformed(tmp_path)
    mixed = tmp_path / "some_bad.jsonl"
    with open(mixed, "wb") as out:
        for s in (1 << 16, 1 << 20, 1 << 22):
            out.write((json.dumps(bench(nbytes=s)) + "\n").encode())
        for name in ("nan", "inf", "nested", "huge", "binary", "text"):
            with open(bad[name], "rb") as f:
                out.write(f.read())
        with open(bad["truncated"], "rb") as f:   # a run killed while writing: its last line
            out.write(f.read())
    _, argv = READERS[reader]
    code, out, err = run(capsys, *argv(str(mixed), tmp_path, files["bench"]))
    assert code == 0, (out, err)
    assert f"# skipped 7 records {reader.split()[0]} does not use: 7 malformed; the first malformed: " \
           f"{mixed}:4: bench record has non-finite time_us" in out, out


def test_predict_fits_only_finite_times(capsys, tmp_path):
    # A NaN time in the fit would make every parameter, and every prediction, NaN.
    nan = write(tmp_path / "n.jsonl", [bench(nbytes=s) for s in (1 << 16, 1 << 20, 1 << 22)]
                + [bench(nbytes=1 << 18, t=math.nan)])
    code, out, _ = run(capsys, "predict", "--from", nan, "--nprocs", 4, "--ranks-per-host", 4,
                       "--json", tmp_path / "p.jsonl")
    fitted = [ln for ln in out.splitlines() if not ln.startswith(("# wirespeed predict", "# skipped"))]
    assert code == 0 and "nan" not in "\n".join(fitted).lower(), out
    assert all(math.isfinite(json.loads(ln)["time_us"]) for ln in open(tmp_path / "p.jsonl"))


# ---- outputs ---------------------------------------------------------------------------------

def declared_outputs() -> list[tuple[str, str, str]]:
    """(command, flag, file or dir) for every output every command declares."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    out = []
    for name, p in sub.choices.items():
        for flag, _, what, _ in p.get_default("_outputs") or ():
            out.append((name, flag, what))
    return out


# The least command line that parses, per command with outputs (the check runs before the work).
MINIMAL = {"predict": ["--from", "x.jsonl", "--nprocs", "4"], "plot": ["x.jsonl"]}
OUTPUT_DESTS = {"json", "csv", "plot", "save_dir", "plot_dir", "output"}


def test_every_output_flag_of_every_command_is_declared_as_one():
    # A new command's --json or --save-dir declared with plain `add` would skip the check.
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    declared = {(c, f) for c, f, _ in declared_outputs()}
    for name, p in sub.choices.items():
        for a in p._actions:
            if a.dest in OUTPUT_DESTS and a.nargs != 0 and a.option_strings:
                assert (name, a.option_strings[0]) in declared, (name, a.option_strings)
    assert {c for c, _ in declared} >= {"bench", "links", "model", "batching", "objects", "compare",
                                        "tune", "predict", "plot", "train"}


@pytest.mark.parametrize("cmd,flag,what", declared_outputs())
@pytest.mark.parametrize("where", ["proc", "directory_or_file"])
def test_every_declared_output_is_checked_before_any_work(capsys, tmp_path, cmd, flag, what, where):
    if where == "proc":
        path, why = ("/proc/x.jsonl", "cannot write there") if what == "file" else \
            ("/proc/x", "cannot create directory")
    else:  # a directory where a file goes; a file where a directory goes
        path, why = (str(tmp_path), "is a directory") if what == "file" else ("/etc/hostname", "is a file")
    before = set(os.listdir(tmp_path))
    t0 = time.monotonic()
    err = refused(capsys, cmd, *MINIMAL.get(cmd, []), flag, path)
    assert f"{flag} {path}" in err and why in err, err
    assert time.monotonic() - t0 < 10  # before any work (tune's sweep took 70 s, then died)
    assert set(os.listdir(tmp_path)) == before  # the probe leaves nothing


def test_a_writable_output_passes_and_the_probe_leaves_nothing(capsys, tmp_path, files):
    target = tmp_path / "new" / "deeper" / "p.jsonl"
    code, _, err = run(capsys, "predict", "--from", files["bench"], "--nprocs", 4, "--ranks-per-host", 4,
                       "--json", target, "--plot", tmp_path / "p.png")
    assert code == 0, err
    assert target.exists() and (tmp_path / "p.png").stat().st_size > 0


def test_unused_outputs_are_not_checked(capsys, tmp_path, files):
    # compare --from writes no --json and no run directory: an unwritable default must not matter.
    code, _, err = run(capsys, "compare", "--from", files["bench"], "--plot-dir", tmp_path / "c",
                       "--json", "/proc/x", "--save-dir", "/proc/x")
    assert code == 0, err


def test_only_the_writing_rank_of_an_outer_launcher_checks(monkeypatch):
    from wirespeed.errors import UsageError
    args = build_parser().parse_args(["bench", "--json", "/proc/x"])
    for k in ("RANK", "WORLD_SIZE", "_WIRESPEED_LOCAL_SPAWN", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(UsageError):
        check_outputs_here(args)                      # the user's shell
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(UsageError):
        check_outputs_here(args)                      # rank 0 under torchrun: it writes
    monkeypatch.setenv("RANK", "1")
    check_outputs_here(args)                          # other ranks write nothing
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("_WIRESPEED_LOCAL_SPAWN", "1")
    check_outputs_here(args)                          # our spawn: the shell checked already


# ---- the other probes of items 3, 4, 5 and 8 ------------------------------------------------

def test_predict_refuses_unbounded_what_ifs_and_computes_large_ones(capsys, tmp_path, files):
    err = refused(capsys, "predict", "--from", files["bench"], "--nprocs", 1_000_000, "--ranks-per-host", 1000)
    assert "262144 ranks or fewer" in err
    # Refused before the layouts are built (on 482a6d1 a billion ranks built a 3.7 GB layout,
    # then a MemoryError traceback), by host count too.
    import tracemalloc
    tracemalloc.start()
    for flags in (["--nprocs", 1_000_000_000], ["--hosts", 10 ** 12, "--ranks-per-host", 8]):
        err = refused(capsys, "predict", "--from", files["bench"], *flags)
        assert "ranks or fewer" in err
    assert tracemalloc.get_traced_memory()[1] < 50e6
    tracemalloc.stop()
    err = refused(capsys, "predict", "--from", files["bench"], "--nprocs", 200_000, "--ranks-per-host", 1000,
                  "--sizes", ",".join(f"{k}K" for k in range(1, 40)))
    assert "give fewer --sizes or ranks" in err
    t0 = time.monotonic()
    code, out, err = run(capsys, "predict", "--from", files["bench"], "--nprocs", 80_000,
                         "--ranks-per-host", 80_000)
    assert code == 0 and "80000" in out, err
    assert time.monotonic() - t0 < 30


def test_predict_refuses_a_meaningless_fit(capsys, tmp_path):
    # Times that do not grow with size: the fit's per-byte cost is 0 ("inf GB/s") and its error huge.
    junk = write(tmp_path / "junk.jsonl", [bench(nbytes=s, t=t) for s, t in
                                           ((1 << 12, 9000.0), (1 << 16, 500.0), (1 << 20, 8000.0),
                                            (1 << 24, 700.0))])
    err = refused(capsys, "predict", "--from", junk, "--nprocs", 4, "--ranks-per-host", 4)
    assert "no meaningful fit" in err and "rms fit error" in err, err
    # Beside a good series, it is listed as not predicted; the good one is.
    good = [bench(nbytes=s, backend="wirespeed") for s in (1 << 16, 1 << 20, 1 << 22)]
    both = write(tmp_path / "both.jsonl", [*map(json.loads, open(junk)), *good])
    code, out, err = run(capsys, "predict", "--from", both, "--nprocs", 4, "--ranks-per-host", 4)
    assert code == 0, err
    assert "# not predicted: all_reduce | gloo" in out and "| wirespeed |" in out


def test_links_by_host_on_one_machine_is_refused(capsys):
    assert "--by host times pairs of hosts" in refused(capsys, "links", "-N", 2, "--by", "host",
                                                        "--no-save")


@pytest.mark.parametrize("args,needle", [
    (["-d", "int8", "-o", "avg", "--backend", "gloo", "-N", "2"], "int8 avg: gloo: no integer avg"),
    (["-c", "send_recv", "-N", "1", "--backend", "gloo"], "send_recv float32: n/a (needs 2 ranks)"),
])
def test_bench_that_can_run_nothing_is_refused(capsys, args, needle):
    err = refused(capsys, "bench", "--no-save", "-b", "8", "-e", "8", *args)
    assert "nothing to run" in err and needle in err, err


def test_bench_that_can_run_something_still_runs_it(capsys):
    # int8 avg cannot run on gloo, float32 avg can: the table shows both, no refusal.
    from wirespeed.bench.harness import check_something_runs
    from wirespeed.backends import create
    from wirespeed.cli.bench import config_from_args
    args = build_parser().parse_args(["bench", "--backend", "gloo", "-N", "2", "-d", "int8,float32",
                                      "-o", "avg", "-b", "8", "-e", "8"])
    cfg = config_from_args(args)
    check_something_runs(cfg, create("gloo", "cpu"), 2, "cpu")  # no error


def test_compare_from_an_empty_file_is_refused(capsys, tmp_path):
    empty = write(tmp_path / "e.jsonl", [])
    assert "it is empty" in refused(capsys, "compare", "--from", empty)


def test_cluster_hostfile_slots_0_is_refused(capsys):
    assert "--slots must be at least 1" in refused(capsys, "cluster", "hostfile", "--slots", 0)


@pytest.mark.parametrize("cmd", [["compare", "--nprocs", "2,1000", "--backends", "gloo", "--devices", "cpu"],
                                 ["tune", "-N", "1000"]])
def test_compare_and_tune_check_every_run_before_the_first(capsys, cmd):
    t0 = time.monotonic()
    code, out, err = run(capsys, *cmd, "--no-save")
    assert code == 2 and "1000 ranks on this host need" in err and err.count("\n") == 1, err
    assert "[  1/" not in out and time.monotonic() - t0 < 10  # no combination ran
