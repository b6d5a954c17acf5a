#!/usr/bin/env bash
# Issue 25's GPU runs, in steps that each fit the device tool's 10-minute command limit.
#
# Here, once, before the GPU session (the GPU machine reaches no package registry, and its
# image has torch, triton and pytest but not tyro, which `r2ac bench` needs):
#   bash scripts/gpu_session.sh wheels        # tyro + its pure-Python needs into .whl/
# Then one device run per step, from the repository root, with carry [".whl"]:
#   bash scripts/gpu_session.sh env           # GPU, driver, torch, triton, copy bandwidth
#   bash scripts/gpu_session.sh tests         # pytest -m gpu (or: tests PYTEST_ARGS...)
#   bash scripts/gpu_session.sh bench 512     # bench core --device cuda --grid gpu-512
#   bash scripts/gpu_session.sh bench 1024
#   bash scripts/gpu_session.sh bench 2048
#   bash scripts/gpu_session.sh e2e           # TODO hook: r2ac train --device cuda, rtrl vs bptt
# Each step writes its log and results under $OUT (the device tool's folder; out/gpu here)
# and stops itself after $STEP_LIMIT seconds (default 570) so that what it wrote comes back.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
STEP_LIMIT=${STEP_LIMIT:-570}
WHEELS=(tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.0)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

python_bin() {
    if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"
    elif [ -x .venv/bin/python ]; then echo .venv/bin/python
    else echo python3; fi
}
PY=$(python_bin)

setup_path() {  # the repo first; the carried wheels, if any, installed beside it
    export PYTHONPATH="$PWD"
    if compgen -G ".whl/*.whl" >/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/r2ac-site .whl/*.whl
        export PYTHONPATH="$PWD:/tmp/r2ac-site"
    fi
}

run_logged() {  # run_logged LOG CMD...: output to the console and to $OUT/LOG, time-limited
    local log="$OUT/$1"; shift
    set +e
    timeout --signal=INT --kill-after=15 "$STEP_LIMIT" "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    set -e
    echo "[gpu_session] exit $rc: $*" | tee -a "$log"
    return "$rc"
}

step_env() {
    setup_path
    { nvidia-smi || true; uptime; } 2>&1 | tee "$OUT/env.txt"
    run_logged env-python.txt "$PY" - <<'EOF'
import importlib.util, torch
from r2ac.bench import bandwidth
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("triton", importlib.util.find_spec("triton") is not None, "tyro", importlib.util.find_spec("tyro") is not None)
if torch.cuda.is_available():
    print(bandwidth.gpu_line("cuda"))
    for mib in (256, 1024):
        print(f"copy {mib} MiB: {bandwidth.copy_bandwidth_gbs('cuda', mib, 20, 3):.0f} GB/s")
EOF
}

step_tests() {
    setup_path
    local args=("$@")
    [ ${#args[@]} -gt 0 ] || args=(tests)
    run_logged pytest-gpu.txt "$PY" -m pytest -m gpu -q -rs -s --durations=25 \
        -p no:cacheprovider "${args[@]}"
}

step_bench() {
    local n=${1:?usage: gpu_session.sh bench 512|1024|2048}
    setup_path
    run_logged "bench-gpu-$n.log" "$PY" -m r2ac.cli bench core --device cuda \
        --grid "gpu-$n" --no-naive --repeats 10 --warmup 3 --threads 8 \
        --json-out "$OUT/bench-gpu-$n.json" --table-out "$OUT/bench-gpu-$n.md"
}

step_e2e() {
    # TODO(runtime helper, `r2ac train --device cuda`): frames/s of elstm-rtrl against
    # elstm-bptt at M = 100, side by side, with the paper's DMLab-size agent (ResNet stem,
    # N = 512) on Atari through envpool (carry its cp312 manylinux wheel in .whl/), and the
    # learner's peak memory for both. The intended command, once both exist, per core:
    #   r2ac train --device cuda --env envpool/Pong-v5 --core $core --unroll-length 100 \
    #       --image-stem resnet --hidden-size 512 --total-frames ... --out-dir $OUT/e2e-$core
    # then frames/s and the learner's memory from each run's metrics.csv.
    setup_path
    if ! "$PY" -m r2ac.cli train --help 2>/dev/null | grep -q -- "--device"; then
        echo "[gpu_session] e2e NOT RUN: r2ac train has no --device option yet" | tee "$OUT/e2e.txt"
        return 3
    fi
    echo "[gpu_session] e2e NOT RUN: the frames/s command is still a TODO (see this function)" \
        | tee "$OUT/e2e.txt"
    return 3
}

step_wheels() {  # here, not on the GPU machine: pure-Python wheels, any platform
    mkdir -p .whl
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d .whl "${WHEELS[@]}"
    ls -l .whl
}

step=${1:-}
shift || true
case "$step" in
    env) step_env ;;
    tests) step_tests "$@" ;;
    bench) step_bench "$@" ;;
    e2e) step_e2e ;;
    wheels) step_wheels ;;
    *)
        sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
        exit 2
        ;;
esac
