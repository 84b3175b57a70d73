"""One rank of `wirespeed bench`, its backend started (cli/bench.py parses the flags and starts the
ranks): the checks that need the world size, the header, every case through the harness, and on
rank 0 the table, records and plot."""
from __future__ import annotations

import os
import sys
import time

from ..errors import UsageError
from ..faults import rank_error
from ..report.records import record
from .config import BenchConfig
from .fastnet import fast_net_unproven


def validate_for_world(cfg: BenchConfig, world: int) -> None:
    if cfg.plan:
        from .harness import plan_collective
        plan = plan_collective(cfg).plan
        if plan.nranks != world:
            raise UsageError(f"{cfg.plan}: the plan is for {plan.nranks} ranks, the job has {world}")
    if cfg.root >= world:
        raise UsageError(f"--root {cfg.root} is not a rank of a {world}-rank job (ranks 0..{world - 1})")


def _gpu_sharing(backend, device: str, cfg: BenchConfig) -> list[str]:
    """Header lines when ranks share a GPU (launch/gpus.py); every rank must call it."""
    from ..launch.gpus import gpu_id, host_id, mps_running, sharing_lines
    hosts, gpus = backend.allgather_text(host_id()), backend.allgather_text(gpu_id(device))
    return sharing_lines(hosts, gpus, cfg.backend, mps_running())


def before_start(cfg: BenchConfig, info) -> None:
    from .memory import check_fits
    validate_for_world(cfg, info.world_size)
    from ..launch.environment import nccl_log_dir, spawned_here
    if not spawned_here():
        # Under an outer launcher nobody checked memory yet; each host's ranks check their share.
        check_fits(cfg.collectives, cfg.dtypes, cfg.sizes, info.world_size, info.local_world_size,
                   cfg.device)
    if cfg.host_per_rank:
        from ..launch.gpus import set_host_per_rank
        set_host_per_rank(info.rank)  # before the backend starts: libraries read it at init
    if cfg.backend == "nccl" and nccl_log_dir():
        # Here too: a rank on another machine (ssh, srun) has no folder the launcher made.
        os.makedirs(nccl_log_dir(), exist_ok=True)


def run_as_rank(cfg: BenchConfig, info, backend, device) -> int:
    """One rank of the job, its backend started: run every case, and on rank 0 report."""
    from .harness import run_rank, steps
    from ..envinfo import record_env
    from ..report.progress import Progress

    lead = info.rank == 0
    records = []
    env = record_env() if lead else {}
    from ..launch.cluster import host_link_sent_bytes
    from ..launch.environment import link_fields
    link = link_fields()  # link_rate_gbps etc. when the ranks run on the emulated cluster
    run_id = time.strftime("%Y%m%d-%H%M%S")
    progress = Progress(sum(1 for _ in steps(cfg)), enabled=lead and cfg.progress)
    try:
        env["hosts"] = backend.host_names()
        from .agreement import check_same_settings
        check_same_settings(backend, cfg, info.rank)  # else a rank would meet the wrong collective
        shared = _gpu_sharing(backend, device, cfg) if cfg.device == "cuda" else []
        if lead:
            _print_header(cfg, info, env, shared)
        trace = None
        if cfg.tracing:
            from .tracing import Trace
            trace = Trace(backend, info.rank, info.world_size, cfg.trace_path)

        def keep(m):
            if lead:
                records.append(record("bench", {"run_id": run_id, "backend": cfg.backend,
                                "device": cfg.device, "world_size": info.world_size, **m, **link, "env": env}))
        total_wrong = run_rank(cfg, info, backend, device, keep, progress.advance,
                               host_link_sent_bytes(), trace)
    except Exception as e:   # wirespeed's own errors pass as they are; a library's (the transport's too) names its rank
        progress.close()
        raise rank_error(info.rank, e) from None
    finally:
        progress.close()
    if lead:
        _report(cfg, records, run_id)
        if trace is not None:
            spans = trace.finish()
            print(f"# trace: {spans} spans of {info.world_size} ranks in {cfg.trace_path} "
                  "(chrome://tracing, ui.perfetto.dev)")
            sys.stdout.flush()
    if cfg.backend == "nccl" and fast_net_unproven(backend, info):
        return 1
    if total_wrong:
        if lead:
            sys.stderr.write(f"wirespeed: error: {total_wrong} wrong elements: the backend returned "
                             "wrong data (see the #wrong column)\n")
        return 1
    return 0


def _print_header(cfg, info, env, shared=()) -> None:
    v = env.get("versions", {})
    print(f"# wirespeed {v.get('wirespeed')} bench: backend {cfg.backend}, device {cfg.device}, "
          f"{info.world_size} ranks, torch {v.get('torch')}")
    print(f"# iters {cfg.iters}, warmup {cfg.warmup_iters}, check {'on' if cfg.check else 'off'}, "
          f"timeout {cfg.timeout_s:g} s; {time_method_text(cfg)}; GB/s = 1e9 B/s")
    if cfg.tracing:
        print("# --trace: two clock reads around every timed call, inside the loops' times")
    if cfg.backend == "nccl" and os.environ.get("NCCL_NET") == "wirespeed":
        print(f"# NCCL network: the wirespeed plugin {os.environ.get('NCCL_NET_PLUGIN')} (--fast-net)")
    for r, h in enumerate(env.get("hosts", [])):
        print(f"#  Rank {r:3d} on {h}")
    if cfg.host_per_rank:
        print("# --host-per-rank: every rank has a host id of its own (NCCL_HOSTID, WIRESPEED_HOSTID), "
              "so the backends connect the ranks as nodes of a cluster, over the network stack")
    for line in shared:
        print(line)
    if cfg.plan:
        from .harness import plan_collective
        coll = plan_collective(cfg)
        p = coll.plan
        print(f"# plan {p.name!r} ({cfg.plan}): {p.collective}, {p.protocol}, "
              f"{'in place' if p.inplace else 'out of place'}, executed by {p.nranks} CPU ranks "
              "(shared memory on a host, wirespeed's engine for port channels)")
        coll.sizes(cfg.sizes)   # what it rounds or skips, said once, here
        for note in coll.notes:
            print(f"# plan {note}")
    print("#")
    sys.stdout.flush()


def time_method_text(cfg: BenchConfig) -> str:
    from .harness import LOOPS
    text = (f"time = median of up to {LOOPS} loops of {cfg.iters} calls back to back (a loop: one sync, "
            f"elapsed / {cfg.iters}, slowest rank; nccl-tests' mean over ranks in records)")
    if cfg.per_op_columns:
        text += "; p50/p99 = of single calls, each synced, slowest rank per call"
    return text


def _report(cfg: BenchConfig, records, run_id) -> None:
    from ..report.plot import plot_records
    from ..report.records import write_csv, write_jsonl
    from ..report.table import footer, link_summary, markdown_table, nccl_table
    print(markdown_table(records) if cfg.format == "md" else nccl_table(records, cfg.per_op_columns))
    print(footer(records))
    if link_summary(records):
        print(link_summary(records))
    if cfg.json_path:
        write_jsonl(cfg.json_path, records)
    if cfg.csv_path:
        write_csv(cfg.csv_path, records)
    if cfg.plot_path:
        plot_records(records, cfg.plot_path, title=f"wirespeed bench ({cfg.backend}, {cfg.device})")
    if cfg.save_dir:
        d = os.path.join(cfg.save_dir, run_id)
        if os.path.exists(d):
            d = f"{d}-{os.getpid()}"
        write_jsonl(os.path.join(d, "records.jsonl"), records)
        plot_records(records, os.path.join(d, "plot.png"), title=f"wirespeed bench ({cfg.backend}, {cfg.device})")
        print(f"# saved records and plot in {d}/")
    sys.stdout.flush()
