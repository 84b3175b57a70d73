"""Malformed or oversized MSCCL++ plans through the real CLI (issue 36, items 3 and 7): each is
refused in one line with exit 2, never a traceback, a hang or a read without end; `bench --plan`
refuses before any rank starts, and warns (and runs on) where `plan check` finds a race.

The plan commands run in a subprocess whose address space is capped (CAP_BYTES), so a regression
that reads /dev/zero or allocates for a huge plan fails here instead of taking the machine."""
from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys

import pytest

from wsutil import ROOT, wirespeed

FIXTURES = ROOT / "tests" / "plans" / "fixtures"
CAP_BYTES = 4 << 30

pytestmark = pytest.mark.timeout(120)


def _cap():
    resource.setrlimit(resource.RLIMIT_AS, (CAP_BYTES, CAP_BYTES))


def capped(*args, timeout=60) -> subprocess.CompletedProcess:
    """`wirespeed ARGS` in a process of at most CAP_BYTES of memory."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.run([sys.executable, "-m", "wirespeed.cli.main", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT, preexec_fn=_cap)


def one_line_refusal(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr[-2000:]
    assert p.stderr.startswith("wirespeed: error: "), p.stderr
    return p.stderr.strip()


def fixture(name="allreduce_rsag_2r") -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def write(tmp_path, obj, name="plan.json"):
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return path


def test_a_binary_file_is_not_utf8_text(tmp_path):
    path = tmp_path / "plan.json"
    path.write_bytes(b"\xc1" + random.Random(36).randbytes(3000))
    assert "not UTF-8 text (byte 0xc1 at offset 0)" in one_line_refusal(capped("plan", "check", path))


def test_latin1_text_is_not_utf8(tmp_path):
    path = tmp_path / "plan.json"
    path.write_bytes(json.dumps(fixture()).replace('"allreduce_rsag_2r"', '"caf\xe9"').encode("latin-1"))
    assert "not UTF-8 text (byte 0xe9" in one_line_refusal(capped("plan", "check", path))


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null"])
def test_a_device_is_refused_before_it_is_read(path):
    err = one_line_refusal(capped("plan", "check", path, timeout=30))
    assert f"{path}: not a regular file (a character device)" in err


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    assert "not a regular file (a FIFO)" in one_line_refusal(capped("plan", "check", fifo, timeout=30))


def test_a_directory_is_refused(tmp_path):
    assert "not a regular file (a directory)" in one_line_refusal(capped("plan", "check", tmp_path))


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path):
    from wirespeed.plans.format import MAX_PLAN_BYTES
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(MAX_PLAN_BYTES + 1)   # sparse: nothing written, nothing to read
    err = one_line_refusal(capped("plan", "check", path))
    assert f"more than {MAX_PLAN_BYTES} bytes" in err and "MAX_PLAN_BYTES" in err


@pytest.mark.parametrize("depth", [100_000, 40])
def test_deep_nesting_is_measured_not_recursed_into(tmp_path, depth):
    obj = fixture()
    obj["gpus"][0]["threadblocks"][0]["ops"][0]["channel_ids"] = "__DEEP__"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(obj).replace('"__DEEP__"', "[" * depth + "]" * depth))
    err = one_line_refusal(capped("plan", "check", path))
    assert f"nested {depth + 7} deep, more than the 32" in err


def test_a_number_of_thousands_of_digits(tmp_path):
    obj = fixture()
    obj["gpus"][0]["scratch_chunks"] = "__BIG__"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(obj).replace('"__BIG__"', "9" * 5000))
    assert "not JSON wirespeed reads" in one_line_refusal(capped("plan", "check", path))


def _empty_block(o):
    o["gpus"][0]["threadblocks"].append({"id": 1, "ops": [{"name": "nop"}]})
    del o["gpus"][0]["threadblocks"][1]["ops"][0]   # its one op deleted


def _semaphore(value):
    def mutate(o):
        o["gpus"][1]["semaphores"] = [{"init_value": value}]
    return mutate


def _ops(o, rank=1):
    return o["gpus"][rank]["threadblocks"][0]["ops"]


@pytest.mark.parametrize("mutate, says", [
    (lambda o: o["gpus"][1].update(channels=5), "gpus[1].channels: expected a list, got a number"),
    (lambda o: o["gpus"][1]["threadblocks"][0].update(channels=5),
     "gpus[1].threadblocks[0].channels: expected a list, got a number"),
    (lambda o: _ops(o)[0].update(channel_ids=None), "gpus[1].threadblocks[0].ops[0].channel_ids: expected a list, got null"),
    (lambda o: _ops(o)[3].update(src_buff=5), "gpus[1].threadblocks[0].ops[3].src_buff: expected a list, got a number"),
    (lambda o: _ops(o)[3].update(dst_buff={}), "gpus[1].threadblocks[0].ops[3].dst_buff: expected a list, got an object"),
    (lambda o: _ops(o)[3]["src_buff"][0].update(type=["i"]),
     "gpus[1].threadblocks[0].ops[3].src_buff[0].type: unknown buffer type a list of 1"),
    (lambda o: _ops(o)[3]["src_buff"][0].update(index=-1),
     "gpus[1].threadblocks[0].ops[3].src_buff[0].index: must be a whole number >= 0, got -1"),
    (lambda o: _ops(o)[5]["src_buff"][0].update(size=2),
     "gpus[1].threadblocks[0].ops[5]: rank 1, tb 0, op 5 (put): its buffers differ in size (2 source and 1 destination chunks)"),
    (lambda o: _ops(o)[8].update(channel_ids=[0, 0]),
     None),   # a wait for two signals where one comes: a deadlock the check names (below)
    (_empty_block, "gpus[0].threadblocks[1].ops: empty: a thread block needs at least one operation"),
    (_semaphore(2**64), "gpus[1].semaphores[0].init_value: 18446744073709551616 is more than 4294967295"),
    (_semaphore(-1), "gpus[1].semaphores[0].init_value: must be a whole number >= 0, got -1"),
    (lambda o: o["gpus"][1].update(scratch_chunks=2**64),
     "gpus[1].scratch_chunks: 18446744073709551616 is more than 1048576, the most wirespeed allows (MAX_CHUNKS)"),
    (lambda o: o.update(buffer_alignment=2**64), "buffer_alignment: 18446744073709551616 is more than 65536"),
    (lambda o: o.update(inplace="yes"), "inplace: expected true or false, got 'yes'"),
    (lambda o: o.update(gpus=[None, None]), "gpus[0]: expected an object, got null"),
])
def test_each_malformed_field_is_named_by_its_path(tmp_path, mutate, says):
    obj = fixture()
    mutate(obj)
    p = capped("plan", "check", write(tmp_path, obj))
    if says is None:
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stdout + p.stderr
        assert "error: deadlock: no thread block can move: rank 1, tb 0, op 8 (wait)" in p.stdout, p.stdout
        return
    err = one_line_refusal(p)
    assert f"plan.json: {says}" in err, err


def test_a_semaphore_at_two_to_the_32_minus_one_is_counted_not_made(tmp_path):
    """The largest allowed initial value: on 482a6d1 it made 2**32 tokens (a hang)."""
    obj = fixture()
    obj["gpus"][1]["semaphores"] = [{"init_value": 2**32 - 1}]
    _ops(obj).insert(0, {"name": "sem_acquire", "semaphore_ids": [0]})
    p = capped("plan", "check", write(tmp_path, obj), timeout=30)
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), p.stdout + p.stderr


def test_sizes_and_ranks_past_the_machine_are_refused_naming_the_limit(tmp_path):
    path = FIXTURES / "allreduce_rsag_2r.json"
    err = one_line_refusal(capped("plan", "check", path, "--size", "1T"))
    assert "needs about 16384.0 GiB of memory" in err and "of this machine's" in err and "MEMORY_SHARE" in err
    err = one_line_refusal(capped("plan", "check", path, "--runs", "100000000"))
    assert "more than the 1000000 a check runs (MAX_CHECK_STEPS)" in err
    err = one_line_refusal(capped("plan", "check", "wirespeed:allreduce-ring-port", "--ranks", "10000000"))
    assert "at most 128 ranks (MAX_BUILTIN_RANKS)" in err
    err = one_line_refusal(capped("plan", "simulate", path, "--sizes", "2T"))
    assert "the largest message wirespeed simulates (MAX_MESSAGE_BYTES)" in err


def test_a_twenty_thousand_rank_plan_is_refused_with_the_memory_it_needs(tmp_path):
    """Every rank copies its input into its output: small as a file (3 MB), but its check's vector
    clocks alone would take hundreds of GiB."""
    n = 20_000
    gpus = [{"id": r, "input_chunks": 1, "output_chunks": 1, "scratch_chunks": 0,
             "threadblocks": [{"id": 0, "ops": [{"name": "copy", "src_buff": [{"type": "i", "index": 0, "size": 1}],
                                                 "dst_buff": [{"type": "o", "index": 0, "size": 1}]}]}]}
            for r in range(n)]
    obj = {"name": "copy20k", "collective": "test", "protocol": "Simple", "gpus": gpus}
    err = one_line_refusal(capped("plan", "check", write(tmp_path, obj), timeout=90))
    assert "checking 20000 ranks at" in err and "GiB of memory" in err and "vector clocks of 120000 threads" in err


def test_plugin_check_refuses_dev_zero_and_reads_at_most_its_limit():
    err = one_line_refusal(capped("plugin-check", "/dev/zero", timeout=30))
    assert "NCCL log '/dev/zero': not a regular file (a character device)" in err
    with open("/dev/zero", "rb") as zero:
        p = subprocess.run([sys.executable, "-m", "wirespeed.cli.main", "plugin-check", "-"], stdin=zero,
                           capture_output=True, text=True, timeout=60, cwd=ROOT, preexec_fn=_cap)
    assert "more than 256 MiB, the most plugin-check reads (MAX_LOG_BYTES)" in one_line_refusal(p)


@pytest.mark.timeout(90)
def test_bench_refuses_a_binary_plan_before_any_rank_starts(tmp_path):
    path = tmp_path / "plan.json"
    path.write_bytes(b"\xc1" + random.Random(36).randbytes(3000))
    p = wirespeed("bench", "--plan", path, "--no-save", timeout=60)
    assert "not UTF-8 text" in one_line_refusal(p)
    assert "# wirespeed" not in p.stdout and "Rank" not in p.stdout


@pytest.mark.timeout(90)
def test_bench_refuses_a_malformed_plan_before_any_rank_starts(tmp_path):
    obj = fixture()
    _ops(obj)[3]["src_buff"] = 5
    p = wirespeed("bench", "--plan", write(tmp_path, obj), "--no-save", timeout=60)
    assert "gpus[1].threadblocks[0].ops[3].src_buff: expected a list" in one_line_refusal(p)
    assert "# wirespeed" not in p.stdout


@pytest.mark.timeout(150)
def test_bench_warns_once_on_a_plan_plan_check_calls_racy_and_runs_it(tmp_path):
    obj = fixture("allreduce_oneshot_2r")
    ops = obj["gpus"][0]["threadblocks"][0]["ops"]
    del ops[[o["name"] for o in ops].index("wait")]     # rank 0 reads its scratch unguarded
    path = write(tmp_path, obj)
    p = wirespeed("bench", "--plan", path, "-b", "1K", "-e", "1K", "-w", "1", "-n", "2", "--no-check",
                  "--no-save", "--no-progress", "-T", "30", timeout=120)
    warnings = [line for line in p.stderr.splitlines() if line.startswith("wirespeed: warning: ")]
    assert len(warnings) == 1, p.stderr
    assert (f"{path}: `wirespeed plan check` finds 1 race(s) in this plan, so its results may be wrong on "
            "some calls: race (read-after-write) in rank 0's memory") in warnings[0]
    assert p.returncode == 0, p.stdout + p.stderr          # the run went on
    assert "plan allreduce_oneshot_2r" in p.stdout and "1024" in p.stdout


@pytest.mark.timeout(150)
def test_bench_does_not_warn_on_a_right_plan(tmp_path):
    p = wirespeed("bench", "--plan", FIXTURES / "allreduce_oneshot_2r.json", "-b", "1K", "-e", "1K", "-w", "1",
                  "-n", "2", "--no-save", "--no-progress", "-T", "30", timeout=120)
    assert p.returncode == 0 and "warning" not in p.stderr, p.stdout + p.stderr


@pytest.mark.timeout(90)
def test_bench_refuses_a_size_whose_pipeline_unrolls_past_its_limit_before_any_rank_starts(tmp_path):
    obj = fixture("allreduce_oneshot_2r")
    for g in obj["gpus"]:   # the last op (the reduction) in a pipeline of 16-byte rounds
        ops = g["threadblocks"][0]["ops"]
        ops[-1] = {"name": "pipeline", "iter_context": {"unit_size": 16, "num_chunks": 1}, "ops": [ops[-1]]}
    path = write(tmp_path, obj)
    p = wirespeed("bench", "--plan", path, "-b", "1K", "-e", "64M", "--no-save", timeout=60)
    err = one_line_refusal(p)
    assert "at 8M the plan's pipelines unroll into 1048592 steps a call, more than the 1000000 wirespeed " \
           "runs (MAX_CALL_STEPS): use -e 4M" in err, err
    assert "# wirespeed" not in p.stdout
