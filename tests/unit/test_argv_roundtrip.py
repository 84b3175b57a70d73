"""Every argv a command builds for a child (compare's and tune's `bench`, train's single-backend
`train`) is the inverse of that command's parser: parsing it with the real parser and reading it
with the real config_from_args gives back the settings it was built from. And every flag of the
child's parser is either forwarded by the builder or named below as deliberately left out, so a
flag added to bench (or train) fails here until its builders forward it or say why not."""
from dataclasses import replace

import pytest

from wirespeed.cli.main import build_parser
from wirespeed.compare.runner import BenchRun

# A run whose every field differs from bench's defaults, so each forwarded flag shows.
BENCH_RUN = BenchRun(backend="gloo", device="cpu", nproc=3, collectives=["all_gather", "broadcast"],
                     dtypes=["float16", "int32"], ops=["max", "min"], sizes=[16, 4096, 1 << 20],
                     iters=7, warmup_iters=2, timeout_s=42.5, cluster="wsx", ranks_per_host=2,
                     host_per_rank=True)
TUNE_RUN = replace(BENCH_RUN, extra=("--no-per-op",))   # tune times the loop only

# bench's flags no compare or tune child gets, each with its reason.
BENCH_NOT_FORWARDED = {
    "plan",            # compare and tune time collectives, not MSCCL++ plans
    "minbytes", "maxbytes", "stepfactor", "stepbytes",   # the sizes go explicit (--sizes)
    "root",            # broadcast and reduce from rank 0, bench's default
    "no_check",        # every child checks every result
    "per_op_stats",    # a table column; the records carry p50/p99 anyway
    "format", "csv", "plot", "save_dir",   # the parent renders and saves; the child writes --json
    "master_port",     # each child's spawn picks a free port
    "fast_net",        # NCCL's plugin is not something compare or tune switch
    "trace",           # a trace is one bench run's; compare and tune run many, and trace none
    "no_per_op",       # compare keeps bench's default; tune's BenchRun.extra adds it (TUNE_RUN)
}


def parse(argv):
    return build_parser().parse_args(argv)


def actions(command: str):
    sub = next(a for a in build_parser()._actions if isinstance(getattr(a, "choices", None), dict))
    return [a for a in sub.choices[command]._actions if a.dest != "help"]


def forwarded_dests(command: str, argv: list[str]) -> set[str]:
    """The dests of `command`'s parser whose flags `argv` gives."""
    by_flag = {o: a.dest for a in actions(command) for o in a.option_strings}
    return {by_flag[w] for w in argv if w in by_flag}


def parser_dests(command: str) -> set[str]:
    return {a.dest for a in actions(command)}


@pytest.mark.parametrize("run", [BENCH_RUN, TUNE_RUN], ids=["compare", "tune"])
def test_a_bench_child_parses_back_to_its_run(run, tmp_path):
    from wirespeed.cli.bench import config_from_args
    json_path = str(tmp_path / "r.jsonl")
    args = parse(run.argv(json_path))
    cfg = config_from_args(args)
    got = BenchRun(cfg.backend, cfg.device, cfg.nproc, cfg.collectives, cfg.dtypes, cfg.ops, cfg.sizes,
                   cfg.iters, cfg.warmup_iters, cfg.timeout_s, args.cluster, args.ranks_per_host,
                   cfg.host_per_rank, extra=run.extra)
    assert got == run
    assert cfg.per_op == ("--no-per-op" not in run.extra)
    assert (cfg.json_path, cfg.save_dir, cfg.progress, cfg.check) == (json_path, None, False, True)


def test_every_bench_flag_is_forwarded_or_left_out_on_purpose():
    forwarded = forwarded_dests("bench", BENCH_RUN.argv("r.jsonl")) | forwarded_dests("bench", TUNE_RUN.argv("r.jsonl"))
    assert forwarded & BENCH_NOT_FORWARDED == {"no_per_op"}
    assert parser_dests("bench") - forwarded - BENCH_NOT_FORWARDED == set(), \
        "a bench flag neither forwarded by BenchRun.argv nor listed in BENCH_NOT_FORWARDED"


# The wrapper options of each parallel wrapper, every one off its default (each is refused under
# the other wrapper).
DDP_OPTIONS = dict(comm_hook="powersgd:2", threads=3, grad_as_bucket_view=True, static_graph=True,
                   prune_below=12.345678901234567, prune_after=3)
FSDP_OPTIONS = dict(parallel="fsdp", reshard_after_forward=False, prefetch=2, reduce_dtype="bf16",
                    threads=1, timeline=False)


def train_run(options=DDP_OPTIONS, **kw):
    from wirespeed.train.nets import NetSpec
    from wirespeed.train.rank import TrainConfig
    from wirespeed.train.shell import TrainRun
    fields = dict(parallel="ddp", bucket_mb=1.5, optimizer="adamw", backend="wirespeed", device="cpu",
                  nproc=3, warmup_iters=1, iters=4, timeout_s=33.0, whatif_iters=5, timeline=True,
                  trace="/tmp/t.json")
    cfg = TrainConfig(spec=NetSpec("gpt", batch_size=3, image_size=32, layers=1, hidden=16, heads=2,
                                   seq_len=8, vocab=64), **{**fields, **options})
    return TrainRun(cfg, "wirespeed", "/tmp/r.jsonl", "/tmp/r.pt", measured_link_rate="1gbit",
                    what_if_hosts="2,4", what_if_rate="1gbit,10gbit", master_port="29511",
                    cluster="wsx", ranks_per_host=2, **kw)


# train's flags the shell's single-backend children never get, each with its reason.
TRAIN_NOT_FORWARDED = {
    "repeat",          # the shell repeats; each child is one run
    "no_scaling",      # the shell decides on the one-rank run
    "plot", "save_dir",   # the shell plots and saves the comparison; the child writes --json
    "fast_net",        # the shell sets NCCL's plugin variables in the environment its children inherit
    "tune", "budget", "loss_tolerance", "candidates",   # the search is the shell's; each child one run
    "what_if_gpu", "gpu_tflops", "gpu_mfu",   # the shell prices the GPU what-if from the children's records
    "what_if_only",    # starts no child: the shell prices the sharded step from the network's shapes
}


@pytest.mark.parametrize("options", [DDP_OPTIONS, FSDP_OPTIONS], ids=["ddp", "fsdp"])
def test_a_train_child_parses_back_to_its_run(options):
    from wirespeed.cli.train import config_from_args, whatif_from_args
    run = train_run(options)
    args = parse(run.argv())
    backends, cfg = config_from_args(args)
    assert backends == [run.backend] and cfg == replace(run.cfg, backend=run.backend)
    whatif = whatif_from_args(args)
    assert (whatif.hosts, whatif.rates, whatif.measured_bps) == ([2, 4], [10**9, 10**10], 10**9)
    assert (args.json, args.state_out, args.no_save) == (run.json_path, run.state_path, True)
    assert (args.master_port, args.cluster, args.ranks_per_host) == ("29511", "wsx", 2)


def test_every_train_flag_is_forwarded_or_left_out_on_purpose():
    forwarded = forwarded_dests("train", train_run().argv())
    assert forwarded & TRAIN_NOT_FORWARDED == set()
    assert parser_dests("train") - forwarded - TRAIN_NOT_FORWARDED == set(), \
        "a train flag neither forwarded by TrainRun.argv nor listed in TRAIN_NOT_FORWARDED"
