#!/usr/bin/env python3
"""Soak: seeded runs of random checked collectives on the wirespeed backend, with peers killed.

    .venv/bin/python benchmarks/soak.py                                  # 10,000 collectives, local
    sudo .venv/bin/python benchmarks/soak.py --places local,hosts --json soak.json --seed 7

The soak is a sequence of runs, each a fresh job of 2-4 ranks (--worlds) doing a random number of
ops (--ops-per-run), until at least --collectives collectives have been planned. A run's ranks
start locally, on loopback and shared memory, as `wirespeed bench -N` starts them (torchrun's
variables, a job secret, PR_SET_PDEATHSIG), or on 2 emulated hosts (`hosts`: network namespaces,
ranks placed round robin, so ranks on one host share memory and ranks on two talk TCP, as
`wirespeed bench --cluster` places them). Every op is drawn from one seeded generator: a
collective, dtype, op, root, in place or not, a size from 0 B to --max-bytes; in some runs one op
is large (--large-bytes). Each result is checked element by element (soak_rank.py).

In --kill-fraction of the runs (exactly that share of each block of ten), a seeded rank kills
itself with SIGKILL at a seeded point: before init, during setup, between two ops, in the middle
of an op, or in the middle of a large op. The rank kills itself, rather than the driver killing
it after a delay, so that every point is reached whatever the machine's load; it notes the time
first, and the survivors are timed from it.

Checks, per run:
  - every op a rank completed is right (0 wrong elements), and a run without a kill completes
    every planned op on every rank with status 0;
  - in a killed run, every survivor ends by itself with wirespeed's own one-line error (a
    `wirespeed: error: rank R: ...` line, status 3 or 4, no traceback) within --timeout + 1 s of
    the kill; for a peer killed before it joined, from when the survivor began to wait for it (it
    cannot learn of a peer that never came before its own deadline, which starts there). The
    driver does not kill survivors early as wirespeed's launchers do after 2 s: it measures the
    ranks' own ending, and kills only what still runs 10 s past the bound (a hang);
  - nothing is left behind: no process carrying the run's marker, no file in the ranks' TMPDIR,
    no new wirespeed/torch/gloo entry in /dev/shm (each emulated host's /dev/shm too), no process
    in the hosts' namespaces; at the end, no wsnet-NAME-* namespace of the soak's cluster.

Prints one line per run that failed a check (and every run with -v), then the summary; --json
writes the plan, every run's outcome and the summary. Same --seed, same plan. Exit status 1 on any
failed check.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, HERE)

from soak_rank import PHASES, run_rank  # noqa: E402

MARK = "WIRESPEED_SOAK_MARK"
POLL_S = 0.01
HANG_MARGIN_S = 10.0     # past the bound, a survivor still running is a hang: killed and reported
STARTUP_S = 180.0        # a run's ranks importing torch on a loaded 2-core machine: this long, at worst
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "_WIRESPEED_LOCAL_SPAWN")
ERROR_LINE = re.compile(r"^wirespeed: error: rank (\d+): (.+)$")


# ---- the plan ----

def plan_runs(args) -> list[dict]:
    """The runs, drawn from --seed alone: the same seed gives the same plan."""
    rng = random.Random(args.seed)
    worlds = [int(w) for w in args.worlds.split(",")]
    places = args.places.split(",")
    lo, hi = (int(x) for x in args.ops_per_run.split("-"))
    per_block = round(10 * args.kill_fraction)
    runs, planned = [], 0
    while planned < args.collectives:
        if len(runs) % 10 == 0:
            killed_here = set(rng.sample(range(10), per_block))
        world, place = rng.choice(worlds), rng.choice(places)
        ops = rng.randint(lo, hi)
        run = {"run": len(runs), "world": world, "place": place, "ops": ops,
               "seed": rng.randrange(1 << 31), "large_op": -1,
               "large_bytes": int(2 ** rng.uniform(22, 25)), "kill": None}
        if rng.random() < 0.2:
            run["large_op"] = rng.randrange(ops)
        if len(runs) % 10 in killed_here:
            phase = rng.choice(PHASES)
            kill = {"rank": rng.randrange(world), "phase": phase, "op": -1, "delay": 0.0}
            if phase == "setup":
                kill["delay"] = rng.uniform(0.0, 0.15)   # setup takes 0.1-0.3 s here
            if phase in ("between", "mid", "large"):
                kill["op"] = rng.randrange(ops)
            if phase == "mid":
                kill["delay"] = rng.uniform(0.0, 0.002)
            if phase == "large":
                run["large_op"] = kill["op"]
                kill["delay"] = rng.uniform(0.0, 0.05)
            run["kill"] = kill
            planned += max(kill["op"], 0)
        else:
            planned += ops
        runs.append(run)
    return runs


# ---- what a run leaves behind ----

def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return {}


def marked(mark: str) -> list[int]:
    """Live processes (zombies too: a zombie of a run is one nobody reaped) carrying the marker."""
    needle = mark.encode()
    return [int(d) for d in os.listdir("/proc")
            if d.isdigit() and int(d) != os.getpid() and _environ(int(d)).get(MARK.encode()) == needle]


def shm_entries(folder: str = "/dev/shm") -> set[str]:
    try:
        return {n for n in os.listdir(folder) if any(k in n.lower() for k in ("wirespeed", "torch", "gloo"))}
    except FileNotFoundError:
        return set()


def leftovers(run_dir: str, mark: str, shm_before: set[str], cluster) -> list[str]:
    found = [f"process {pid}" for pid in marked(mark)]
    tmp = os.path.join(run_dir, "tmp")
    found += [f"temp {os.path.join(tmp, n)}" for n in sorted(os.listdir(tmp))]
    found += [f"/dev/shm/{n}" for n in sorted(shm_entries() - shm_before)]
    if cluster is not None:
        from wirespeed.netem import cluster as C
        from wirespeed.netem.ns import netns_pids
        for h in cluster.hosts:
            found += [f"{h.netns}:/dev/shm/{n}" for n in sorted(os.listdir(C.shm_dir(h.netns)))]
            found += [f"process {pid} in {h.netns}" for pid in netns_pids(h.netns)]
    return found


# ---- one run ----

def rank_argv(args, run: dict, folder: str) -> list[str]:
    kill = run["kill"] or {"rank": -1, "phase": "", "op": -1, "delay": 0.0}
    return [sys.executable, os.path.abspath(__file__), "--as-rank", "--folder", folder,
            "--ops", str(run["ops"]), "--op-seed", str(run["seed"]), "--max-bytes", str(args.max_bytes),
            "--large-op", str(run["large_op"]), "--large-bytes", str(run["large_bytes"]),
            "--timeout", str(args.timeout), "--kill-rank", str(kill["rank"]),
            "--kill-phase", kill["phase"], "--kill-op", str(kill["op"]),
            "--kill-delay", repr(kill["delay"])]


def start_ranks(args, run: dict, folder: str, mark: str, cluster) -> list[subprocess.Popen]:
    from wirespeed.launch.environment import free_port, with_job_secret
    from wirespeed.launch.local import die_with_parent, rank_env
    base = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    base.update({MARK: mark, "TMPDIR": os.path.join(folder, "tmp"), "PYTHONUNBUFFERED": "1"})
    base = with_job_secret(base)
    argv = rank_argv(args, run, folder)
    world = run["world"]
    if run["place"] == "local":
        port = free_port()
        envs = [rank_env(r, world, port, base) for r in range(world)]
        cmds = [argv] * world
    else:
        from wirespeed.launch.cluster import free_port_in, placement, rank_envs
        from wirespeed.netem import cluster as C
        hosts_of = placement(world, len(cluster.hosts), None)
        h0 = cluster.hosts[hosts_of[0]]
        envs = rank_envs(cluster, hosts_of, free_port_in(h0.netns, h0.addr), base)
        cmds = [[*C.exec_prefix(cluster.hosts[h].netns), *argv] for h in hosts_of]
    procs = []
    for r, (cmd, env) in enumerate(zip(cmds, envs)):
        with open(os.path.join(folder, f"out-{r}"), "w") as o, open(os.path.join(folder, f"err-{r}"), "w") as e:
            procs.append(subprocess.Popen(cmd, env=env, stdout=o, stderr=e, preexec_fn=die_with_parent))
    return procs


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _read_float(path: str):
    try:
        with open(path) as f:
            return float(f.read())
    except (OSError, ValueError):
        return None


def wait_run(args, run: dict, procs, folder: str) -> tuple[list, dict | None]:
    """Each rank's (status, CLOCK_MONOTONIC when it was seen to end), and the kill record. A rank
    still running HANG_MARGIN_S past its bound is killed and its status is None (a hang)."""
    ended: list = [None] * len(procs)
    codes: list = [None] * len(procs)
    started = time.monotonic()
    first_failure = None
    while True:
        now = time.monotonic()
        for r, p in enumerate(procs):
            if codes[r] is None and p.poll() is not None:
                codes[r], ended[r] = p.returncode, now
                if p.returncode != 0 and first_failure is None:
                    first_failure = now
        if all(c is not None for c in codes):
            break
        kill = _read_json(os.path.join(folder, "kill.json"))
        if kill is not None:
            limit = kill["t"] + STARTUP_S if run["kill"]["phase"] == "before-init" else kill["t"]
            limit = max(limit, kill["t"]) + args.timeout + 1 + HANG_MARGIN_S
        elif first_failure is not None:
            limit = first_failure + args.timeout + 1 + HANG_MARGIN_S
        else:
            limit = started + STARTUP_S + run["ops"] * 1.0
        if now > limit:
            for r, p in enumerate(procs):
                if codes[r] is None:
                    p.kill()
                    p.wait()
                    codes[r], ended[r] = "hung", now
            break
        time.sleep(POLL_S)
    return list(zip(codes, ended)), _read_json(os.path.join(folder, "kill.json"))


def judge(args, run: dict, outcome, kill, folder: str) -> dict:
    """The run's record: what each rank did, and every check it failed."""
    res = {"run": run["run"], "world": run["world"], "place": run["place"], "planned_ops": run["ops"],
           "kill": run["kill"], "landed": kill["landed"] if kill else None, "ranks": [],
           "problems": []}
    victim = run["kill"]["rank"] if run["kill"] else -1
    for r, (code, t_end) in enumerate(outcome):
        err = open(os.path.join(folder, f"err-{r}"), errors="replace").read()
        counts = _read_json(os.path.join(folder, f"rank-{r}.json")) or {}
        lines = [ln for ln in err.splitlines() if ln.strip()]
        own = [m for m in map(ERROR_LINE.match, lines) if m and int(m.group(1)) == r]
        rec = {"rank": r, "status": code, "ops": counts.get("ops", 0), "wrong": counts.get("wrong", 0),
               "error": own[-1].group(0) if own else (lines[-1] if lines else "")}
        wrong_file = os.path.join(folder, f"wrong-{r}.txt")
        if os.path.exists(wrong_file):
            rec["wrong_ops"] = open(wrong_file).read().splitlines()[:5]
            rec["wrong"] = max(rec["wrong"], 1)
        if rec["wrong"]:
            res["problems"].append(f"rank {r}: {rec['wrong']} wrong elements: {rec.get('wrong_ops')}")
        if "Traceback" in err or "Exception raised from" in err:   # Python's, or a C++ stack
            res["problems"].append(f"rank {r}: a traceback or stack on stderr: "
                                   f"{next(ln for ln in lines if 'Traceback' in ln or 'Exception raised' in ln)}")
        if r == victim:
            if code != -9:
                res["problems"].append(f"rank {r} (the victim) ended with {code}, not its own SIGKILL")
        elif code == "hung":
            res["problems"].append(f"rank {r} still ran {HANG_MARGIN_S:g} s past its bound: killed")
        elif victim < 0:
            if code != 0 or rec["ops"] + counts.get("skipped", 0) != run["ops"]:
                res["problems"].append(f"rank {r}: status {code} after {rec['ops']} of {run['ops']} "
                                       f"ops, no kill: {rec['error']}")
        elif kill is not None:
            begun = _read_float(os.path.join(folder, f"start-{r}"))
            since = max(kill["t"], begun or kill["t"])
            rec["to_error_s"] = t_end - since
            if code not in (3, 4) or not own:
                res["problems"].append(f"rank {r}: status {code}, not wirespeed's own error: "
                                       f"{rec['error'][:300]}")
            elif len(own) != 1:
                res["problems"].append(f"rank {r}: {len(own)} error lines, not one")
            if rec["to_error_s"] > args.timeout + 1:
                res["problems"].append(f"rank {r}: ended {rec['to_error_s']:.2f} s after the kill, past "
                                       f"the timeout + 1 s ({args.timeout + 1:g} s)")
        res["ranks"].append(rec)
    if victim >= 0 and kill is None:
        res["problems"].append("the victim never reached its kill point")
    res["collectives"] = max((x["ops"] for x in res["ranks"]), default=0)
    return res


def one_run(args, run: dict, soak_dir: str, cluster) -> dict:
    folder = tempfile.mkdtemp(prefix=f"run{run['run']}-", dir=soak_dir)
    os.chmod(folder, 0o755)
    os.makedirs(os.path.join(folder, "tmp"))
    mark = uuid.uuid4().hex
    shm_before = shm_entries()
    procs = start_ranks(args, run, folder, mark, cluster if run["place"] == "hosts" else None)
    try:
        outcome, kill = wait_run(args, run, procs, folder)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    res = judge(args, run, outcome, kill, folder)
    time.sleep(0.05)   # a grandchild reparented at its parent's death needs a moment to be reaped
    res["leftovers"] = leftovers(folder, mark, shm_before, cluster if run["place"] == "hosts" else None)
    res["problems"] += [f"left behind: {x}" for x in res["leftovers"]]
    if res["problems"] and args.keep:
        res["folder"] = folder
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return res


# ---- the soak ----

def summary(runs: list[dict], args, ns_left: list[str]) -> dict:
    survivors = [(x["to_error_s"], r["run"], x["rank"]) for r in runs for x in r["ranks"]
                 if "to_error_s" in x]
    worst = max(survivors, default=None)
    landed: dict[str, int] = {}
    for r in runs:
        if r["kill"]:
            landed[r["kill"]["phase"]] = landed.get(r["kill"]["phase"], 0) + 1
    return {"seed": args.seed, "timeout_s": args.timeout, "runs": len(runs),
            "runs_by_place": {p: sum(r["place"] == p for r in runs) for p in args.places.split(",")},
            "killed_runs": sum(bool(r["kill"]) for r in runs),
            "killed_by_phase": landed,
            "collectives_checked": sum(r["collectives"] for r in runs),
            "rank_ops_checked": sum(x["ops"] for r in runs for x in r["ranks"]),
            "wrong_elements": sum(x["wrong"] for r in runs for x in r["ranks"]),
            "survivors": len(survivors),
            "worst_to_error_minus_timeout_s": None if worst is None else worst[0] - args.timeout,
            "worst_at": None if worst is None else {"run": worst[1], "rank": worst[2]},
            "leftovers": sum(len(r["leftovers"]) for r in runs) + len(ns_left),
            "failed_runs": sum(bool(r["problems"]) for r in runs)}


def cluster_up(name: str):
    from wirespeed.netem import cluster as C
    c, _ = C.up(2, 10 * 10**9, name=name, measure=False)
    return c


def namespaces_left(name: str) -> list[str]:
    from wirespeed.netem import cluster as C
    return C.leftovers(name)


def print_run(res: dict) -> None:
    kill = res["kill"]
    what = (f"rank {kill['rank']} killed {kill['phase']} ({res['landed']})" if kill else "no kill")
    times = ", ".join(f"r{x['rank']} {x['to_error_s']:.2f} s" for x in res["ranks"] if "to_error_s" in x)
    print(f"run {res['run']:>4} {res['place']:>5} {res['world']} ranks {res['collectives']:>4} ops  "
          f"{what}{'; to error: ' + times if times else ''}", flush=True)
    for p in res["problems"]:
        print(f"  FAILED: {p}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--collectives", type=int, default=10000, help="plan runs until this many ops")
    p.add_argument("--worlds", default="2,3,4", help="rank counts a run draws from")
    p.add_argument("--places", default="local", help="local, hosts (2 emulated hosts; root), or both")
    p.add_argument("--ops-per-run", default="50-600", help="range a run's op count is drawn from")
    p.add_argument("--kill-fraction", type=float, default=0.1, help="share of runs with a rank killed")
    p.add_argument("--max-bytes", type=int, default=1 << 20, help="largest buffer of an ordinary op")
    p.add_argument("--timeout", type=float, default=10.0, help="the ranks' --timeout, seconds")
    p.add_argument("--json", default=None, help="write the plan, each run and the summary here")
    p.add_argument("--keep", action="store_true", help="keep the folders of failed runs")
    p.add_argument("--cluster-name", default="", help="name of the 2-host cluster it builds and "
                   "removes (default: a fresh one)")
    p.add_argument("--only", default="", help="run only these runs of the plan (comma list)")
    p.add_argument("-v", "--verbose", action="store_true", help="a line for every run")
    # a rank's own flags (the driver passes them)
    for flag in ("--folder", "--kill-phase"):
        p.add_argument(flag, default="", help=argparse.SUPPRESS)
    for flag in ("--ops", "--op-seed", "--large-op", "--large-bytes", "--kill-rank", "--kill-op"):
        p.add_argument(flag, type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--kill-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--as-rank", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.as_rank:
        args.seed = args.op_seed
        run_rank(args)
    if not set(args.places.split(",")) <= {"local", "hosts"}:
        p.error("--places takes local, hosts or local,hosts")
    plan = plan_runs(args)
    print(f"# soak: seed {args.seed}, {len(plan)} runs of {args.worlds} ranks on {args.places}, "
          f"{sum(bool(r['kill']) for r in plan)} with a rank killed, timeout {args.timeout:g} s, "
          f"wirespeed backend", flush=True)
    name = cluster = None
    results: list[dict] = []
    t0 = time.monotonic()
    if args.only:
        plan = [plan[int(i)] for i in args.only.split(",")]
    soak_dir = tempfile.mkdtemp(prefix="wirespeed-soak-")
    os.chmod(soak_dir, 0o755)
    try:
        if any(r["place"] == "hosts" for r in plan):
            name = args.cluster_name or "soak" + uuid.uuid4().hex[:8]
            cluster = cluster_up(name)
        for run in plan:
            res = one_run(args, run, soak_dir, cluster)
            results.append(res)
            if args.verbose or res["problems"]:
                print_run(res)
    finally:
        if name:
            from wirespeed.netem import cluster as C
            C.down(name)
        if any("folder" in r for r in results):
            print(f"# the failed runs' folders are kept in {soak_dir}")
        else:
            shutil.rmtree(soak_dir, ignore_errors=True)
    ns_left = namespaces_left(name) if name else []
    s = summary(results, args, ns_left)
    s["seconds"] = time.monotonic() - t0
    w = s["worst_to_error_minus_timeout_s"]
    print(f"runs {s['runs']} ({', '.join(f'{k} {v}' for k, v in s['runs_by_place'].items())}), "
          f"killed {s['killed_runs']} ({', '.join(f'{k} {v}' for k, v in sorted(s['killed_by_phase'].items()))})"
          f", collectives checked {s['collectives_checked']} ({s['rank_ops_checked']} rank-ops), "
          f"wrong elements {s['wrong_elements']}")
    print(f"survivors {s['survivors']}, worst time to error minus timeout "
          + ("n/a" if w is None else f"{w:+.2f} s (run {s['worst_at']['run']}, rank {s['worst_at']['rank']})")
          + f", leftovers {s['leftovers']}{' (namespaces: ' + ', '.join(ns_left) + ')' if ns_left else ''}"
          f", failed runs {s['failed_runs']}, {s['seconds']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": s, "plan": plan, "runs": results}, f, indent=1)
    return 1 if s["failed_runs"] or s["leftovers"] or s["wrong_elements"] else 0


if __name__ == "__main__":
    sys.exit(main())
