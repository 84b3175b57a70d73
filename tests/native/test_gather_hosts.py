"""torch's gather and scatter across (emulated) hosts on the wirespeed backend: through the host
leaders (algo/leaders_gs.rs), exact from every root. The peer counts are the core's tests'
(crates/wirespeed-core: tests/sim_peers.rs, tests/hosts.rs)."""
import pytest

from .ranks import run_ranks


@pytest.mark.timeout(200)
def test_gather_and_scatter_across_hosts_are_exact_from_every_root():
    results = run_ranks("worker_gather_hosts.py", 6, timeout=180, extra_env={"WIRESPEED_IFNAME": "lo"})
    for r in results:
        assert r["bad"] == [], r
        assert r["checked"] == 7, r   # its own gather as root, and 6 scatters
