"""Flags that several commands share, declared (and where they have one, validated) once: how many
iterations and how long to wait (-w/-n/-T), which ranks run (--backend/--device/-N/--master-port),
and where they run (--cluster/--ranks-per-host/--host-per-rank). Each command says only what its
iterations count and its buffers hold."""
from __future__ import annotations

from .common import add, positive_int


def iterations(p, *, warmup: str, iters: str, unit: str, timeout: str = "300",
               timed: str | None = None, who: str = "a rank gives up"):
    """-w/--warmup-iters, -n/--iters (`unit`: "iterations per size", ...), -T/--timeout."""
    add(p, "-w", "--warmup-iters", default=warmup, help=f"untimed {unit}")
    add(p, "-n", "--iters", default=iters, help=timed or f"timed {unit}")
    add(p, "-T", "--timeout", default=timeout, help=f"seconds without progress before {who}")


def ranks(p, *, holds: str = "the buffers", backends: str = "gloo, nccl, ...",
          default_backend: str = "nccl with GPUs, else gloo", nproc: str | None = None,
          nproc_help: str = "local ranks to spawn when not under a launcher", port: bool = True):
    """--backend, --device (`holds`: where what lives), -N/--nproc and, for commands that spawn
    local ranks, --master-port."""
    add(p, "--backend", default=None, help=f"{backends} (default: {default_backend})")
    add(p, "--device", default=None, choices=("cpu", "cuda"), help=f"where {holds} live")
    add(p, "-N", "--nproc", default=nproc, help=nproc_help)
    if port:
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
