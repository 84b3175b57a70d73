"""DDP equality with gloo and the typed failures, in one launch of 4 real rank processes."""
import os

import pytest

from .ranks import run_ranks


def shm_names():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.timeout(300)
def test_ddp_equals_gloo_and_every_fault_raises_a_typed_error_in_time():
    before = shm_names()
    res = run_ranks("worker_faults.py", 4, timeout=280, may_die=frozenset({3}))
    for r in res:
        if r is not None:
            assert "crash" not in r, r["crash"]
    # DDP: same parameters after 6 steps (and training did move them).
    for r in res[:2]:
        assert r["ddp_equal"] and r["ddp_moved"], r
    for r in res[:3] + [res[3]] * (res[3] is not None):
        if r is None:
            continue
        for key in ("size_mismatch", "dtype_mismatch"):
            assert r[key][0] == "MismatchError", (key, r[key])
        assert "elements" in res[0]["size_mismatch"][1] and "float64" in res[0]["dtype_mismatch"][1]
        assert r["after_mismatch"] == [4.0] * 5
        assert r["dtype"][0] == "UnsupportedError" and "float8" in r["dtype"][1] and "int16" in r["dtype"][1]
        assert r["op"][0] == "UnsupportedError" and "band" in r["op"][1] and "integer" in r["op"][1]
    # Slow peer: the three punctual ranks time out after ~2 s; the late one is told they gave up.
    for r in res[:3]:
        kind, msg, secs = r["slow"]
        assert kind in ("CollectiveTimeout", "PeerAbortedError"), r["slow"]
        assert secs < 8, r["slow"]
        assert r["after_slow"][0] == "BrokenGroupError", r["after_slow"]
    # Killed peer: every survivor raises (dead or aborted peer), well within the 30 s timeout.
    assert res[3] is None, "rank 3 should have been killed"
    for r in res[:3]:
        kind, msg, secs = r["killed"]
        assert kind in ("PeerDiedError", "PeerAbortedError"), r["killed"]
        assert "rank" in msg and secs < 10, r["killed"]
    # Shared memory is anonymous (memfd): nothing is left in /dev/shm, even after a SIGKILL.
    assert not {n for n in shm_names() - before if "wirespeed" in n}
