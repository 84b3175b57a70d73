#!/usr/bin/env bash
# The GPU checks of the NCCL plugin in one command, for whoever is lent a one-GPU machine.
#
#   benchmarks/gpu_check.sh --pack DIR    here, after `maturin build --release` and `make plugin`:
#                                         copy the wheel, the plugin, and ip/tc with their
#                                         libraries into DIR (the GPU machine may lack iproute2)
#   benchmarks/gpu_check.sh DIR [OUT]     there, as root: install the wheel (no build, no network),
#                                         then run every check into OUT/gpu_check.log (OUT: $OUT,
#                                         else ./gpu_check_out); exit 0 only if every check passed
#   benchmarks/gpu_check.sh --sharing V   what the runs of two ranks on the one GPU get under
#                                         NCCL version V (e.g. 2.30.7), and exit
#
# OUT gets the log and six JSON-lines files only (the device tool brings back 8 files); the
# installed package, MPS's pipes and NCCL's per-process logs go under WORK (/tmp/gpu_check_work).
#
# The checks, each bounded, about 8 minutes in all on an H100:
#   1. the plugin loads (dlopen, its ncclNetPlugin_v8..v12 symbols) and `wirespeed env` sees it;
#   2. two emulated hosts with a per-flow cap (`cluster up --rate 8gbit --flow-rate 1gbit`), one
#      rank on each, both on the one GPU: `bench --backend nccl` with NCCL's socket transport as
#      it comes, tuned (NCCL_SOCKET_NTHREADS=2 NCCL_NSOCKS_PERTHREAD=8), and with --fast-net;
#   3. `train --backend nccl`, plain and with --fast-net;
#   4. `tune --backend nccl` over NCCL's socket knobs.
# Every --fast-net run must prove that the plugin carried the traffic: NCCL's own log
# (NCCL_DEBUG=INFO, one file per process) must say "Using network wirespeed" in every rank and
# show connections "via NET/wirespeed"; NCCL falls back to its socket transport silently when a
# plugin does not load, so a fast run alone proves nothing. bench and train --fast-net check that
# themselves (exit 1 otherwise); both runs are checked here again with `wirespeed plugin-check`.
# Where the kernel cannot build the emulated cluster, the NCCL runs fall back to --host-per-rank
# (two host ids on one network, no caps) and the log says so.
# Two ranks on the one GPU: NCCL 2.30 added NCCL_MULTI_RANK_GPU_ENABLE (off by default), and where
# torch's NCCL has it every NCCL run gets it. NCCL checks it only for ranks it sees on one host
# (the same hostname and boot id, or NCCL_HOSTID); the ranks still run as two hosts (emulated,
# else host ids), because NCCL sends nothing between ranks of one host on one GPU over its network
# (its topology prefers the GPU's own path), so only two hosts exercise the plugin.
set -u

# multi_rank_env NCCL_VERSION: NCCL_MULTI_RANK_GPU_ENABLE=1 from NCCL 2.30 on; nothing before, or
# for a version that is not MAJOR.MINOR[.PATCH].
multi_rank_env() {
    local major minor
    IFS=. read -r major minor _ <<<"${1:-}"
    [[ $major =~ ^[0-9]+$ && $minor =~ ^[0-9]+$ ]] || return 0
    if [ "$major" -gt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -ge 30 ]; }; then
        echo NCCL_MULTI_RANK_GPU_ENABLE=1
    fi
}

# sharing_line NCCL_VERSION: what the runs of two ranks on the one GPU get, in one line.
sharing_line() {
    local env why
    env=$(multi_rank_env "$1")
    if [ -n "$env" ]; then why=$env
    elif [[ $1 =~ ^[0-9]+\.[0-9]+ ]]; then why="no NCCL_MULTI_RANK_GPU_ENABLE (before NCCL 2.30)"
    else why="no NCCL_MULTI_RANK_GPU_ENABLE (torch's NCCL version is not known)"
    fi
    echo "NCCL $1: $why; the ranks share the GPU as two hosts (emulated, else host ids)"
}

if [ "${1:-}" = "--sharing" ]; then
    sharing_line "${2:?usage: benchmarks/gpu_check.sh --sharing NCCL_VERSION}"
    exit 0
fi

if [ "${1:-}" = "--pack" ]; then
    dir=${2:?usage: benchmarks/gpu_check.sh --pack DIR}
    root=$(cd "$(dirname "$0")/.." && pwd)
    wheel=$(ls -t "$root"/target/wheels/wirespeed-*.whl 2>/dev/null | head -1)
    plugin="$root/target/nccl-plugin/libnccl-net-wirespeed.so"
    [ -n "$wheel" ] || { echo "gpu_check: no wheel in $root/target/wheels: run .venv/bin/maturin build --release" >&2; exit 2; }
    [ -f "$plugin" ] || { echo "gpu_check: $plugin is missing: run make plugin" >&2; exit 2; }
    mkdir -p "$dir/tools" "$dir/lib" "$dir/bin"
    cp "$wheel" "$plugin" "$dir/"
    for tool in ip tc nsenter unshare; do
        path=$(command -v "$tool") || { echo "gpu_check: $tool is not installed here" >&2; exit 2; }
        cp "$path" "$dir/tools/"
        # The tools' own libraries, not the C library or the loader (the GPU machine has its own).
        ldd "$path" | awk '/=> \//{print $3}' | grep -v -E '/(libc|libm|libpthread|libdl|ld-linux[^/]*)\.so' \
            | xargs -r -I{} cp -L {} "$dir/lib/"
        # A wrapper that gives only this tool the packed libraries: on LD_LIBRARY_PATH for the
        # whole run they would replace the GPU machine's own (libz, libselinux) under torch.
        printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")/..\nLD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/tools/%s" "$@"\n' \
            "$tool" >"$dir/bin/$tool"
        chmod +x "$dir/bin/$tool"
    done
    echo "packed into $dir: $(basename "$wheel"), $(basename "$plugin"), ip, tc, nsenter, unshare ($(du -sh "$dir" | cut -f1))"
    exit 0
fi

pack=${1:?usage: benchmarks/gpu_check.sh DIR [OUT]   (DIR from --pack)}
pack=$(cd "$pack" && pwd) || exit 2
out=${2:-${OUT:-$PWD/gpu_check_out}}
mkdir -p "$out" && out=$(cd "$out" && pwd)
work=${WORK:-/tmp/gpu_check_work}
rm -rf "$work" && mkdir -p "$work"
log="$out/gpu_check.log"
: >"$log"
exec > >(tee -a "$log") 2>&1

BUDGET_S=570            # stop starting checks past this, so the whole run ends within 10 minutes
START=$(date +%s)
RESULTS=()
FAILED=0
PY=${PYTHON:-python3}
NAME=gck                # the emulated cluster's name
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1

say() { printf '\n=== %s (%ss)\n' "$*" "$(( $(date +%s) - START ))"; }
record() { RESULTS+=("$1: $2"); [ "$2" = PASS ] || [ "${2%% *}" = SKIP ] || FAILED=1; }

# check NAME LIMIT_S CMD...: run CMD bounded, record PASS or FAIL (rc).
check() {
    local name=$1 limit=$2; shift 2
    if [ $(( $(date +%s) - START + 10 )) -ge $BUDGET_S ]; then
        say "$name: SKIPPED (the 10-minute budget is spent)"; record "$name" "SKIP (budget)"; return 1
    fi
    say "$name"
    echo "+ $*"
    timeout --kill-after=10 "$limit" "$@"
    local rc=$?
    [ $rc -eq 124 ] && echo "gpu_check: $name ran past its ${limit}s limit"
    if [ $rc -eq 0 ]; then record "$name" PASS; else record "$name" "FAIL (exit $rc)"; fi
    return $rc
}

# proof NAME DIR: NCCL's logs in DIR must show the plugin carried the traffic of 2 ranks.
proof() {
    local name=$1 dir=${2:-/nonexistent}
    say "$name: NCCL's log says which network carried the traffic"
    if ! ls "$dir"/nccl.*.log >/dev/null 2>&1; then
        record "$name (NCCL log)" "FAIL (no NCCL log in $dir: the run never started NCCL)"
        return
    fi
    if "${WS[@]}" plugin-check --ranks 2 "$dir"/nccl.*.log; then
        record "$name (NCCL log)" PASS
        grep -h -E 'NCCL INFO (Using network|.*via NET/)' "$dir"/nccl.*.log | head -4
    else
        record "$name (NCCL log)" "FAIL (NCCL's log does not show the plugin carrying the traffic)"
        grep -h -E 'NCCL (WARN|INFO (Using network|NET/Plugin))' "$dir"/nccl.*.log 2>/dev/null | head -20
    fi
}

WS=("$PY" -m wirespeed.cli.main)   # an array, not a function: `timeout` runs it

cleanup() {
    "${WS[@]}" cluster down --name "$NAME" >/dev/null 2>&1
    if [ -n "${MPS_DIR:-}" ]; then
        echo quit | CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR nvidia-cuda-mps-control >/dev/null 2>&1
    fi
}
trap cleanup EXIT

say "gpu_check on $(hostname): $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "gpu_check: nvidia-smi failed"
uname -r

# The pack's tools where the machine has none (it may lack iproute2); its own where it has them.
mkdir -p "$work/bin"
for tool in ip tc nsenter unshare; do
    command -v "$tool" >/dev/null || ln -s "$pack/bin/$tool" "$work/bin/$tool"
done
export PATH="$work/bin:$PATH"
echo "tools: $(for t in ip tc nsenter unshare; do printf '%s=%s ' "$t" "$(readlink -f "$(command -v $t)")"; done)"
site="$work/site"
wheel=$(ls "$pack"/wirespeed-*.whl | head -1)
check "install $(basename "$wheel")" 120 "$PY" -m pip install -q --no-index --no-deps --no-compile \
    --target "$site" "$wheel" || { echo "gpu_check: cannot install the wheel; stopping"; exit 1; }
nccl_version=$("$PY" -c 'import torch; v = torch.cuda.nccl.version()
print(".".join(map(str, v)) if isinstance(v, tuple) else f"{v // 10000}.{v // 100 % 100}.{v % 100}")' 2>/dev/null)
multi_rank=$(multi_rank_env "$nccl_version")
[ -n "$multi_rank" ] && export "$multi_rank"
echo "two ranks on the one GPU: $(sharing_line "${nccl_version:-unknown}")"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export WIRESPEED_NCCL_PLUGIN="$pack/libnccl-net-wirespeed.so"

check "plugin loads" 60 "$PY" - <<'EOF'
import ctypes, os
lib = ctypes.CDLL(os.environ["WIRESPEED_NCCL_PLUGIN"])
found = [v for v in range(8, 13) if hasattr(lib, f"ncclNetPlugin_v{v}")]
assert found == list(range(8, 13)), f"the plugin exports ncclNetPlugin_v{found}, not v8..v12"
import torch
print("plugin", os.environ["WIRESPEED_NCCL_PLUGIN"], "exports v8..v12; torch", torch.__version__,
      "NCCL", torch.cuda.nccl.version(), "GPUs", torch.cuda.device_count())
EOF
"${WS[@]}" env 2>&1 | grep -E 'nccl-net|torch|cuda' | head -5

# MPS, so the two ranks' kernels share the one GPU instead of time-slicing it.
if command -v nvidia-cuda-mps-control >/dev/null; then
    MPS_DIR="$work/mps"; mkdir -p "$MPS_DIR"
    export CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR CUDA_MPS_LOG_DIRECTORY=$MPS_DIR
    nvidia-cuda-mps-control -d && echo "MPS started ($MPS_DIR)" || { echo "gpu_check: MPS did not start; ranks will time-slice the GPU"; MPS_DIR=; }
fi

where=(--cluster "$NAME" -N 2)
if ! check "cluster up: 2 hosts, 8 Gbit/s links, 1 Gbit/s per flow" 60 \
        "${WS[@]}" cluster up --name "$NAME" --hosts 2 --rate 8gbit --flow-rate 1gbit; then
    echo "gpu_check: no emulated cluster here; the NCCL runs use --host-per-rank (no caps)"
    where=(-N 2 --host-per-rank)
fi
# train places ranks on the emulated cluster only (it has no --host-per-rank).
[ "${where[0]}" = --cluster ] && train_where=("${where[@]}") || train_where=()

sweep=(--backend nccl --device cuda -c all_reduce -b 1M -e 64M -f 4 -w 2 -n 10 --timeout 60
       --no-save --no-progress)
check "bench nccl, socket transport as it comes" 120 "${WS[@]}" bench "${where[@]}" "${sweep[@]}" \
    --json "$out/bench_socket.jsonl"
check "bench nccl, socket transport tuned" 120 env NCCL_SOCKET_NTHREADS=2 NCCL_NSOCKS_PERTHREAD=8 \
    "${WS[@]}" bench "${where[@]}" "${sweep[@]}" --json "$out/bench_tuned.jsonl"
# --fast-net runs check NCCL's logs themselves (each rank, after the run; exit 1 unless the
# plugin carried the traffic); TMPDIR puts those logs where plugin-check reads them again.
mkdir -p "$work/tmp_bench"
check "bench nccl --fast-net" 120 env TMPDIR="$work/tmp_bench" \
    "${WS[@]}" bench "${where[@]}" "${sweep[@]}" --fast-net --json "$out/bench_fast.jsonl"
proof "bench nccl --fast-net" "$(ls -d "$work"/tmp_bench/wirespeed-nccl-* 2>/dev/null | head -1)"

train=(--model gpt --backend nccl --device cuda -w 2 -n 10 --no-save --no-scaling)
if [ ${#train_where[@]} -gt 0 ]; then
    check "train nccl" 100 "${WS[@]}" train "${train_where[@]}" "${train[@]}" --json "$out/train_nccl.jsonl"
    mkdir -p "$work/tmp_train"
    check "train nccl --fast-net" 100 env TMPDIR="$work/tmp_train" \
        "${WS[@]}" train "${train_where[@]}" "${train[@]}" --fast-net \
        --json "$out/train_fast.jsonl"
    proof "train nccl --fast-net" "$(ls -d "$work"/tmp_train/wirespeed-nccl-* 2>/dev/null | head -1)"
else
    record "train nccl, plain and --fast-net" "SKIP (no emulated cluster)"
fi

check "tune nccl (socket knobs)" 150 "${WS[@]}" tune "${where[@]}" --backend nccl --device cuda \
    --knobs NCCL_NSOCKS_PERTHREAD --values NCCL_NSOCKS_PERTHREAD=1,8 --sizes 4M,32M -w 1 -n 5 \
    --no-save --json "$out/tune.jsonl"

say "summary"
for r in "${RESULTS[@]}"; do echo "  $r"; done
echo "log: $log; records: $out/*.jsonl; NCCL logs: $work/tmp_*/wirespeed-nccl-*/"
exit $FAILED
