"""`predict` and `links` against a known truth: the emulated cluster.

predict: fitted on 2 hosts (gloo, and wirespeed's own backend), it must predict 4 hosts within 15%
and 8 hosts within 25% at 16 MiB and above, on 1 Gbit/s links (the issue's target). One rank per
host, so the 2 shared cores carry at most 8 ranks' TCP at 125 MB/s each, which they do (measured:
busbw 0.90-0.94 of the link for gloo at 16-32 MiB on 2, 4 and 8 hosts). A measured run that misses
the band is measured once more: another test's load can only slow a run down, and a prediction
that fails twice is wrong.

links: 4 hosts at 1 Gbit/s with h2 at 200 Mbit/s must name h2 and only h2; equal links must say
`slow: none`.
"""
from __future__ import annotations

import pytest
from netem_util import cluster_name  # noqa: F401 (a fixture)
from netem_util import needs_netns, run_here

pytestmark = [pytest.mark.netns, pytest.mark.slow, needs_netns]

FIT_SIZES = "256K,1M,4M,16M,32M"
CHECK_SIZES = "16M,32M"
BAND = {4: 0.15, 8: 0.25}


def _bench(capfd, cluster, backend, world, sizes, path, iters):
    code, _, err = run_here(capfd, "bench", "--cluster", cluster, "-N", world, "--backend", backend,
                            "--sizes", sizes, "-n", iters, "-w", 1, "--timeout", 120, "--no-save",
                            "--no-progress", "--json", path)
    assert code == 0, err[-2000:]
    from wirespeed.report.records import read_records
    return read_records(path)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("backend", ["gloo", "wirespeed"])
def test_fitted_on_two_hosts_predicts_four_and_eight(capfd, cluster_name, tmp_path, backend):
    from wirespeed.explain import predict as P
    from wirespeed.netem import cluster as C
    C.up(8, 10**9, name=cluster_name, measure=False)
    fitted = _bench(capfd, cluster_name, backend, 2, FIT_SIZES, tmp_path / "fit.jsonl", 3)
    fits = P.fit_all(fitted)
    assert len(fits) == 1 and fits[0].model.per_rate  # b_net against the records' 1 Gbit/s
    seen = {}
    for world, band in BAND.items():
        for attempt in range(2):
            measured = _bench(capfd, cluster_name, backend, world, CHECK_SIZES,
                              tmp_path / f"m{world}-{attempt}.jsonl", 2)
            errors = [c.error for c in P.check_against(fits, measured)]
            seen.setdefault(world, []).append([round(e, 3) for e in errors])
            assert len(errors) == 2
            if max(abs(e) for e in errors) <= band:
                break
        assert max(abs(e) for e in errors) <= band, f"{backend}: prediction errors by world {seen}"
    # The same through the CLI: the side-by-side table and predicted records.
    code, out, err = run_here(capfd, "predict", "--from", tmp_path / "fit.jsonl", "--against",
                              tmp_path / f"m8-{len(seen[8]) - 1}.jsonl")
    assert code == 0, err
    assert "predicted against measured" in out and "# worst:" in out
    print(f"{backend} prediction errors (16M, 32M) by world:", seen)


def _links(capfd, cluster):
    code, out, err = run_here(capfd, "links", "--cluster", cluster, "--size", "2M", "-n", 2,
                              "--lat-iters", 5, "--timeout", 60, "--no-save")
    assert code == 0, err[-2000:]
    return out.strip().splitlines()


@pytest.mark.timeout(300)
def test_links_names_the_slow_host_and_only_it(capfd, cluster_name):
    from wirespeed.netem import cluster as C
    C.up(4, 10**9, name=cluster_name, measure=False, host_rates={2: 200 * 10**6})
    lines = _links(capfd, cluster_name)
    assert lines[-1].startswith("slow: h2 (") and lines[-1].count("GB/s") == 1, lines[-12:]
    assert "6 pairs of 4 ranks on 4 hosts, in 3 rounds" in "\n".join(lines)
    C.up(4, 10**9, name=cluster_name, measure=False)
    lines = _links(capfd, cluster_name)
    assert lines[-1] == "slow: none", lines[-12:]
