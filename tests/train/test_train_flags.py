"""`wirespeed train`'s refusals (one line, exit 2, no traceback, before any rank starts) and the
checks behind its verdicts: ranks' digests, parameters across backends, the quotable line."""
import pytest
import torch

from wirespeed.cli.main import main
from wirespeed.train.shell import _median_run, param_difference, quote
from wirespeed.errors import RanksDisagree
from wirespeed.report.records import load, write_jsonl
from wirespeed.train.rank import check_digests

pytestmark = pytest.mark.timeout(60)

GPT = ["--model", "gpt", "--layers", "2", "--hidden", "32"]


@pytest.mark.parametrize("args,needle", [
    ([], "which network"),
    (["--model", "resnet51"], "unknown --model 'resnet51'"),
    (["--model", "gpt2"], "unknown --model 'gpt2'"),            # transformers' gpt2 is `model`'s, not ours
    ([*GPT, "--parallel", "zero3"], "--parallel zero3: choose ddp or fsdp"),
    ([*GPT, "--optimizer", "adam"], "--optimizer adam: choose sgd or adamw"),
    ([*GPT, "--parallel", "fsdp", "--timeline"], "--timeline times DDP's buckets"),
    ([*GPT, "--batch-size", "0"], "--batch-size must be at least 1"),
    ([*GPT, "--batch-size", "lots"], "--batch-size must be a number"),
    ([*GPT, "--layers", "-1"], "--layers must not be negative"),
    (["--model", "gpt", "--hidden", "30"], "multiple of --heads"),
    (["--model", "resnet18", "--image-size", "8"], "--image-size 8 is too small for resnet18"),
    (["--model", "alexnet", "--image-size", "32"], "at least 63 px"),
    (["--model", "inception_v3", "--image-size", "224"], "at least 299 px"),
    (["--model", "resnet50", "--image-size", "32", "--batch-size", "1"], "one value per channel"),
    ([*GPT, "--bucket-mb", "0"], "--bucket-mb must be positive"),
    ([*GPT, "--bucket-mb", "flat"], "--bucket-mb must be a number"),
    ([*GPT, "--backend", "gloo,gloo"], "named twice"),
    ([*GPT, "--backend", "gloo,"], None),                          # a trailing comma is harmless
    ([*GPT, "--backend", ","], "at least one backend"),
    ([*GPT, "--backend", "carrier-pigeon"], "unknown backend"),
    ([*GPT, "--backend", "gloo,nccl"], "different devices"),
    ([*GPT, "--backend", "gloo,mpi"], "--backend mpi: train needs a torch.distributed MPI"),
    ([*GPT, "-n", "0"], "--iters must be at least 1"),
    ([*GPT, "-T", "0"], "--timeout must be positive"),
    ([*GPT, "-N", "0"], "--nproc must be at least 1"),
    ([*GPT, "--ranks-per-host", "2"], "add --cluster"),
    ([*GPT, "--repeat", "0"], "--repeat must be at least 1"),
    ([*GPT, "--json", "/proc/x.jsonl"], "cannot write"),
    # float flags take no inf or nan (an inf bucket failed 49 s into the run on 482a6d1)
    ([*GPT, "--bucket-mb", "inf"], "--bucket-mb must be a finite number"),
    ([*GPT, "--bucket-mb", "nan"], "--bucket-mb must be a finite number"),
    ([*GPT, "-T", "inf"], "--timeout must be a finite number"),
    # sized from the flags before anything is built or trained (482a6d1: minutes building a
    # million layers; a trillion what-if hosts trained, then grew rank 0 to 21 GB)
    (["--model", "gpt", "--layers", "1000000"], "at most 2048 blocks"),
    (["--model", "gpt", "--layers", "2048", "--hidden", "4096"], "needs at least"),   # the floor from the flags
    ([*GPT, "--what-if-hosts", "1000000000000", "--measured-link-rate", "1gbit"], "262144 ranks or fewer"),
    ([*GPT, "--what-if-hosts", "131072", "-N", "4", "--measured-link-rate", "1gbit"], "262144 ranks or fewer"),
    ([*GPT, "--what-if-hosts", "\u00b2", "--measured-link-rate", "1gbit"], "host counts of 2 or more"),
    # the wrappers' options (train/hooks.py), and --tune's
    ([*GPT, "--comm-hook", "fp8"], "--comm-hook fp8: choose from none, fp16, bf16, powersgd:RANK"),
    ([*GPT, "--comm-hook", "powersgd:0"], "PowerSGD's rank must be a whole number from 1"),
    ([*GPT, "--comm-hook", "powersgd:"], "PowerSGD's rank must be a whole number from 1"),
    ([*GPT, "--threads", "-2"], "--threads must not be negative"),
    ([*GPT, "--threads", "many"], "--threads must be a number"),
    ([*GPT, "--parallel", "fsdp", "--comm-hook", "fp16"], "--comm-hook is a DDP option"),
    ([*GPT, "--parallel", "fsdp", "--static-graph"], "--static-graph is a DDP option"),
    ([*GPT, "--prefetch", "1"], "--prefetch is an FSDP2 option"),
    ([*GPT, "--no-reshard-after-forward"], "--no-reshard-after-forward is an FSDP2 option"),
    ([*GPT, "--parallel", "fsdp", "--reduce-dtype", "fp8"], "--reduce-dtype fp8: choose fp32 or bf16"),
    ([*GPT, "--trace", "/proc/x.json"], "cannot write"),
    ([*GPT, "--tune", "--budget", "0"], "--budget must be positive"),
    ([*GPT, "--tune", "--loss-tolerance", "150%"], "--loss-tolerance 150%: give a share"),
    ([*GPT, "--tune", "--loss-tolerance", "lots"], "--loss-tolerance must be a number"),
    ([*GPT, "--tune", "--candidates", "comm-hook=zip"], "--comm-hook zip: choose from"),
    ([*GPT, "--tune", "--candidates", "colour=red"], "--candidates colour=red: not a train option"),
    # --candidates gets the flags' bounds (train/hooks.check_options), not only their syntax
    ([*GPT, "--threads", "5000"], "--threads 5000: at most 4096"),
    ([*GPT, "--tune", "--candidates", "threads=5000"], "--threads 5000: at most 4096"),
    # and the flags' number reader (flagvalues.parse_num): no inf, nan or negative
    ([*GPT, "--tune", "--candidates", "bucket-mb=inf"], "--candidates bucket-mb must be a finite number"),
    ([*GPT, "--tune", "--candidates", "threads=-1"], "--candidates threads must not be negative"),
    ([*GPT, "--tune", "--candidates", "threads=two"], "--candidates threads must be a number"),
    ([*GPT, "--parallel", "fsdp", "--prefetch", "65"], "--prefetch 65: at most 64 blocks"),
    ([*GPT, "--parallel", "fsdp", "--tune", "--candidates", "prefetch=65"], "--prefetch 65: at most 64 blocks"),
    ([*GPT, "--tune", "--backend", "gloo,wirespeed"], "--tune searches one backend"),
    # flags of one configuration's run, which the search would otherwise ignore
    ([*GPT, "--tune", "--what-if-gpu", "V100"], "--what-if-gpu describes one: drop --what-if-gpu"),
    ([*GPT, "--tune", "--plot", "x.png"], "--plot describes one: drop --plot"),
    ([*GPT, "--tune", "--no-scaling"], "--no-scaling describes one: drop --no-scaling"),
    ([*GPT, "--tune", "--trace", "t.json"], "--trace describes one: drop --trace"),
    ([*GPT, "--what-if-gpu", "TPU"], "--what-if-gpu TPU: choose V100, A100, H100"),
    ([*GPT, "--what-if-gpu", "A100", "--gpu-mfu", "1.5"], "--gpu-mfu 1.5: a share of the peak"),
    ([*GPT, "--gpu-tflops", "100"], "--gpu-tflops sets --what-if-gpu's GPU"),
    # vgg16's activations for 1024 images of 224 px are about 60 GiB per rank.
    (["--model", "vgg16", "--image-size", "224", "--batch-size", "1024", "-N", "2"], "needs at least"),
])
def test_a_bad_flag_is_one_line_exit_2(capsys, args, needle):
    if needle is None:   # accepted: checked only up to the point where ranks would start
        from wirespeed.cli.train import config_from_args
        from wirespeed.cli.main import build_parser
        backends, _ = config_from_args(build_parser().parse_args(["train", *args]))
        assert backends == ["gloo"]
        return
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["train", *args])
    out, err = capsys.readouterr()
    assert e.value.code == 2, (args, out, err)
    assert err.count("\n") == 1 and err.startswith("wirespeed: error: "), err
    assert needle in err and "Traceback" not in err, err
    assert out == ""


def test_ranks_whose_state_differs_are_named():
    check_digests([7.0, 7.0, 7.0], 10)
    with pytest.raises(RanksDisagree, match=r"differs from rank 0's on rank 2$"):
        check_digests([7.0, 7.0, 8.0], 10)
    with pytest.raises(RanksDisagree, match=r"on ranks 1, 3$"):
        check_digests([7.0, 6.0, 7.0, 5.0], 10)


def test_parameter_difference_and_the_median_of_repeats():
    init = torch.linspace(-1, 1, 1000)
    first = init * 1.01                       # training moved the parameters by 1% of their norm
    assert param_difference(first, first.clone(), init) == (0, 0)
    d, rel = param_difference(first, first + (first - init) * 0.1, init)
    assert d == pytest.approx(0.1, rel=1e-3) and rel == pytest.approx(1e-3, rel=1e-2)
    assert param_difference(first, first[:10], init)[0] == float("inf")
    assert param_difference(init, init * 1.5, init)[0] == pytest.approx(0.5)   # nothing moved: of the norm
    runs = [{"step_us": 30.0, "params_diff": 0.0, "params_diff_steps": [0.0, 1e-6]},
            {"step_us": 10.0, "params_diff": 2e-3, "params_diff_steps": [1e-7, 0.0]},
            {"step_us": 20.0, "params_diff": 1e-3, "params_diff_steps": [0.0, 0.0]}]
    r = _median_run(runs)
    assert r["step_us"] == 20.0 and r["repeats"] == 3 and r["step_us_repeats"] == [30.0, 10.0, 20.0]
    assert r["params_diff"] == 2e-3 and r["params_diff_steps"] == [1e-7, 1e-6]   # the worst of any run


def test_the_quotable_line():
    gloo = {"backend": "gloo", "samples_per_s": 10.0, "exposed_pct": 41.2, "unit": "img"}
    ws = {"backend": "wirespeed", "samples_per_s": 16.2, "exposed_pct": 9.4, "unit": "img"}
    assert quote(gloo, ws) == "wirespeed vs gloo: 1.62x img/s (exposed comm 41% -> 9% of the step)"


def test_train_records_are_read_by_the_one_reader(tmp_path):
    from wirespeed.train.rank import train_record
    from wirespeed.train.rank import TrainConfig
    from wirespeed.train.nets import NetSpec
    figures = {"time_us": 2000.0, "time_min_us": 1900.0, "time_max_us": 2500.0, "time_p99_us": 2500.0}
    out = {"step": figures, "compute": {**figures, "time_us": 1500.0}, "state_digest": "ab" * 32,
           "bytes_per_step": 4096.0, "calls_per_step": 1.0, "parameters": 1024,
           "calls": [("all_reduce", 4096)], "hosts": ["a", "b"]}
    r = train_record(TrainConfig(NetSpec("resnet18", 4, image_size=32)), 2, out, {}, 10**6)
    assert r["schema"] == "wirespeed.train/1"
    assert r["samples_per_s"] == pytest.approx(2 * 4 / 2e-3) and r["exposed_pct"] == pytest.approx(25)
    # 4096 bytes all-reduced over 2 hosts cross each link once: 32768 bits at 1 Mbit/s.
    assert r["hosts"] == 2 and r["wire_us"] == pytest.approx(32768.0)
    assert r["lower_limit_us"] == pytest.approx(32768.0) and r["env"]["hosts"] == ["a", "b"]
    write_jsonl(tmp_path / "t.jsonl", [r])
    assert load([tmp_path / "t.jsonl"], ("train",), "test").records == [r]


def test_the_memory_floor_grows_with_what_a_rank_keeps():
    from wirespeed.train.rank import TrainConfig, rank_bytes
    from wirespeed.train.nets import NetSpec, build
    spec = NetSpec("gpt", 4, layers=2, hidden=64, heads=4, seq_len=32, vocab=256)
    params = sum(p.numel() * 4 for p in build(spec, "cpu").parameters())
    sgd = rank_bytes(TrainConfig(spec))
    # Parameters and gradients of the network and its twin, DDP's buckets twice, rank 0's copies.
    assert sgd > 9 * params
    assert rank_bytes(TrainConfig(spec, optimizer="adamw")) == sgd + 4 * params
    bigger = NetSpec("gpt", 8, layers=2, hidden=64, heads=4, seq_len=32, vocab=256)
    assert rank_bytes(TrainConfig(bigger)) > sgd      # activations double with the batch


@pytest.mark.skipif(torch.cuda.is_available(), reason="refused only where no GPU is visible")
def test_nccl_without_a_gpu_is_refused_before_any_run_starts(capsys):
    # 482a6d1 started the run (a child train process, its ranks) before the ranks refused.
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["train", *GPT, "--backend", "nccl"])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and "GPUs but 0 are visible" in err and out == "", (out, err)


def test_train_saves_its_records_as_a_search_does_without_a_verdict(tmp_path, capsys):
    # train/shell._save through report/outputs.save_verdict: --json and SAVE_DIR/train-<time>/
    from wirespeed.train.shell import ShellSettings, _save
    recs = [{"schema": "wirespeed.train/1", "backend": "gloo"}]
    _save(recs, ShellSettings(json_path=str(tmp_path / "r.jsonl"), save_dir=str(tmp_path / "runs")))
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("train-") and sorted(p.name for p in run.iterdir()) == ["records.jsonl"]
    import json
    read = lambda path: [json.loads(line) for line in open(path)]   # noqa: E731
    assert read(run / "records.jsonl") == read(tmp_path / "r.jsonl") == recs
    assert capsys.readouterr().out == f"# saved records in {run}/\n"
    _save([], ShellSettings(json_path=str(tmp_path / "none.jsonl"), save_dir=str(tmp_path / "runs")))
    assert not (tmp_path / "none.jsonl").exists() and len(list((tmp_path / "runs").iterdir())) == 1


def test_tune_under_a_launcher_is_a_one_line_error(capsys, monkeypatch):
    # each candidate needs processes of its own, which only the shell can start (torchrun's
    # environment, as tests/unit/test_environment.py reads it)
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555", "TORCHELASTIC_RUN_ID": "x"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as e:
        main(["train", *GPT, "--tune"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert "--tune starts runs of its own: run it from a shell, not under a launcher" in err
