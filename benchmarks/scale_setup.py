"""What a wirespeed group costs each rank at setup, on 2 to 16 emulated hosts, and a model of it.

    sudo .venv/bin/python benchmarks/scale_setup.py                       # 2,4,8,16 hosts x 1,2 ranks
    sudo .venv/bin/python benchmarks/scale_setup.py --hosts 2,4 --per-host 2 --json out.jsonl

One emulated cluster (`--name`, default `scl`) of the largest host count is built, used for every
case (a case of H hosts runs on its first H) and torn down at the end, also on an error or ^C.
Each case starts H x K rank processes (blocked: ranks 0..K-1 on h0, ...). Every rank imports torch,
says it is ready and waits for the go (a file holding the launcher's monotonic clock, which every
namespace shares), so imports on 2 cores do not count as setup. Then per rank:
- setup: from init_process_group("wirespeed") to its first all_reduce done (1,024 floats, checked);
  `job` is the go to the last rank's first collective;
- sockets: its /proc/self/fd entries that are sockets, sorted through the namespace's
  /proc/net/tcp{,6} into the store's (to or from MASTER_PORT), its listener and its TCP streams,
  once after that first all_reduce and again after a small all_to_all (run direct, with
  WIRESPEED_A2A_LEADERS_MAX=0, so that it uses every pair);
- threads (/proc/self/status Threads) and memory (VmRSS, VmHWM), each also before init, so that
  the group's own share is the difference;
- the store's load as wirespeed's rendezvous counted it (rendezvous.last_setup()).
Connections are made on first use (WIRESPEED_CONNECT=lazy, the default), so after the all_reduce
a rank holds streams only with the peers that all_reduce used (wirespeed.scalemodel's
`small_all_reduce_peers`), and after the all_to_all with every remote rank; and a pair opens one
stream for messages this small (all of `Layout::pair_streams`' only from `scalemodel.grow_at`
bytes on: `scalemodel.opened`). Both counts are compared rank by rank with the model's and any
difference is printed as a failure. `--connect eager` runs the ranks with
WIRESPEED_CONNECT=eager: every pair at setup with all its streams (`tcp_sockets`), as before. Then lines are fitted to the rest and the model's error on
the measured points and its figures at 64, 256 and 1,024 hosts x 8 ranks are printed.

The machine this was written on has 2 cores shared with other people's jobs; 32 rank processes on
it measure the scheduler as much as wirespeed. Times are noisy: run it twice and give ranges.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

NSTREAMS = 12
# The first all_reduce's buffer (the all_to_all's is smaller): below scalemodel.grow_at, so a lazy
# pair opens one stream.
ALL_REDUCE_BYTES = 4096


# ---------------------------------------------------------------------------------------------
# the rank


def _status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("Threads", "VmRSS", "VmHWM"):
                out[k] = int(v.split()[0])  # kB for the memory lines
    return out


def _tcp_table() -> dict[int, tuple[int, int, str]]:
    """inode -> (local port, remote port, state) for this network namespace's TCP sockets."""
    out = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    p = line.split()
                    lport = int(p[1].rsplit(":", 1)[1], 16)
                    rport = int(p[2].rsplit(":", 1)[1], 16)
                    out[int(p[9])] = (lport, rport, p[3])
        except FileNotFoundError:
            pass
    return out


def count_sockets(store_port: int) -> dict:
    """This process's sockets by kind: store, listen (its own listeners but the store's), streams
    (established TCP that is not the store's), other (unix, or not in the TCP table)."""
    table = _tcp_table()
    kinds = {"store": 0, "listen": 0, "streams": 0, "other": 0, "all": 0}
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if not link.startswith("socket:["):
            continue
        kinds["all"] += 1
        t = table.get(int(link[8:-1]))
        if t is None:
            kinds["other"] += 1
        elif store_port in (t[0], t[1]):
            kinds["store"] += 1
        elif t[2] == "0A":  # LISTEN
            kinds["listen"] += 1
        else:
            kinds["streams"] += 1
    return kinds


def sockstat() -> dict:
    """The namespace's TCP sockets in use (and the kernel's TCP buffer pages, machine-wide: the
    count is per namespace, the memory is not, so it is kept for the record only)."""
    with open("/proc/net/sockstat") as f:
        for line in f:
            if line.startswith("TCP:"):
                v = line.split()[1:]
                d = dict(zip(v[::2], map(int, v[1::2])))
                return {"inuse": d.get("inuse", 0), "mem_pages": d.get("mem", 0)}
    return {}


def worker(outdir: str) -> int:
    import datetime

    import torch
    import torch.distributed as dist

    import wirespeed.native  # noqa: F401 (registers the backend)
    from wirespeed.native import rendezvous

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    port = int(os.environ["MASTER_PORT"])
    before = _status()
    socks_before = count_sockets(port)["all"]
    open(os.path.join(outdir, f"ready{rank}"), "w").close()
    go = os.path.join(outdir, "go")
    while not os.path.exists(go):
        time.sleep(0.005)
    with open(go) as f:
        t_go = float(f.read())
    t0 = time.monotonic()
    dist.init_process_group("wirespeed", timeout=datetime.timedelta(seconds=float(os.environ["SCALE_TIMEOUT"])))
    t_init = time.monotonic()
    t = torch.full((ALL_REDUCE_BYTES // 4,), float(rank + 1))
    dist.all_reduce(t)
    t1 = time.monotonic()
    ok = bool((t == world * (world + 1) / 2).all())
    socks_setup = count_sockets(port)
    # Every rank counts before any starts the all_to_all (whose first posts connect), met through
    # the store: a collective here would connect the pairs being counted.
    store = dist.distributed_c10d._get_default_store()
    store.add("scale/counted", 1)
    while store.add("scale/counted", 0) < world:
        time.sleep(0.002)
    # a small all_to_all, direct (WIRESPEED_A2A_LEADERS_MAX=0): every pair of ranks exchanges, so
    # every remote pair is connected
    a2a_in = torch.arange(world, dtype=torch.float32) + 100 * rank
    a2a_out = torch.empty(world)
    dist.all_to_all_single(a2a_out, a2a_in)
    ok = ok and bool((a2a_out == torch.arange(world, dtype=torch.float32) * 100 + rank).all())
    rec = {"rank": rank, "world": world, "host": os.environ["_WIRESPEED_CLUSTER_HOST"], "ok": ok,
           "setup_s": t1 - t0, "init_s": t_init - t0, "wake_s": t0 - t_go, "done_at": t1 - t_go,
           "threads_before": before["Threads"], "rss_before_kb": before["VmRSS"],
           "sockets_before": socks_before, "sockets": socks_setup, "sockets_a2a": count_sockets(port),
           "connect": os.environ.get("WIRESPEED_CONNECT", "lazy"), **_status(),
           "sockstat": sockstat(),
           "store": rendezvous.last_setup()}
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(rec, f)
    dist.barrier()  # nobody leaves (rank 0 serves the store) before all have counted
    dist.destroy_process_group()
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------------
# the launcher


def run_case(cluster, hosts: int, per_host: int, timeout_s: float, connect: str = "lazy") -> list[dict]:
    from wirespeed.launch.cluster import free_port_in, rank_envs
    from wirespeed.launch.local import die_with_parent
    from wirespeed.netem import cluster as C
    from wirespeed.scalemodel import blocked

    hosts_of = blocked(hosts, per_host)
    world = len(hosts_of)
    port = free_port_in(cluster.hosts[0].netns, cluster.hosts[0].addr)
    outdir = tempfile.mkdtemp(prefix="scale-")
    pypath = os.path.join(HERE, "..", "python")
    base = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [pypath, os.environ.get("PYTHONPATH")])),
                SCALE_TIMEOUT=str(timeout_s), WIRESPEED_NSTREAMS=str(NSTREAMS), WIRESPEED_CONNECT=connect,
                # The small all_to_all below must use every pair (the count the open-file budget
                # bounds): keep it off the leaders' path, which small ones take by default.
                WIRESPEED_A2A_LEADERS_MAX="0")
    envs = rank_envs(cluster, hosts_of, port, base)
    # stderr to files, not pipes: a rank that writes much while nobody reads would block
    errs = [open(os.path.join(outdir, f"err{r}"), "w") for r in range(world)]
    procs = [subprocess.Popen([*C.exec_prefix(cluster.hosts[h].netns), sys.executable, os.path.abspath(__file__),
                               "--worker", outdir], env=env, preexec_fn=die_with_parent,
                              stdout=subprocess.DEVNULL, stderr=err)
             for h, env, err in zip(hosts_of, envs, errs)]
    deadline = time.monotonic() + timeout_s + 120  # imports of 32 torch processes on 2 cores
    try:
        while sum(os.path.exists(os.path.join(outdir, f"ready{r}")) for r in range(world)) < world:
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
                raise RuntimeError(f"{hosts}x{per_host}: ranks did not get ready")
            time.sleep(0.05)
        with open(os.path.join(outdir, "go.tmp"), "w") as f:
            f.write(repr(time.monotonic()))
        os.replace(os.path.join(outdir, "go.tmp"), os.path.join(outdir, "go"))
        end = time.monotonic() + timeout_s + 30
        for p in procs:
            try:
                p.wait(timeout=max(1.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{hosts}x{per_host}: a rank did not finish in time") from None
        bad = [(r, p.returncode, open(os.path.join(outdir, f"err{r}")).read()[-800:])
               for r, p in enumerate(procs) if p.returncode != 0]
        if bad:
            raise RuntimeError(f"{hosts}x{per_host}: ranks failed: {bad[:2]}")
        return [json.load(open(os.path.join(outdir, f"rank{r}.json"))) for r in range(world)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        for f in errs:
            f.close()
        subprocess.run(["rm", "-rf", outdir])


def _median(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def per_rank(cases: dict) -> None:
    """Every rank's own line."""
    print("\n# per rank")
    print(f"{'case':>6} {'rank':>4} {'host':>4} | {'setup s':>7} {'init s':>6} | {'streams':>7} {'+a2a':>5} {'listen':>6}"
          f" {'store':>5} {'other':>5} | {'threads':>7} {'RSS MB':>6} {'HWM MB':>6} | {'keys rd':>7} {'wr':>3} {'req':>3}")
    for (h, k), recs in sorted(cases.items()):
        for r in recs:
            so, st = r["sockets"], r["store"]
            print(f"{h:>3}x{k:<2} {r['rank']:>4} {r['host']:>4} | {r['setup_s']:>7.3f} {r['init_s']:>6.3f} |"
                  f" {so['streams']:>7} {r['sockets_a2a']['streams']:>5} {so['listen']:>6} {so['store']:>5} {so['other']:>5} | {r['Threads']:>7}"
                  f" {r['VmRSS'] / 1024:>6.0f} {r['VmHWM'] / 1024:>6.0f} | {st['keys_read']:>7} {st['keys_written']:>3}"
                  f" {st['requests']:>3}")


def summarize(cases: dict) -> None:
    """The per-case table, the socket check and the fitted model with its figures."""
    from wirespeed.scalemodel import (blocked, fit_line, job_store_reads, small_all_reduce_peers, store_load,
                                      tcp_sockets, tcp_sockets_blocked, tcp_sockets_to)

    print("\n# per case: min-median-max over ranks; rdv: wirespeed's own rendezvous (median); store(r0): rank 0's store sockets (it serves the store), store: another rank's; +grp: added by init (threads: the median of the ranks but rank 0, which also runs the store's server); wr, req: the most of any rank; tcp/host: TCP sockets in use in a host's namespace (sockstat, the most of any host)")
    print(f"{'hosts':>5} {'xK':>3} {'ranks':>5} | {'setup s':>17} {'rdv s':>5} {'job s':>6} | {'streams':>11} {'+a2a':>8} {'listen':>6}"
          f" {'store(r0)':>9} {'store':>5} | {'threads':>9} {'+grp':>5} | {'RSS MB':>11} {'+grp MB':>8}"
          f" {'HWM MB':>6} | {'keys rd':>11} {'wr':>3} {'req':>5} | {'job rd':>7} {'tcp/host':>8}")
    mismatches = []
    for (h, k), recs in sorted(cases.items()):
        lay = blocked(h, k)
        for r in recs:
            remote = [p for p in range(h * k) if lay[p] != lay[r["rank"]]]
            if r.get("connect") == "eager":
                every = used = tcp_sockets(lay, r["rank"], NSTREAMS)
            else:  # messages of at most ALL_REDUCE_BYTES: one stream a pair
                every = tcp_sockets_to(lay, r["rank"], remote, NSTREAMS, ALL_REDUCE_BYTES)
                used = tcp_sockets_to(lay, r["rank"], small_all_reduce_peers(lay, r["rank"]), NSTREAMS, ALL_REDUCE_BYTES)
            if r["sockets"]["streams"] != used:
                mismatches.append((h, k, r["rank"], "after the all_reduce", r["sockets"]["streams"], used))
            if r["sockets_a2a"]["streams"] != every:
                mismatches.append((h, k, r["rank"], "after the all_to_all", r["sockets_a2a"]["streams"], every))
            sl = store_load(lay, r["rank"])
            if (r["store"]["keys_read"], r["store"]["keys_written"], r["store"]["requests"]) != (sl.read, sl.written, sl.requests):
                mismatches.append((h, k, r["rank"], "store", r["store"], sl))

        def rng(key, f=lambda x: x, fmt="{:.0f}"):
            v = [f(r) if callable(key) else f(r[key]) for r in recs] if not callable(key) else [key(r) for r in recs]
            return "-".join(fmt.format(x) for x in (min(v), _median(v), max(v)))
        rest = [r for r in recs if r["rank"] != 0]
        print(f"{h:>5} {k:>3} {h * k:>5} | {rng('setup_s', fmt='{:.2f}'):>17} {_median([r['store']['seconds'] for r in recs]):>5.2f} {max(r['done_at'] for r in recs):>6.2f}"
              f" | {rng(lambda r: r['sockets']['streams']):>11} {rng(lambda r: r['sockets_a2a']['streams']):>8} {rng(lambda r: r['sockets']['listen']).split('-')[1]:>6}"
              f" {recs[0]['sockets']['store']:>9} {_median([r['sockets']['store'] for r in rest]) if rest else 0:>5}"
              f" | {rng('Threads'):>9} {_median([r['Threads'] - r['threads_before'] for r in rest or recs]):>5}"
              f" | {rng('VmRSS', lambda x: x / 1024):>11} {_median([(r['VmRSS'] - r['rss_before_kb']) / 1024 for r in recs]):>8.1f}"
              f" {max(r['VmHWM'] for r in recs) / 1024:>6.0f}"
              f" | {rng(lambda r: r['store']['keys_read']):>11} {max(r['store']['keys_written'] for r in recs):>3}"
              f" {max(r['store']['requests'] for r in recs):>5} | {sum(r['store']['keys_read'] for r in recs):>7} {max(r['sockstat']['inuse'] for r in recs):>8}")
        assert sum(r["store"]["keys_read"] for r in recs) == job_store_reads(h, k)
    print(f"\n# streams per rank against the peers used (after the all_reduce: its peers'; after the all_to_all: every remote rank's; one stream a pair for messages this small, every one of Layout::pair_streams' {NSTREAMS} when eager), store keys against "
          f"rendezvous.py's requests: {'all equal' if not mismatches else 'DIFFER: ' + repr(mismatches[:6])}")
    if not all(r["ok"] for recs in cases.values() for r in recs):
        print("# WRONG: some rank's all_reduce was wrong")

    allr = [(h, k, r) for (h, k), recs in cases.items() for r in recs]
    # threads and memory the group adds: constants, unless they follow the peers or the sockets
    thr = [r["Threads"] - r["threads_before"] for _, _, r in allr]
    t_const = _median(thr)
    ta, tb = fit_line([h * k - k for h, k, _ in allr], thr)
    socks = [r["sockets"]["streams"] for _, _, r in allr]
    mem = [(r["VmRSS"] - r["rss_before_kb"]) / 1024 for _, _, r in allr]
    m_const = _median(mem)
    ma, mb = fit_line(socks, mem)
    # setup time of the median rank per case, two candidate lines: in the ranks of the job, and
    # in the TCP sockets all ranks open on this one machine (the handshakes are CPU work, and here
    # every rank shares the same 2 cores)
    keys = sorted(cases)
    med = [_median([r["setup_s"] for r in cases[c]]) for c in keys]
    coll = [_median([r["setup_s"] - r["init_s"] for r in cases[c]]) for c in keys]
    ranks = [h * k for h, k in keys]
    machine = [sum(r["sockets"]["streams"] for r in cases[c]) for c in keys]
    fits = {}
    for label, xs in (("ranks", ranks), ("sockets on the machine", machine)):
        a_, b_ = fit_line(xs, med)
        pred = [a_ + b_ * x for x in xs]
        rms = (sum((p - m) ** 2 for p, m in zip(pred, med)) / len(med)) ** 0.5
        fits[label] = (a_, b_, rms, pred)

    print("\n# model (fitted on the points above)")
    r0 = [r["Threads"] - r["threads_before"] for _, _, r in allr if r["rank"] == 0]
    others = [r["Threads"] - r["threads_before"] for _, _, r in allr if r["rank"] != 0]
    print(f"threads added by the group: {t_const:.0f} (other ranks {min(others)}..{max(others)}, rank 0 "
          f"{min(r0)}..{max(r0)}: it also runs the store's server; a line in remote ranks has slope "
          f"{tb:+.4f})")
    print(f"RSS added by the group: {m_const:.1f} MB (measured {min(mem):.1f}..{max(mem):.1f}; a line in TCP "
          f"sockets has slope {mb * 1024:+.1f} KB per socket over {min(socks)}..{max(socks)} sockets)")
    for label, (a_, b_, rms, pred) in fits.items():
        print(f"setup s (median rank) = {a_:.3f} + {b_ * 1000:.3f} ms x {label}: rms error {rms:.2f} s")
    print(f"{'case':>6} {'setup s':>8} {'in ranks':>8} {'in sockets':>10} {'1st all_reduce s':>16}")
    for c, m, p1, p2, c1 in zip(keys, med, fits["ranks"][3], fits["sockets on the machine"][3], coll):
        print(f"{c[0]:>3}x{c[1]:<2} {m:>8.2f} {p1:>8.2f} {p2:>10.2f} {c1:>16.4f}")
    per_key = _median([r["store"]["bytes_read"] / r["store"]["keys_read"] for _, _, r in allr])
    print(f"store: {per_key:.0f} bytes per key read (median); keys exact (wirespeed.scalemodel.store_load)")

    sa, sb = fits["ranks"][:2]
    ca, cb = fits["sockets on the machine"][:2]
    cores_here = os.cpu_count() or 2
    print(f"\n# at scale, {NSTREAMS} streams, blocked layout, 8 ranks per host; setup 'in ranks' is the line "
          f"above, 'per core' the socket line with each rank on a core of its own ({cores_here} cores here)")
    print(f"{'hosts':>6} {'ranks':>6} | {'1st a_r':>7} {'streams/rank':>12} {'fds/rank':>8} | {'threads+':>8} {'RSS+ MB':>7}"
          f" | {'in ranks':>8} {'per core':>8} | {'keys rd r0':>10} {'keys rd job':>12} {'MB read job':>11}")
    for h in (64, 256, 1024):
        n = h * 8
        s_ = max(tcp_sockets_blocked(h, 8, r, NSTREAMS) for r in range(8))
        # after the first small all_reduce, connections on first use: a leader's log2(h) partners
        lay = blocked(h, 8)
        s1 = tcp_sockets_to(lay, 0, small_all_reduce_peers(lay, 0), NSTREAMS, ALL_REDUCE_BYTES)
        fds = s_ + 1 + 7 + 2 + 64  # listener, pidfds, setup's own, margin (hosts/fds.rs)
        jr = job_store_reads(h, 8)
        r0 = store_load(lay, 0).read  # rank 0 reads every host record and the addresses of every host
        print(f"{h:>6} {n:>6} | {s1:>7} {s_:>12} {fds:>8} | {t_const:>8.0f} {m_const:>7.1f}"
              f" | {sa + sb * n:>8.1f} {ca + cb * cores_here * s_:>8.1f} | {r0:>10} {jr:>12} {jr * per_key / 1e6:>11.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--hosts", default="2,4,8,16")
    ap.add_argument("--per-host", default="1,2")
    ap.add_argument("--name", default="scl")
    ap.add_argument("--timeout", type=float, default=120, help="per case, seconds (setup and the all_reduce)")
    ap.add_argument("--json", help="append every rank's record here (one line per case)")
    ap.add_argument("--connect", choices=("lazy", "eager"), default="lazy",
                    help="WIRESPEED_CONNECT for the ranks: lazy (on first use, the default) or eager (every pair at setup)")
    ap.add_argument("--from-json", help="summarize records saved with --json instead of running")
    ap.add_argument("--per-rank", action="store_true", help="also print every rank's own line")
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker)
    cases: dict = {}
    if a.from_json:
        for line in open(a.from_json):
            rec = json.loads(line)
            cases[(rec["hosts"], rec["per_host"])] = rec["ranks"]
        if a.per_rank:
            per_rank(cases)
        summarize(cases)
        return 0
    from wirespeed.netem import cluster as C
    hosts = [int(x) for x in a.hosts.split(",")]
    per = [int(x) for x in a.per_host.split(",")]
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}; cluster {a.name!r} of {max(hosts)} hosts", flush=True)
    try:
        cluster, _ = C.up(max(hosts), 10 * 10**9, name=a.name, measure=False)
        for h in hosts:
            for k in per:
                t = time.monotonic()
                try:
                    cases[(h, k)] = recs = run_case(cluster, h, k, a.timeout, a.connect)
                except RuntimeError as e:
                    print(f"# {e}", flush=True)
                    continue
                print(f"# {h} hosts x {k}: {time.monotonic() - t:.0f} s in all, load {os.getloadavg()[0]:.1f}",
                      flush=True)
                if a.json:
                    with open(a.json, "a") as f:
                        f.write(json.dumps({"hosts": h, "per_host": k, "ranks": recs}) + "\n")
    finally:
        C.down(a.name)
    if cases and a.per_rank:
        per_rank(cases)
    if cases:
        summarize(cases)
    return 0 if cases else 1


if __name__ == "__main__":
    sys.exit(main())
