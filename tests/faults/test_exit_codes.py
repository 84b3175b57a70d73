"""One exit status per kind of failure (errors.py, docs/failures.md), the same on every rank and for
the job whichever rank saw the fault first; a job short of ranks names them within the timeout."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from wirespeed.errors import (EXIT_FAILED, EXIT_MISMATCH, EXIT_PEER_LOST, EXIT_TIMEOUT, EXIT_USAGE,
                              PeerLost, PeerTimeout, RanksDisagree, UsageError, WirespeedError)
from wirespeed.faults import kind_of, rank_error

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_codes_are_distinct_and_documented():
    codes = [EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_PEER_LOST, EXIT_MISMATCH]
    assert len(set(codes)) == len(codes)
    doc = open(os.path.join(ROOT, "docs", "failures.md")).read()
    for code in codes:
        assert f"| {code} |" in doc, code


@pytest.mark.parametrize("message,kind", [
    ("[/x/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation", PeerTimeout),
    ("Read error [127.0.0.1]:7560: Connection reset by peer. This is typically caused by ...", PeerLost),
    ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1", PeerLost),
    ("The client socket has timed out after 3000ms while trying to connect to (h, 1).", PeerTimeout),
    ("Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?",
     PeerLost),
    ("result type Float can't be cast to the desired output type Char", WirespeedError),
])
def test_library_messages_become_their_kind(message, kind):
    e = rank_error(3, RuntimeError(message))
    assert type(e) is kind
    assert str(e).startswith("rank 3: ") and "unbound_buffer.cc" not in str(e)


def test_wirespeed_transport_errors_keep_the_first_ranks_kind():
    from wirespeed import _native as n
    assert kind_of(n.CollectiveTimeout("timed out after 2.0 s waiting for rank 1")) is PeerTimeout
    assert kind_of(n.PeerDiedError("peer rank 1 (pid 7) died")) is PeerLost
    assert kind_of(n.MismatchError("ranks disagree: rank 1 sends 40 bytes")) is RanksDisagree
    assert kind_of(n.UnsupportedError("wirespeed: x is not contiguous")) is UsageError
    # A rank that only heard of the fault through an abort reports what the first rank saw.
    assert kind_of(n.PeerAbortedError("peer rank 0 failed: timed out after 2.0 s waiting for rank 3")) is PeerTimeout
    assert kind_of(n.PeerAbortedError("peer rank 0 failed: ranks disagree: sizes")) is RanksDisagree
    assert kind_of(n.PeerAbortedError("peer rank 0 failed: peer rank 3 (pid 9) died")) is PeerLost
    # a rank that refused a peer of another job secret (StrangerError, status 1) tells the others
    assert kind_of(n.PeerAbortedError("peer rank 0 failed: refused: rank 2: its job secret is not this "
                                      "rank's")) is WirespeedError
    assert kind_of(n.PeerAbortedError("peer rank 1 failed: rank 0 could not connect to it: Connection "
                                      "refused (os error 111)")) is PeerLost
    assert kind_of(n.BrokenGroupError("the wirespeed group is broken by an earlier error (timed out after 2 s)")) is PeerTimeout


def test_a_transport_error_through_torch_futures_is_read_back_as_itself():
    # A failed Work's future fails in C++ through a raising `then` (native/work.py); torch wraps
    # the error once per callback level, hooks nesting it.
    wrap = "Got the following error when running the callback: "
    e = RuntimeError(wrap + "RuntimeError: " + wrap + "PeerAbortedError: peer rank 0 failed: timed out after 2 s"
                     "\n\nAt:\n  work.py(120): _reraise")
    assert str(rank_error(1, e)) == "rank 1: peer rank 0 failed: timed out after 2 s"
    assert type(rank_error(1, e)) is PeerTimeout
    assert str(rank_error(0, RuntimeError(wrap + "PeerDiedError: peer rank 1 (pid 7) died"))) == \
        "rank 0: peer rank 1 (pid 7) died"
    # any other callback's error stays the library error it was
    assert type(rank_error(0, RuntimeError(wrap + "ValueError: bad"))) is WirespeedError


def test_the_job_takes_the_first_faults_kind():
    from wirespeed.launch.local import job_status
    assert job_status([]) == 0
    # A killed rank (its signal) is a lost peer to the job, even if a survivor then timed out.
    assert job_status([(5, 1, -9), (9, 0, EXIT_TIMEOUT)]) == EXIT_PEER_LOST
    # A timeout first, then the peers that saw the timed-out rank leave: a timeout.
    assert job_status([(7, 0, EXIT_TIMEOUT), (8, 2, EXIT_PEER_LOST)]) == EXIT_TIMEOUT
    # Seen in the same poll: the cause, not its echo, whichever rank number it had.
    assert job_status([(7, 0, EXIT_PEER_LOST), (7, 2, EXIT_TIMEOUT)]) == EXIT_TIMEOUT
    assert job_status([(3, 1, EXIT_TIMEOUT), (3, 0, EXIT_MISMATCH)]) == EXIT_MISMATCH


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, *args) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WIRESPEED_", "OMPI_", "PMI_", "SLURM_"))}
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "wirespeed.cli.main", "bench", "-n", "1", "-w", "0",
                             "--no-save", "--no-progress", *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(200)
def test_missing_ranks_are_named_and_disagreeing_ranks_are_a_mismatch_on_every_rank():
    # Started as an outside launcher would (torchrun's variables), both jobs at once.
    short_port, odd_port = _free_port(), _free_port()
    short = [_rank(r, 3, short_port, "--sizes", "64", "-T", 4) for r in (0, 1)]  # rank 2 never starts
    odd = [_rank(r, 2, odd_port, "--sizes", "64" if r == 0 else "128", "-T", 60) for r in (0, 1)]
    t0 = time.monotonic()
    results = [p.communicate(timeout=180) + (p.returncode, time.monotonic() - t0) for p in short + odd]
    for r, (out, err, code, _) in enumerate(results[:2]):
        assert code == EXIT_TIMEOUT, (r, code, err)
        assert f"rank {r}: rank 2 never joined the job within 4 s (WORLD_SIZE=3" in err, err
        assert "Traceback" not in err and "socket.cpp" not in err, err  # no torch noise either
    for r, (out, err, code, _) in enumerate(results[2:]):
        assert code == EXIT_MISMATCH, (r, code, err)
        assert "rank 1 runs other bench settings than rank 0" in err and err.count("\n") == 1, err
