"""Flags that several commands share, declared (and where they have one, validated) once: how many
iterations and how long to wait (-w/-n/-T), which sizes (-b/-e/-f/--sizes), which ranks run (--backend/--device/-N/--master-port),
where they run (--cluster/--ranks-per-host/--host-per-rank), and what a command writes (`output`:
every file or directory flag, proven writable by `check_outputs` before any work). Each command
says only what its iterations count and its buffers hold."""
from __future__ import annotations

from .common import add, positive_int


def iterations(p, *, warmup: str, iters: str, unit: str, timeout: str = "300",
               timed: str | None = None, who: str = "a rank gives up"):
    """-w/--warmup-iters, -n/--iters (`unit`: "iterations per size", ...), -T/--timeout."""
    add(p, "-w", "--warmup-iters", default=warmup, help=f"untimed {unit}")
    add(p, "-n", "--iters", default=iters, help=timed or f"timed {unit}")
    add(p, "-T", "--timeout", default=timeout, help=f"seconds without progress before {who}")


def sweep(p, *, minbytes: str, factor: str, stepbytes: bool = False, min_help: str = "smallest size"):
    """-b/--minbytes, -e/--maxbytes, -f/--stepfactor (with `stepbytes`, bench's -i/--stepbytes too)
    and --sizes: the sizes of bench, compare and tune, each with its own defaults; `sizes` reads
    them back."""
    add(p, "-b", "--minbytes", default=minbytes, help=min_help)
    add(p, "-e", "--maxbytes", default="64M", help="largest size")
    add(p, "-f", "--stepfactor", default=factor, help="multiply the size by this each step")
    if stepbytes:
        add(p, "-i", "--stepbytes", default=None, help="add this many bytes each step instead of -f")
    add(p, "--sizes", default=None, help="explicit comma list of sizes instead of -b/-e/-f")


def sizes(args) -> list[int]:
    """The sizes `sweep`'s flags ask for (sizes.sizes_from_flags checks them)."""
    from ..sizes import sizes_from_flags
    return sizes_from_flags(args.sizes, args.minbytes, args.maxbytes, args.stepfactor,
                            getattr(args, "stepbytes", None))


def ranks(p, *, holds: str = "the buffers", backends: str = "gloo, nccl, ...",
          default_backend: str = "nccl with GPUs, else gloo", nproc: str | None = None,
          nproc_help: str = "local ranks to spawn when not under a launcher", port: bool = True):
    """--backend, --device (`holds`: where what lives), -N/--nproc and, for commands that spawn
    local ranks, --master-port."""
    add(p, "--backend", default=None, help=f"{backends} (default: {default_backend})")
    add(p, "--device", default=None, choices=("cpu", "cuda"), help=f"where {holds} live")
    add(p, "-N", "--nproc", default=nproc, help=nproc_help)
    if port:
        # Only commands that start local ranks take a port; those ranks re-run the command line.
        p.set_defaults(_runs_ranks=True)
        add(p, "--master-port", default=None, help="rendezvous port for local ranks (default: a free one)")


def placement(p, *, what: str = "the ranks", rph: str = "place ranks in blocks of this many per host",
              host_per_rank: bool = True):
    """--cluster, --ranks-per-host (a whole number of at least 1) and --host-per-rank."""
    add(p, "--cluster", nargs="?", const="ws", default=None, metavar="NAME",
        help=f"run {what} on the emulated cluster (`wirespeed cluster up`), one per host round robin")
    add(p, "--ranks-per-host", default=None, type=positive_int("--ranks-per-host", 1), help=f"with --cluster: {rph}")
    if host_per_rank:
        add(p, "--host-per-rank", action="store_true",
            help="give every rank a host id of its own (NCCL_HOSTID, WIRESPEED_HOSTID): libraries treat "
            "the ranks as nodes of a cluster, and several NCCL ranks may share one GPU")


def output(p, *names, what: str = "file", unused_with: tuple[str, ...] = (), twin: bool = True, **kw):
    """An output flag (`what`: a "file" or a "dir"), declared with `add` and remembered on the
    parser, so `check_outputs` proves it writable before the command does any work: a long sweep
    must never end in a traceback with its results lost. `unused_with`: flags (dests) that make
    this output unused (--no-save, --from), so an unwritable default is not held against them.
    twin=False: no WIRESPEED_* twin (plot's -o, which never had one)."""
    action = add(p, *names, **kw) if twin else p.add_argument(*names, **kw)
    p.set_defaults(_outputs=[*(p.get_default("_outputs") or ()), (names[0], action.dest, what,
                                                                     unused_with)])
    return action


def check_outputs(args) -> None:
    """Every declared output of the command in `args`, checked at once (main does this before a
    command runs; a one-line UsageError names the first that cannot be written)."""
    from ..report.outputs import check_outputs as check
    files, dirs = {}, {}
    for flag, dest, what, unused_with in getattr(args, "_outputs", None) or ():
        if not any(getattr(args, u, None) for u in unused_with):
            (files if what == "file" else dirs)[flag] = getattr(args, dest, None)
    check(files=files, dirs=dirs)
