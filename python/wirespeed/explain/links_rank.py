"""The ranks' side of `wirespeed links`: every rank runs the same schedule (explain/pairs.py); in each
round the two ranks of a pair time their latency (ping-pong) and bandwidth (each way in turn), the
others wait, and every rank's figures are gathered at the end of the round, which is also what
keeps the rounds apart. Point to point goes through torch.distributed's send/recv, so it runs on
gloo, NCCL and wirespeed's own backend alike.

Bandwidth of a -> b: a sends S bytes and b answers with a one-element acknowledgement; the time
from a's send to the acknowledgement, median over iterations, gives S / time. The acknowledgement
adds one latency, which at the default 16 MiB is under 1% of the time on links up to 10 GB/s.
Latency: half the median round trip of an 8-byte message.
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from statistics import median

from ..errors import UsageError
from ..report.records import record
from . import pairs as PR

LAT_BYTES = 8


@dataclass
class LinksConfig:
    backend: str
    device: str
    nbytes: int
    iters: int
    warmup_iters: int
    lat_iters: int
    by: str                  # "rank", "host" or "auto"
    timeout_s: float
    json_path: str | None = None
    plot_path: str | None = None
    save_dir: str | None = None      # None: --no-save


def units_of(hosts: list[str], by: str) -> list[int]:
    """The ranks that take part: all of them, or the first rank of each host."""
    if by == "auto":
        by = "rank" if len(hosts) <= 16 else "host"
    if by == "host":
        seen: dict[str, int] = {}
        for r, h in enumerate(hosts):
            seen.setdefault(h, r)
        return sorted(seen.values())
    return list(range(len(hosts)))


def _send(dist, t, peer):
    dist.send(t, peer)


def _recv(dist, t, peer):
    dist.recv(t, peer)


def _time_pair(dist, sync, me: int, peer: int, first: bool, big, ack, small, cfg: LinksConfig,
               watchdog) -> tuple[float, float, float]:
    """(latency us, GB/s me->peer, GB/s peer->me) measured by the pair's lower rank (`first`);
    the other rank returns NaNs."""
    nan = float("nan")
    watchdog.step(f"latency with rank {peer}")
    rtts = []
    for i in range(cfg.lat_iters + 2):
        t0 = time.perf_counter()
        if first:
            _send(dist, small, peer); sync(); _recv(dist, small, peer); sync()
        else:
            _recv(dist, small, peer); sync(); _send(dist, small, peer); sync()
        if i >= 2:
            rtts.append(time.perf_counter() - t0)
        watchdog.progress()
    out = []
    for sender in (True, False):  # me -> peer, then peer -> me
        watchdog.step(f"bandwidth {'to' if sender == first else 'from'} rank {peer}")
        times = []
        for i in range(cfg.warmup_iters + cfg.iters):
            t0 = time.perf_counter()
            if sender == first:
                _send(dist, big, peer); sync(); _recv(dist, ack, peer); sync()
            else:
                _recv(dist, big, peer); sync(); _send(dist, ack, peer); sync()
            if i >= cfg.warmup_iters:
                times.append(time.perf_counter() - t0)
            watchdog.progress()
        out.append(cfg.nbytes / median(times) / 1e9)
    if not first:
        return nan, nan, nan
    return median(rtts) / 2 * 1e6, out[0], out[1]


def run_links(cfg: LinksConfig, info, backend, device: str, watchdog, say) -> dict:
    """Every round on this rank; returns (on every rank) the gathered figures and the layout."""
    import torch
    import torch.distributed as dist
    hosts = backend.host_names()
    units = units_of(hosts, cfg.by)
    if len(units) < 2:  # every rank sees the same hosts, so every rank refuses alike
        raise UsageError(f"--by host times pairs of hosts, and all {len(hosts)} ranks run on one "
                         f"host ({hosts[0]}): use --by rank, or ranks on two hosts or more")
    host_index: dict[str, int] = {}
    host_of_unit = [host_index.setdefault(hosts[r], len(host_index)) for r in units]
    rounds = PR.schedule(host_of_unit)
    n_pairs = sum(len(r) for r in rounds)
    say(f"# links: {n_pairs} pairs of {len(units)} {'ranks' if len(units) == len(hosts) else 'hosts (one rank each)'}"
        f" on {len(host_index)} host{'s' if len(host_index) != 1 else ''}, in {len(rounds)} rounds "
        "(no host in two pairs of one round); each pair: "
        f"{cfg.iters} x {cfg.nbytes} B each way, {cfg.lat_iters} round trips of {LAT_BYTES} B")
    big = torch.ones(cfg.nbytes // 4, dtype=torch.float32, device=device)
    ack = torch.zeros(1, dtype=torch.float32, device=device)
    small = torch.zeros(LAT_BYTES // 4, dtype=torch.float32, device=device)
    sync = backend.synchronize
    me = info.rank
    lat: dict[tuple[int, int], float] = {}
    gbps: dict[tuple[int, int], float] = {}
    started = time.perf_counter()
    for k, rnd in enumerate(rounds):
        t_round = time.perf_counter()
        mine = [(a, b) for a, b in rnd if me in (units[a], units[b])]
        row = [float("nan")] * 5
        for a, b in mine:
            first = units[a] == me
            peer = units[b] if first else units[a]
            l, ab, ba = _time_pair(dist, sync, me, peer, first, big, ack, small, cfg, watchdog)
            if first:
                row = [float(a), float(b), l, ab, ba]
        watchdog.step(f"gathering round {k + 1} of {len(rounds)}")
        for r in backend.allgather_floats(row):
            if not math.isnan(r[0]):
                a, b = int(r[0]), int(r[1])
                lat[(a, b)] = lat[(b, a)] = r[2]
                gbps[(a, b)], gbps[(b, a)] = r[3], r[4]
        spent = time.perf_counter() - started
        left = spent / (k + 1) * (len(rounds) - k - 1)
        say(f"# round {k + 1} of {len(rounds)}: {len(rnd)} pair{'s' if len(rnd) != 1 else ''} in "
            f"{time.perf_counter() - t_round:.1f} s" + (f" (about {left:.0f} s to go)" if left >= 1 else ""))
    return {"hosts": hosts, "units": units, "host_of_unit": host_of_unit, "gbps": gbps, "lat_us": lat,
            "seconds": time.perf_counter() - started, "rounds": len(rounds)}


# The job's rank, its backend started (cli/links.py parses the flags and starts the ranks):
# run_links, then on rank 0 the matrices, records, heatmap and verdict.


def run_as_rank(cfg: LinksConfig, info, backend, device) -> int:
    from ..bench.watchdog import guarded_rank
    lead = info.rank == 0

    def say(text):
        if lead:
            print(text, flush=True)

    with guarded_rank(info.rank, cfg.timeout_s) as watchdog:
        result = run_links(cfg, info, backend, device, watchdog, say)
        watchdog.step("finishing")
        backend.barrier()
    if lead:
        report(cfg, result)
    return 0


def labels_of(result) -> tuple[list[str], list[str]]:
    """(a label per measured rank, a name per host): `h2` on the emulated cluster, the hostname
    elsewhere; ranks are told apart as `r5@h2` when a host has several."""
    from .fields import short_host
    hosts, units = result["hosts"], result["units"]
    host_names = []
    for r in units:
        name = short_host(hosts[r])
        if name not in host_names:
            host_names.append(name)
    one_each = len(set(result["host_of_unit"])) == len(units)
    labels = [short_host(hosts[r]) if one_each else f"r{r}@{short_host(hosts[r])}" for r in units]
    return labels, host_names


def records_of(cfg: LinksConfig, result, run_id: str) -> list[dict]:
    from ..envinfo import record_env
    from ..launch.environment import link_fields
    from .fields import short_host
    env = record_env()
    env["hosts"] = result["hosts"]
    units, hosts = result["units"], result["hosts"]
    out = []
    for (a, b), g in sorted(result["gbps"].items()):
        out.append(record("links", {"run_id": run_id, "backend": cfg.backend, "device": cfg.device,
                    "world_size": len(hosts), "src": units[a], "dst": units[b],
                    "src_host": short_host(hosts[units[a]]), "dst_host": short_host(hosts[units[b]]),
                    "same_host": hosts[units[a]] == hosts[units[b]], "bytes": cfg.nbytes,
                    "iters": cfg.iters, "gbps": g, "latency_us": result["lat_us"][(a, b)],
                    "lat_iters": cfg.lat_iters, **link_fields(), "env": env}))
    return out


def report(cfg: LinksConfig, result) -> None:
    from .pairs import find_slow, matrix_text
    from .plots import plot_heatmaps
    from ..report.records import write_jsonl
    labels, host_names = labels_of(result)
    print(f"# bandwidth (GB/s, 1e9 B/s; {cfg.nbytes} B messages), row sends to column")
    print(matrix_text(labels, result["gbps"], ".3f"))
    print("# latency (us, half the round trip of 8 B)")
    print(matrix_text(labels, result["lat_us"], ".1f"))
    verdict = find_slow(labels, result["host_of_unit"], result["gbps"], host_names)
    run_id = time.strftime("%Y%m%d-%H%M%S")
    records = records_of(cfg, result, run_id)
    n = len(labels)
    grid_g = [[result["gbps"].get((i, j)) for j in range(n)] for i in range(n)]
    grid_l = [[result["lat_us"].get((i, j)) for j in range(n)] for i in range(n)]
    title = f"wirespeed links ({cfg.backend}, {cfg.nbytes} B messages)"
    if cfg.json_path:
        write_jsonl(cfg.json_path, records)
    if cfg.plot_path:
        plot_heatmaps(labels, grid_g, grid_l, cfg.plot_path, title)
    if cfg.save_dir:
        d = os.path.join(cfg.save_dir, f"links-{run_id}")
        if os.path.exists(d):
            d = f"{d}-{os.getpid()}"
        write_jsonl(os.path.join(d, "records.jsonl"), records)
        plot_heatmaps(labels, grid_g, grid_l, os.path.join(d, "heatmap.png"), title)
        print(f"# saved records and heatmap in {d}/")
    print(f"# {result['rounds']} rounds in {result['seconds']:.1f} s; rule: {verdict.compared}, "
          f"a host (or rank) is slow below half the median of the per-host medians "
          f"({verdict.median_gbps:.3g} GB/s)" + (f"; {verdict.note}" if verdict.note else ""))
    print(verdict.line())
    sys.stdout.flush()
