"""Fault injection (issue 16): a rank killed, stopped, or cut off by a pulled link at a seeded random
point of a sweep over every collective, on real rank processes started by wirespeed's own
launchers (loopback, and the emulated cluster for the link). Each case checks that every rank
ends within the timeout with its own typed error, that the job's exit status names the kind of
fault (4 peer lost, 3 timeout), and that no process, /dev/shm entry or namespace is left behind.

Few cases with fixed seeds, so the suite stays within about two minutes on a small machine; the
soak benchmark (benchmarks/soak.py) is where volume goes.
"""
from __future__ import annotations

import random
import time

import pytest

from faults.faultkit import (STARTUP_S, bench_args, continue_rank, kill_rank, marked, shm_entries,
                             start, stop_rank)
from netem.netem_util import cluster_name  # noqa: F401 (a fixture)
from netem.netem_util import needs_netns, netns_processes


def _own_errors(job, ranks) -> None:
    err = job.stderr()
    assert "Traceback" not in err, err[-3000:]
    for r in ranks:
        assert f"wirespeed: error: rank {r}: " in err, (r, err[-3000:])


def _nothing_left(job, shm_before) -> None:
    assert marked(job.mark) == {}, "rank processes outlived the job"
    assert shm_entries() <= shm_before, shm_entries() - shm_before


@pytest.mark.timeout(STARTUP_S + 60)
@pytest.mark.parametrize("backend,seed", [("gloo", 11), ("wirespeed", 12)])
def test_a_paused_rank_is_no_fault_and_a_killed_one_is_a_lost_peer(tmp_path, backend, seed):
    rng = random.Random(seed)
    timeout = 20
    shm_before = shm_entries()
    job = start(tmp_path, [*bench_args(seed, backend, timeout), "-N", 3])
    assert sorted(job.ranks) == [0, 1, 2], job.ranks
    # Stopped for a second, well within the timeout, then continued: the job just goes on.
    time.sleep(rng.uniform(0.2, 1.0))
    paused = rng.randrange(3)
    stop_rank(job, paused)
    time.sleep(1.0)
    continue_rank(job, paused)
    time.sleep(rng.uniform(0.3, 1.0))
    assert job.proc.poll() is None, "the job ended after a pause: " + job.stderr()[-3000:]
    victim = rng.randrange(3)
    killed_at = kill_rank(job, victim)
    code = job.finish(timeout + 10)
    took = job.ended - killed_at
    survivors = [r for r in range(3) if r != victim]
    assert code == 4, (code, job.stderr()[-3000:])
    assert took < 6, took  # seen as a lost peer at once, not by waiting for the 20 s timeout
    statuses = job.rank_statuses()
    assert statuses.get(victim) == "killed by SIGKILL", statuses
    for r in survivors:
        assert statuses.get(r) == "exited with status 4", statuses
    _own_errors(job, survivors)
    _nothing_left(job, shm_before)


@pytest.mark.timeout(STARTUP_S + 60)
@pytest.mark.parametrize("backend,seed", [("gloo", 21), ("wirespeed", 22)])
def test_a_stopped_rank_times_out_every_rank_within_the_timeout(tmp_path, backend, seed):
    rng = random.Random(seed)
    timeout = 4
    shm_before = shm_entries()
    job = start(tmp_path, [*bench_args(seed, backend, timeout), "-N", 2])
    time.sleep(rng.uniform(0.2, 1.5))
    victim = rng.randrange(2)
    stopped_at = stop_rank(job, victim)
    code = job.finish(timeout + 15)
    took = job.ended - stopped_at
    assert code == 3, (code, job.stderr()[-3000:])
    # The other rank's own timeout, then the stopped rank is killed at once (it cannot report
    # anything, so the survivors' grace would only add to the wait): the timeout plus about a
    # second, half a second more for a shared machine.
    assert took < timeout + 1.5, (took, job.stderr()[-3000:])
    statuses = job.rank_statuses()
    assert statuses.get(1 - victim) == "exited with status 3", statuses
    assert statuses.get(victim) == "killed by the launcher, stopped", statuses
    assert f"rank {victim} is stopped, so it cannot end by itself" in job.stderr()
    _own_errors(job, [1 - victim])
    _nothing_left(job, shm_before)


@needs_netns
@pytest.mark.netns
@pytest.mark.timeout(STARTUP_S + 90)
def test_a_pulled_link_ends_the_job_within_the_timeout_naming_the_link(cluster_name, tmp_path):  # noqa: F811
    from wirespeed.netem import cluster as C
    rng = random.Random(31)
    timeout = 6
    C.up(3, 200 * 10**6, name=cluster_name, measure=False)
    shm_before = shm_entries()
    job = start(tmp_path, [*bench_args(31, "wirespeed", timeout), "--cluster", cluster_name, "-N", 3])
    time.sleep(rng.uniform(0.2, 1.5))
    host = rng.randrange(3)  # rank r runs on host h{r} (round robin)
    C.set_link(cluster_name, host, False)  # no reset, no FIN: silence
    down_at = time.monotonic()
    code = job.finish(timeout + 15)
    took = job.ended - down_at
    assert code == 3, (code, job.stderr()[-3000:])
    # The timeout plus about a second (each rank's own timeout, its exit, the launcher's poll);
    # half a second more of slack for a machine shared with other jobs.
    assert took < timeout + 1.5, (took, job.stderr()[-3000:])
    statuses = job.rank_statuses()
    assert sorted(statuses) == [0, 1, 2] and all(s.startswith("exited with status") for s in
                                                 statuses.values()), statuses
    err = job.stderr()
    assert f"host h{host}'s link is down: rank {host} on h{host} could not reach ranks" in err, err[-3000:]
    assert f"cluster link --name {cluster_name} h{host} up" in err
    _own_errors(job, [0, 1, 2])
    _nothing_left(job, shm_before)
    assert netns_processes(cluster_name) == {}
