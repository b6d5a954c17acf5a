#!/usr/bin/env bash
# The GPU checks in one command, for a machine with a CUDA device: the `gpu` tests and the GPU
# benchmarks, each step under its own time limit, so that a slow or failing step leaves the
# others' results. From the repository root, with the project installed (its .venv, or the
# Python in $PYTHON) and, for the rtrl-e2e step, popgym:
#
#   scripts/gpu_check.sh [OUT_DIR]     # every step; results in OUT_DIR (default $OUT, else out/gpu)
#   STEPS="tests bench" scripts/gpu_check.sh OUT_DIR    # some steps only
#   scripts/gpu_check.sh wheels        # here: wheels into .whl/ for a GPU machine without a
#                                      # package index (installed from there before the steps)
#
# Expected run time on one H200: about 10 minutes (env 15 s, tests 80-100 s, bench 40 s,
# cost 15 s, rtrl-e2e 1-2 minutes, e2e 4-5 minutes; e2e is skipped without envpool).
#
# Steps, in this order:
#   env       GPU, driver, torch, triton, copy bandwidth               -> env.txt, env-python.txt
#   tests     pytest -m gpu                                            -> pytest-gpu.txt
#   bench     r2ac bench core --device cuda at the paper's and larger shapes -> bench-core.*
#   cost      r2ac bench cost --device cuda: one learner update per core     -> cost/, cost.log
#   rtrl-e2e  r2ac bench rtrl-e2e --device cuda: exact RTRL vs TBPTT end to end at
#             --preset popgym, the agent on the GPU                    -> rtrl-e2e.txt
#   e2e       r2ac bench runtime --device cuda: Atari through envpool, the DMLab-size agent
#             (ResNet stem, N = 512, M = 100), parallel runtime        -> e2e.txt, e2e.json
# Step limits in seconds: LIMIT_ENV, LIMIT_TESTS, LIMIT_BENCH, LIMIT_COST, LIMIT_RTRL_E2E,
# LIMIT_E2E. E2E_SECONDS: each e2e run's length after start-up; E2E_DEVICE=cpu runs the
# rtrl-e2e and e2e steps on the CPU (a check of the script itself); RTRL_E2E_ITERATIONS.
set -uo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-env tests bench cost rtrl-e2e e2e}
WHEELS=(tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.0
    gymnasium==1.4.0 farama-notifications==0.0.6 dm-env==1.6 popgym==1.0.7)
COMPILED_WHEELS=(optree==0.20.0 dm-tree==0.1.9)
GPU_PYTHON=${GPU_PYTHON:-3.12}  # the GPU machine's Python, for the compiled wheels
export PYTHONUNBUFFERED=1
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi

usage() { sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; }

setup_path() {  # the checkout first; wheels carried in .whl/, if any, beside it
    export PYTHONPATH="$PWD"
    if compgen -G ".whl/*.whl" >/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/r2ac-site .whl/*.whl
        export PYTHONPATH="$PYTHONPATH:/tmp/r2ac-site"
    fi
}

logged() {  # logged LIMIT LOG CMD...: output to the console and to $OUT/LOG, time-limited
    local limit=$1 log="$OUT/$2"; shift 2
    timeout --signal=INT --kill-after=15 "$limit" "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    echo "[gpu_check] exit $rc: $*" | tee -a "$log"
    return "$rc"
}

step_env() {
    { nvidia-smi || true; uptime; } 2>&1 | tee "$OUT/env.txt"
    logged "${LIMIT_ENV:-30}" env-python.txt "$PY" - <<'EOF'
import importlib.util, torch
from r2ac.bench import bandwidth
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("triton", importlib.util.find_spec("triton") is not None)
if torch.cuda.is_available():
    print(bandwidth.gpu_line("cuda"))
    for mib in (256, 1024):
        print(f"copy {mib} MiB: {bandwidth.copy_bandwidth_gbs('cuda', mib, 20, 3):.0f} GB/s")
EOF
}

step_tests() {
    logged "${LIMIT_TESTS:-150}" pytest-gpu.txt "$PY" -m pytest -m gpu -q -rs --durations=25 \
        -p no:cacheprovider tests
}

step_bench() {  # (T, B, N, D): the paper's shapes first, then larger N and B
    logged "${LIMIT_BENCH:-90}" bench-core.log "$PY" -m r2ac.cli bench core --device cuda \
        --shapes 100,32,512,257 50,32,256,257 1,32,512,257 100,32,1024,257 100,32,2048,257 \
        100,128,512,257 100,256,1024,257 50,64,2048,257 --no-naive --repeats 10 --warmup 3 \
        --threads 8 --json-out "$OUT/bench-core.json" --table-out "$OUT/bench-core.md"
}

step_cost() {  # one learner update at M = 100 per core: time, and the allocator's peak memory
    logged "${LIMIT_COST:-60}" cost.log "$PY" -m r2ac.cli bench cost --device cuda \
        --cores elstm-bptt elstm-rtrl rtu-bptt rtu-rtrl lru-bptt lru-rtrl \
        --spans 100 --repeats 5 --warmup 2 --threads 8 --out "$OUT/cost"
}

step_rtrl_e2e() {
    logged "${LIMIT_RTRL_E2E:-180}" rtrl-e2e.txt "$PY" -m r2ac.cli bench rtrl-e2e \
        "${RTRL_E2E_ITERATIONS:-70}" --device "${E2E_DEVICE:-cuda}"
}

step_e2e() {
    # elstm-bptt, elstm-rtrl with the actors carrying the sensitivities (each segment then
    # ships B x 2N x D floats to the GPU) and elstm-rtrl with the learner carrying them on the
    # GPU; actors on the CPU cores. Each run ~65 s of start-up (actors, envpool, CUDA), then
    # E2E_SECONDS. Reports steady frames/s, the learner's ms an update and CUDA peak memory.
    if ! "$PY" -c "import envpool" 2>/dev/null; then
        echo "[gpu_check] e2e skipped: envpool is not installed" | tee "$OUT/e2e.txt"
        return 0
    fi
    logged "${LIMIT_E2E:-300}" e2e.txt "$PY" -m r2ac.cli bench runtime --runtimes \
        parallel@elstm-bptt parallel@elstm-rtrl parallel:learner@elstm-rtrl --repeats 1 \
        --seconds "${E2E_SECONDS:-25}" --json-out "$OUT/e2e.json" -- \
        --device "${E2E_DEVICE:-cuda}" --env envpool/Breakout-v5 --unroll-length 100 \
        --image-stem resnet --hidden-size 512 --total-frames 1000000000 \
        --checkpoint-every 1000000
}

step_wheels() {  # run here, where a package index is reachable
    rm -rf .whl && mkdir -p .whl
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d .whl "${WHEELS[@]}"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PYTHON" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "${COMPILED_WHEELS[@]}"
    du -sh .whl
}

case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    wheels) step_wheels; exit $? ;;
esac
OUT=${1:-${OUT:-out/gpu}}
mkdir -p "$OUT"
setup_path
failed=()
for step in $STEPS; do
    fn="step_${step//-/_}"
    if ! declare -F "$fn" >/dev/null; then
        echo "[gpu_check] no step '$step'" >&2; usage >&2; exit 2
    fi
    echo "=== [gpu_check] $(date -u +%T) $step"
    "$fn" || failed+=("$step")
done
echo "=== [gpu_check] $(date -u +%T) done; results in $OUT; failed: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
