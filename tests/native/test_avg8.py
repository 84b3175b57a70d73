"""int8/uint8 avg on the wirespeed backend: exact where it can be, refused where it cannot."""
import pytest

from .ranks import run_ranks


@pytest.mark.timeout(200)
def test_eight_bit_avg_is_exact_on_one_host_and_refused_across_hosts():
    for r in run_ranks("worker_avg8.py", 4, timeout=180):
        # (-3 + -2 + -1 + 0) / 4 = -1.5 -> -1 (truncating, as integer avg is defined here)
        assert r["int8_one_host"] == [38, -128, 127, -1], r
        assert r["uint8_one_host"] == [200, 255, 0, 4], r
        for name in ("int8", "uint8"):
            assert r[f"{name}_rs_one_host"] == [38], r
            for call in ("all_reduce", "reduce", "reduce_scatter"):
                msg = r[f"{name}_{call}_two_hosts"]
                assert msg.startswith("UnsupportedError") and "would wrap" in msg and name in msg, msg
            assert r[f"{name}_sum_after"] == [(38 * 4) % 256 - (256 if name == "int8" else 0)], r
