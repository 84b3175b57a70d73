"""Bad input: one line on stderr, exit 2, no traceback, nothing started."""
import socket

import pytest

from wsutil import wirespeed


def _one_line_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [line for line in p.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("wirespeed: error:")
    assert "Traceback" not in p.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args,needles", [
    (["-c", "allreduce"], ["unknown collective", "all_reduce"]),
    (["-d", "float8"], ["unknown dtype", "bfloat16"]),
    (["-o", "xor"], ["unknown op", "avg"]),
    (["--backend", "carrier-pigeon"], ["unknown backend", "gloo"]),
    (["-b", "12Q"], ["does not parse", "32K"]),
    (["-b", "1M", "-e", "1K"], ["larger than --maxbytes"]),
    (["-n", "many"], ["--iters must be a number"]),
    (["--root", "7", "-N", "2"], ["--root 7", "ranks 0..1"]),
    (["--no-such-flag"], ["unrecognized arguments"]),
])
def test_usage_errors(args, needles):
    _one_line_error(wirespeed("bench", "--no-save", *args, timeout=60), *needles)


@pytest.mark.timeout(60)
def test_nccl_without_gpu_says_why():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    line = _one_line_error(wirespeed("bench", "--backend", "nccl", "--no-save"), "nccl", "GPU")
    assert "gloo" in line  # says what to use instead


@pytest.mark.timeout(60)
def test_taken_master_port_is_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        _one_line_error(wirespeed("bench", "--no-save", "-N", "2", "--master-port", port),
                        f"--master-port {port}", "in use")


@pytest.mark.timeout(60)
def test_memory_guard_names_the_largest_size_that_fits():
    # 2 local ranks, all_gather of up to 1 TiB: refused before anything is allocated.
    line = _one_line_error(wirespeed("bench", "--no-save", "-N", "2", "-c", "all_gather",
                                     "-b", "1G", "-e", "1T", "-f", "2"), "largest size that fits is")
    fits = line.split("largest size that fits is ")[1].split(":")[0]
    from wirespeed.sizes import parse_size
    assert (1 << 30) <= parse_size(fits) < (1 << 40)


def test_memory_guard_arithmetic():
    from wirespeed.errors import UsageError
    from wirespeed.bench.memory import CHECK_TEMP_BYTES, check_fits
    from wirespeed.launch.memory import RANK_OVERHEAD_BYTES
    # all_reduce 1 GiB float32 on 4 ranks needs send + recv = 2 GiB per rank.
    need = 4 * (2 * (1 << 30) + CHECK_TEMP_BYTES) + 4 * RANK_OVERHEAD_BYTES
    check_fits(["all_reduce"], ["float32"], [1 << 30], 4, 4, "cpu", available=int(need / 0.9) + 1)
    with pytest.raises(UsageError, match="largest size that fits is 512M"):
        check_fits(["all_reduce"], ["float32"], [512 << 20, 1 << 30], 4, 4, "cpu",
                   available=int(need / 0.9) - 1)
