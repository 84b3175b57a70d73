"""The job secret at the handshake (issue 27), end to end with real processes on two host ids
(so they connect over TCP): ranks that share WIRESPEED_JOB_SECRET join; a rank whose secret
differs, or that has none, is refused on both sides with a line that names the variable, within
the timeout. The handshake's own tests (crates/wirespeed-core, transport/tcp/tests.rs) dial with
the right key but no secret, many times, before and after the real rank joined.
"""
from __future__ import annotations

import os

import pytest

from .ranks import master_store, start_rendezvous_rank

def _run(port: int, secrets: list[str | None]) -> list[str]:
    procs = []
    for rank, secret in enumerate(secrets):
        env = {k: v for k, v in os.environ.items() if k != "WIRESPEED_JOB_SECRET"}
        env.update(WIRESPEED_HOSTID=f"host-{rank}", WIRESPEED_IFNAME="lo")
        if secret is not None:
            env["WIRESPEED_JOB_SECRET"] = secret
        procs.append(start_rendezvous_rank(rank, port, 8, env))
    return [p.communicate(timeout=60)[0].strip() for p in procs]


@pytest.mark.timeout(120)
def test_ranks_sharing_the_secret_join():
    store = master_store()
    assert _run(store.port, ["s3cret", "s3cret"]) == ["joined", "joined"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("other", ["another", None])
def test_a_rank_without_the_jobs_secret_is_refused_on_both_sides(other):
    store = master_store()
    outs = _run(store.port, ["s3cret", other])
    last = [o.splitlines()[-1] for o in outs]
    assert not any(line == "joined" for line in last), outs
    for o, line in zip(outs, last):
        assert "Traceback" not in o and line.split()[0] in ("StrangerError", "CollectiveTimeout"), outs
        # Refusals are logged one line each, and a refused dialer backs off: a handful, not
        # hundreds, in the 8 s.
        assert len(o.splitlines()) < 40, len(o.splitlines())
    # The dialer (rank 0 dials rank 1) names the secret as the likely cause.
    assert "secret" in last[0], last
    # The listener names the variable too: the secret is folded into the job token (admission.py),
    # so its log says the token differs, another job's or another (or no) secret's.
    assert "another or no WIRESPEED_JOB_SECRET" in outs[1], outs[1]
