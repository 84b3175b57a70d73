"""A job of N ranks over H hosts, rehearsed in one process: the real setup and collectives at a
scale that N processes each importing torch would not reach on a small machine.

    python benchmarks/scale_rehearsal.py --ranks 64 --hosts 16 [--json out.json]

Each rank is a thread (torch is imported once) that makes a real native group through the real
store rendezvous (wirespeed.native.rendezvous, on a real torch TCPStore that this process serves
over loopback, a client connection per rank), with its own host id given to its group as data
(WIRESPEED_HOSTID): ranks of one host id share memory as on a real host, ranks of different ids
talk TCP over loopback. Ranks fill hosts in blocks (0..K-1 on host 0, ...), or with `--cyclic`
are dealt to them round-robin. Then every rank runs,
each result checked element by element: all_reduce, all_gather, reduce_scatter, all_to_all, and
gather and scatter to and from the last rank, of a small (4 KiB) and a mid (`--mid-kib`, 64 KiB)
buffer, and a barrier (`--ops` chooses).

    python benchmarks/scale_rehearsal.py --ranks 1024 --hosts 128 --nstreams 1 --ops all_reduce

Every rank's TCP streams are file descriptors of this one process (both ends of each connection),
so the process's hard open-file limit bounds what runs. The rehearsal estimates its need first
(the leaders' `scalemodel.collective_peers`; the full mesh, N x (N - K) descriptors and more,
only where the all_to_all's pieces exceed the leaders' threshold) and says so in one line when
the hard limit is below it. After all ops, `max_streams_model` is the streams the leaders' paths leave
(`scalemodel.streams_after_collectives`): a pair connected on first use opens one stream, and all
of its streams from a message of `scalemodel.grow_at` bytes on (384 KiB at 12 streams), so the
model needs the largest message two leaders exchanged (`largest_leader_message`:
`scalemodel.leaders_largest_message`). `max_streams_all_opened` is the same partners with every
stream open, `max_streams_full_mesh` every remote pair's.

Reported per rank (min / median / max) and per job, beside wirespeed.scalemodel's figures:
setup seconds (the rendezvous, from each rank's start), the store's keys and bytes read and
written and its requests (the rendezvous's own count), TCP streams (the core's count of the
streams each rank holds) after setup, after the all_reduces and after all collectives; and for
the process: open files, threads and memory before and after, divided per rank.

What one process cannot say like N would: every rank's open-file room is the one this process
had before any rank started (what a rank's own process would publish); the open-file limit is the
process's, shared by all ranks, so it is raised to the hard limit first and the rehearsal says
what it needs; memfd segments count against memory (not /dev/shm's size). The machine's load
bears on the times: they are one machine's, not a cluster's.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import sys
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

SMALL = 4096
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter", "barrier")
F32, SUM = 0, 0  # the core's dtype and op codes (dtype.rs)

from scale_setup import _status  # noqa: E402  (threads, VmRSS, VmHWM of this process)


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def raise_open_files(need: int) -> tuple[int, int]:
    """The soft open-file limit raised to the hard one; (soft, hard) after. One line and exit
    when even the hard limit is below `need`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < need:
        sys.exit(f"scale_rehearsal: this process may open {hard} files (ulimit -Hn) and the rehearsal "
                 f"needs about {need}; raise the hard limit (e.g. `ulimit -Hn {need}` as root, or "
                 f"/etc/security/limits.conf), run fewer ranks, or leave out the ops that connect every "
                 f"pair (--ops all_reduce)")
    return hard, hard


def host_of(ranks: int, hosts: int, cyclic: bool) -> list[int]:
    """Each rank's host: in blocks of ranks / hosts (launchers' default), or dealt round-robin."""
    return [r % hosts for r in range(ranks)] if cyclic else [r // (ranks // hosts) for r in range(ranks)]


def fd_need(ranks: int, hosts: int, nstreams: int, every_pair: bool, largest: int | None = None) -> int:
    """Open files the rehearsal needs at most: per rank the store's two ends, its listener, memfd,
    pidfds of its host mates, the reactor's (3 per I/O thread, 2 threads at most) and its TCP
    streams (both ends are in this process: each rank counts its own end). `every_pair`: an
    all_to_all whose pieces exceed the leaders' threshold connects every remote pair; otherwise
    the leaders hold their `scalemodel.collective_peers` (every collective here, the barrier
    included, crosses hosts through the leaders at these sizes), with the streams their largest
    message `largest` opens (`scalemodel.opened`; None: all of them), and the other ranks none."""
    from wirespeed.scalemodel import blocked, tcp_sockets, streams_after_collectives
    k = ranks // hosts
    lay = blocked(hosts, k)
    fixed = ranks * (2 + 1 + 1 + (k - 1) + 6)
    if every_pair:
        streams = sum(tcp_sockets(lay, r, nstreams) for r in range(0, ranks, k)) * k  # ~ every rank
    else:
        streams = sum(streams_after_collectives(lay, r, nstreams, largest) for r in range(0, ranks, k))
    return fixed + streams + 256


class Rank(threading.Thread):
    def __init__(self, rank, world, host, store, timeout, knobs, room, mid, go, ops):
        super().__init__(name=f"rank{rank}", daemon=True)
        self.rank, self.world, self.store, self.timeout = rank, world, store, timeout
        # As long as a real one (hostname/boot id), so the store's bytes are a real job's.
        self.knobs = dict(knobs, WIRESPEED_HOSTID=f"node{host:05d}.rehearsal/{uuid.UUID(int=host)}")
        self.room, self.mid, self.go, self.ops = room, mid, go, ops
        self.rec: dict = {"rank": rank}
        self.wrong: list[str] = []
        self.error: str | None = None
        self.group = None
        self.step = self.meet = threading.Barrier(1)  # replaced by the launcher's shared ones
        self.leave = threading.Event()
        self.set_up = lambda: None  # the launcher's count of ranks set up

    def run(self):
        try:
            self._run()
        except Exception as e:  # noqa: BLE001 (reported, and the job counted as failed)
            self.error = f"{type(e).__name__}: {e}"
            for b in (self.step, self.meet):
                try:
                    b.abort()
                except Exception:  # noqa: BLE001
                    pass

    def _check(self, what: str, got, want):
        import torch
        if not torch.equal(got, want):
            self.wrong.append(f"rank {self.rank}: {what}")

    def _run(self):
        import torch

        from wirespeed.native import rendezvous
        r, n = self.rank, self.world
        self.go.wait()
        t0 = time.monotonic()
        g = rendezvous.rendezvous(self.store, r, n, datetime.timedelta(seconds=self.timeout), self.knobs, self.room)
        self.group = g
        self.rec.update(setup_s=time.monotonic() - t0, store=rendezvous.last_setup_here(),
                        streams_setup=g.tcp_streams())
        self.set_up()
        self.step.wait()
        for nbytes in (SMALL, self.mid) if "all_reduce" in self.ops else ():
            cnt = nbytes // 4
            t = torch.full((cnt,), float(r + 1))
            g.all_reduce(t.data_ptr(), cnt, F32, SUM, t, True)
            self._check(f"all_reduce {nbytes} B", t, torch.full((cnt,), float(n * (n + 1) // 2)))
        self.rec["streams_all_reduce"] = g.tcp_streams()
        self.step.wait()
        for nbytes in (SMALL, self.mid):
            each = max(nbytes // 4 // n, 1)  # the whole output is ~nbytes
            if "all_gather" in self.ops:
                send = torch.full((each,), float(r))
                out = torch.empty(n * each)
                g.all_gather_flat(send.data_ptr(), out.data_ptr(), each * 4, (send, out), True)
                self._check(f"all_gather {nbytes} B", out, torch.arange(n, dtype=torch.float32).repeat_interleave(each))
            if "reduce_scatter" in self.ops:
                send = (torch.arange(n, dtype=torch.float32) + r).repeat_interleave(each)
                out = torch.empty(each)
                g.reduce_scatter_flat(send.data_ptr(), out.data_ptr(), each, F32, SUM, (send, out), True)
                self._check(f"reduce_scatter {nbytes} B", out, torch.full((each,), float(n * r + n * (n - 1) // 2)))
            if "all_to_all" in self.ops:
                send = (torch.arange(n, dtype=torch.float32) + 1000 * r).repeat_interleave(each)
                out = torch.empty(n * each)
                sb = [(send.data_ptr() + p * each * 4, each * 4) for p in range(n)]
                rb = [(out.data_ptr() + p * each * 4, each * 4) for p in range(n)]
                g.all_to_all(sb, rb, (send, out), True)
                self._check(f"all_to_all {nbytes} B", out,
                            (torch.arange(n, dtype=torch.float32) * 1000 + r).repeat_interleave(each))
            root = n - 1  # a rank that leads no host when hosts hold 2 ranks or more
            if "gather" in self.ops:
                send = torch.full((each,), float(r))
                out = torch.empty(n * each if r == root else 0)
                rb = [(out.data_ptr() + p * each * 4, each * 4) for p in range(n)] if r == root else []
                g.gather((send.data_ptr(), each * 4), rb, root, (send, out), True)
                if r == root:
                    self._check(f"gather {nbytes} B", out, torch.arange(n, dtype=torch.float32).repeat_interleave(each))
            if "scatter" in self.ops:
                send = torch.arange(n if r == root else 0, dtype=torch.float32).repeat_interleave(each)
                out = torch.empty(each)
                sb = [(send.data_ptr() + p * each * 4, each * 4) for p in range(n)] if r == root else []
                g.scatter(sb, (out.data_ptr(), each * 4), root, (send, out), True)
                self._check(f"scatter {nbytes} B", out, torch.full((each,), float(r)))
        if "barrier" in self.ops:
            g.barrier(True)
        self.rec["streams_all"] = g.tcp_streams()
        # Every rank (and the launcher) meets here, then waits while the launcher counts the
        # process's files, threads and memory with every group alive and idle.
        self.meet.wait()
        self.leave.wait(self.timeout * 2)


def _spread(xs: list[float]) -> dict:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def rehearse(ranks: int, hosts: int, timeout: float = 120.0, mid_kib: int = 64, nstreams: int = 12,
             ops: tuple[str, ...] = OPS, cyclic: bool = False) -> dict:
    """Run the rehearsal; its record (see the module's opening). Raises SystemExit with one line
    on a layout it cannot run."""
    if hosts < 1 or ranks % hosts:
        raise SystemExit(f"scale_rehearsal: {ranks} ranks do not fill {hosts} hosts in equal blocks")
    import torch  # noqa: F401 (imported once, before any rank starts)
    from torch.distributed import TCPStore

    from wirespeed import _native
    from wirespeed import scalemodel as sm
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise SystemExit(f"scale_rehearsal: no op {bad[0]!r}; choose from {', '.join(OPS)}")
    # The all_to_all's pieces (the mid buffer cut in N) above the leaders' threshold (plan.rs
    # A2A_LEADERS_MAX) go directly to every rank.
    a2a_max = int(os.environ.get("WIRESPEED_A2A_LEADERS_MAX", 16 << 10))
    need = fd_need(ranks, hosts, nstreams, "all_to_all" in ops and max(mid_kib * 1024 // 4 // ranks, 1) * 4 > a2a_max,
                   sm.leaders_largest_message(hosts, ranks // hosts, mid_kib * 1024))
    soft, hard = raise_open_files(need)
    knobs = {"WIRESPEED_IFNAME": "lo", "WIRESPEED_NSTREAMS": str(nstreams)}
    # What a rank's own process would publish: the room of this process before any rank starts.
    room = _native.fd_room(knobs)
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=timeout),
                      wait_for_workers=False)
    before, files_before = _status(), _open_files()
    go = threading.Event()
    # Each rank's own client of the store, as each process of a real job has, made here one after
    # the other: made at once by many threads of one process, torch's clients stalled ~5 s.
    clients = [TCPStore("127.0.0.1", master.port, is_master=False, timeout=datetime.timedelta(seconds=timeout),
                        wait_for_workers=False) for _ in range(ranks)]
    lay = host_of(ranks, hosts, cyclic)
    rs = [Rank(r, ranks, lay[r], clients[r], timeout, knobs, room, mid_kib * 1024, go, ops) for r in range(ranks)]
    step = threading.Barrier(ranks, timeout=timeout * 2)
    meet = threading.Barrier(ranks + 1, timeout=timeout * 4)
    leave = threading.Event()
    # The process's CPU time from the go to the last rank set up: all ranks' setup and the
    # store's serving of them, the part that a real job spreads over its hosts (per rank below).
    done, lock, all_set = [0], threading.Lock(), threading.Event()

    def set_up():
        with lock:
            done[0] += 1
            if done[0] == ranks:
                all_set.set()
    for r in rs:
        r.step, r.meet, r.leave, r.set_up = step, meet, leave, set_up
        r.start()
    time.sleep(0.2)  # every rank thread waits for the go
    t0 = time.monotonic()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    go.set()
    all_set.wait(timeout * 2)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    setup_cpu_s = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    try:
        meet.wait()
    except threading.BrokenBarrierError:
        pass
    job_s = time.monotonic() - t0
    after, files_after = _status(), _open_files()
    leave.set()
    for r in rs:
        r.join(timeout)
    errors = [f"rank {r.rank}: {r.error}" for r in rs if r.error]
    if any(r.is_alive() for r in rs):
        errors.append(f"{sum(r.is_alive() for r in rs)} ranks still running after {timeout * 4:.0f} s")
    wrong = [w for r in rs for w in r.wrong]
    recs = [r.rec for r in rs if "streams_all" in r.rec]
    k = ranks // hosts
    out: dict = {"ranks": ranks, "hosts": hosts, "per_host": k, "layout": "cyclic" if cyclic else "blocked", "nstreams": nstreams, "mid_bytes": mid_kib * 1024,
                 "ops": list(ops), "errors": errors[:10], "failed_ranks": len(errors), "wrong": len(wrong),
                 "wrong_lines": wrong[:10], "job_s": job_s, "open_files_limit": soft, "open_files_need": need,
                 "load_avg": os.getloadavg()[0], "cpus": os.cpu_count(),
                 "setup_cpu_s": setup_cpu_s, "setup_cpu_ms_per_rank": setup_cpu_s / ranks * 1e3}
    if len(recs) == ranks:
        largest = sm.leaders_largest_message(hosts, k, mid_kib * 1024)
        st = [r["store"] for r in recs]
        model = [sm.store_load(lay, r["rank"]) for r in recs]
        out.update(
            setup_s=_spread([r["setup_s"] for r in recs])["max"],
            setup_s_ranks=_spread([r["setup_s"] for r in recs]),
            store_keys_read_job=sum(s["keys_read"] for s in st),
            store_keys_read_job_model=sum(sm.store_load(lay, r).read for r in range(ranks)),
            store_keys_written_job=sum(s["keys_written"] for s in st),
            store_requests_job=sum(s["requests"] for s in st),
            store_bytes_read_job=sum(s["bytes_read"] for s in st),
            store_keys_read_rank=_spread([s["keys_read"] for s in st]),
            store_requests_rank=_spread([s["requests"] for s in st]),
            store_bytes_read_rank=_spread([s["bytes_read"] for s in st]),
            store_model_mismatches=sum((s["keys_written"], s["keys_read"], s["requests"]) !=
                                       (m.written, m.read, m.requests) for s, m in zip(st, model)),
            streams_setup_rank=_spread([r["streams_setup"] for r in recs]),
            streams_all_reduce_rank=_spread([r["streams_all_reduce"] for r in recs]),
            max_streams_per_rank=max(r["streams_all"] for r in recs),
            # A pair opens one stream, and all of them from a message of grow_at bytes on.
            largest_leader_message=largest,
            max_streams_model=max(sm.streams_after_collectives(lay, r, nstreams, largest) for r in range(ranks)),
            max_streams_all_opened=max(sm.streams_after_collectives(lay, r, nstreams) for r in range(ranks)),
            max_streams_full_mesh=max(sm.tcp_sockets(lay, r, nstreams) for r in range(ranks)),
            streams_all_reduce_model=max(sm.tcp_sockets_to(lay, r, sm.small_all_reduce_peers(lay, r), nstreams,
                                                         mid_kib * 1024) for r in range(ranks)),
            threads_per_rank=(after["Threads"] - before["Threads"] - ranks) / ranks,  # the rank threads aside
            rss_before_mb=before["VmRSS"] / 1024, rss_after_mb=after["VmRSS"] / 1024,
            rss_per_rank_mb=(after["VmRSS"] - before["VmRSS"]) / 1024 / ranks,
            open_files_job=files_after - files_before,
        )
        # A rank's files: its own TCP streams plus its share of the rest (store ends, listener,
        # pidfds, memfd, reactor), which one process cannot attribute rank by rank.
        total_streams = sum(r["streams_all"] for r in recs)
        other = (files_after - files_before - total_streams) / ranks
        out["open_files_other_per_rank"] = other
        out["max_open_files_per_rank"] = round(out["max_streams_per_rank"] + other)
    for r in rs:  # close in this thread: the groups' workers stop, their sockets close
        if r.group is not None:
            r.group.close()
    return out


def report(o: dict) -> str:
    lines = [f"{o['ranks']} ranks on {o['hosts']} hosts x {o['per_host']}, {o['layout']} (threads of one process, "
             f"load {o['load_avg']:.1f} on {o['cpus']} CPUs), {o['nstreams']} streams, ops {', '.join(o['ops'])}: "
             f"{o['wrong']} wrong, {o['failed_ranks']} failed, {o['job_s']:.1f} s in all"]
    lines += [f"  error: {e}" for e in o["errors"]] + [f"  wrong: {w}" for w in o["wrong_lines"]]
    if "setup_s" in o:
        s = o["setup_s_ranks"]
        lines += [
            f"  setup s per rank: min {s['min']:.2f} median {s['median']:.2f} max {s['max']:.2f}; the process's CPU "
            f"time until all were set up {o['setup_cpu_s']:.2f} s, {o['setup_cpu_ms_per_rank']:.1f} ms per rank",
            f"  store per job: keys read {o['store_keys_read_job']:,} (model {o['store_keys_read_job_model']:,}), "
            f"written {o['store_keys_written_job']:,}, requests {o['store_requests_job']:,}, "
            f"bytes read {o['store_bytes_read_job']:,}; ranks whose counts differ from the model: "
            f"{o['store_model_mismatches']}",
            f"  store per rank: keys read {o['store_keys_read_rank']['median']:.0f} (max {o['store_keys_read_rank']['max']}), "
            f"requests {o['store_requests_rank']['median']:.0f} (max {o['store_requests_rank']['max']}), "
            f"bytes read {o['store_bytes_read_rank']['median']:.0f} (max {o['store_bytes_read_rank']['max']})",
            f"  TCP streams per rank: after setup max {o['streams_setup_rank']['max']}, after the all_reduces max "
            f"{o['streams_all_reduce_rank']['max']} (model {o['streams_all_reduce_model']}), after all max "
            f"{o['max_streams_per_rank']} (model, through the leaders: {o['max_streams_model']}, their largest message "
            f"{o['largest_leader_message']:,} B; all their streams opened: {o['max_streams_all_opened']}; every remote "
            f"pair: {o['max_streams_full_mesh']})",
            f"  open files: {o['open_files_job']:,} for the job, max per rank ~{o['max_open_files_per_rank']} "
            f"({o['open_files_other_per_rank']:.1f} besides streams); limit {o['open_files_limit']:,}, "
            f"need estimated {o['open_files_need']:,}",
            f"  per rank: threads added {o['threads_per_rank']:.2f}, RSS added {o['rss_per_rank_mb']:.2f} MB"]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--hosts", type=int, required=True)
    ap.add_argument("--json", help="append the record to this file (one JSON object a line)")
    ap.add_argument("--timeout", type=float, default=120.0, help="the groups' timeout, s")
    ap.add_argument("--mid-kib", type=int, default=64)
    ap.add_argument("--nstreams", type=int, default=12)
    ap.add_argument("--cyclic", action="store_true", help="deal ranks to hosts round-robin, not in blocks")
    ap.add_argument("--ops", default=",".join(OPS),
                    help="comma-separated, in this order whatever the order given (default: all)")
    a = ap.parse_args(argv)
    ops = tuple(o for o in a.ops.split(",") if o)
    try:
        o = rehearse(a.ranks, a.hosts, a.timeout, a.mid_kib, a.nstreams, ops, a.cyclic)
    except OSError as e:  # EMFILE, where the estimate fell short: the ranks' threads still hold it
        print(f"scale_rehearsal: {e}; run fewer ranks or ops, or fewer streams (--nstreams)", flush=True)
        os._exit(1)
    print(report(o), flush=True)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(o) + "\n")
    ok = not o["wrong"] and not o["failed_ranks"]
    # The ranks' groups hold sockets and threads; leave without tearing down 1,000 of them twice.
    sys.stdout.flush()
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
