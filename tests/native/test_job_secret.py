"""The job secret at the handshake (issue 27), end to end with real processes on two host ids
(so they connect over TCP): ranks that share WIRESPEED_JOB_SECRET join; a rank whose secret
differs, or that has none, is refused on both sides with a line that names the variable, within
the timeout. The handshake's own tests (crates/wirespeed-core, transport/tcp/tests.rs) dial with
the right key but no secret, many times, before and after the real rank joined.
"""
from __future__ import annotations

import os
import time

import pytest

from .ranks import master_store, start_rendezvous_rank

def _run(port: int, secrets: list[str | None], timeout_s: float = 8) -> list[str]:
    procs = []
    for rank, secret in enumerate(secrets):
        env = {k: v for k, v in os.environ.items() if k != "WIRESPEED_JOB_SECRET"}
        env.update(WIRESPEED_HOSTID=f"host-{rank}", WIRESPEED_IFNAME="lo")
        if secret is not None:
            env["WIRESPEED_JOB_SECRET"] = secret
        procs.append(start_rendezvous_rank(rank, port, timeout_s, env))
    return [p.communicate(timeout=90)[0].strip() for p in procs]


@pytest.mark.timeout(120)
def test_ranks_sharing_the_secret_join():
    store = master_store()
    assert _run(store.port, ["s3cret", "s3cret"]) == ["joined", "joined"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("other", ["another", None])
def test_a_rank_without_the_jobs_secret_is_refused_on_both_sides_at_once(other):
    # Issue 36: only the dialer (told nothing but a closed connection) knew, after its timeout; the
    # listener waited its own out. Now the listener tells the dialer why (a refusal frame) and
    # fails its own wait on that rank: both name the secret, in one line, long before the timeout.
    store = master_store()
    t0 = time.monotonic()
    outs = _run(store.port, ["s3cret", other], timeout_s=60)
    took = time.monotonic() - t0
    # Each rank's last line other than the listener's log lines ("wirespeed: rank N refused a
    # connection ..."), which its reactor thread may print just after the rank's error line.
    last = [[ln for ln in o.splitlines() if not ln.startswith("wirespeed: ")][-1] for o in outs]
    for o, line in zip(outs, last):
        assert "Traceback" not in o and line.startswith("StrangerError"), outs
        assert "job secret is not this rank's" in line and "WIRESPEED_JOB_SECRET" in line, outs
        # Refusals are logged one line each: the dialer stops at the first, so a handful at most.
        assert len(o.splitlines()) < 10, o
    assert "rank 1: the listener at 127.0.0.1:" in last[0], last   # rank 0 dials rank 1
    assert last[1].startswith("StrangerError refused: rank 0: "), last
    # The listener's log line names the variable too: the secret is folded into the job token
    # (admission.py), so its log says the token differs, another job's or another (or no) secret's.
    assert "another or no WIRESPEED_JOB_SECRET" in outs[1], outs[1]
    assert took < 30, took   # torch's import included; the ranks' timeout is 60 s
