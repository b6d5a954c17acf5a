#!/usr/bin/env bash
# Issue 25's GPU runs, in steps that each fit the device tool's 10-minute command limit.
#
# Here, once, before the GPU session (the GPU machine reaches no package registry, and its
# image has torch, triton and pytest but not tyro, gymnasium or envpool):
#   bash scripts/gpu_session.sh wheels        # tyro, gymnasium, envpool (Atari only) into .whl/
# Then one device run per step, from the repository root, with carry [".whl"]:
#   bash scripts/gpu_session.sh env           # GPU, driver, torch, triton, copy bandwidth
#   bash scripts/gpu_session.sh tests         # pytest -m gpu (or: tests PYTEST_ARGS...)
#   bash scripts/gpu_session.sh bench 512     # bench core --device cuda --grid gpu-512
#   bash scripts/gpu_session.sh bench 1024
#   bash scripts/gpu_session.sh bench 2048
#   bash scripts/gpu_session.sh e2e           # r2ac train --device cuda: rtrl vs bptt, Atari
#   bash scripts/gpu_session.sh popgym-e2e    # issue 36's bar: rtrl/bptt at --preset popgym
#   bash scripts/gpu_session.sh bench-shapes T,B,N,D...   # bench core at the shapes named
#   bash scripts/gpu_session.sh cost CORE...  # bench cost --device cuda: one learner update
#   bash scripts/gpu_session.sh profile       # scripts/profile_gpu_carry.py: the carry's kernels
#   bash scripts/gpu_session.sh tune [--shapes ...]  # scripts/tune_gpu_triton.py: the Triton launch
# scripts/gpu_lease.sh runs them all, in priority order, inside one device command.
# Each step writes its log and results under $OUT (the device tool's folder; out/gpu here)
# and stops itself after $STEP_LIMIT seconds (default 570) so that what it wrote comes back.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
STEP_LIMIT=${STEP_LIMIT:-570}
WHEELS=(tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.0
    gymnasium==1.4.0 farama-notifications==0.0.6 dm-env==1.6 popgym==1.0.7)
# compiled, for the GPU machine's Python (3.12; KINDS.md of the device tool)
GPU_PYTHON=${GPU_PYTHON:-3.12}
COMPILED_WHEELS=(optree==0.20.0 dm-tree==0.1.9)
ENVPOOL=(envpool==1.2.5 envpool-assets==0.3.0)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

python_bin() {
    if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"
    elif [ -x .venv/bin/python ]; then echo .venv/bin/python
    else echo python3; fi
}
PY=$(python_bin)

setup_path() {  # the repo first; the carried wheels and envpool, if any, beside it
    export PYTHONPATH="$PWD"
    if compgen -G ".whl/*.whl" >/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/r2ac-site .whl/*.whl
        export PYTHONPATH="$PYTHONPATH:/tmp/r2ac-site"
    fi
    if [ -d .whl/site ]; then export PYTHONPATH="$PYTHONPATH:$PWD/.whl/site"; fi
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

step_bench_shapes() {
    setup_path
    run_logged bench-gpu-shapes.log "$PY" -m r2ac.cli bench core --device cuda \
        --shapes "$@" --no-naive --repeats 10 --warmup 3 --threads 8 \
        --json-out "$OUT/bench-gpu-shapes.json" --table-out "$OUT/bench-gpu-shapes.md"
}

step_cost() {  # one learner update at M = 100, per core, on CUDA (time, and the peak memory
    # from the allocator in the same process)
    setup_path
    run_logged cost-gpu.log "$PY" -m r2ac.cli bench cost --device cuda --cores "$@" \
        --spans 100 --repeats 5 --warmup 2 --threads 8 --out "$OUT/cost"
}

step_tune() {  # the Triton kernel's launch swept (scripts/tune_gpu_triton.py); best in tune-best.txt
    setup_path
    run_logged tune-triton.txt "$PY" scripts/tune_gpu_triton.py "$@" \
        --json-out "$OUT/tune-triton.json" --best-out "$OUT/tune-best.txt"
}
step_profile() {  # where the history term + carry spends its time, per candidate
    setup_path
    run_logged profile-carry.txt "$PY" scripts/profile_gpu_carry.py "$@"
}

step_e2e() {
    # `r2ac train --device cuda` end to end, the paper's DMLab-size agent (IMPALA's ResNet
    # stem, N = 512) at M = 100 on Atari through envpool, parallel runtime (actors on the
    # CPU cores, the learner on the GPU): elstm-bptt, elstm-rtrl with the actors carrying
    # the sensitivities (each segment then ships B x 2N x D floats, 34 MB a batch, to the
    # GPU) and elstm-rtrl with the learner carrying them on the GPU (E2E_RUNTIMES to
    # change), each stopped after E2E_SECONDS by SIGINT. r2ac bench runtime reports steady
    # frames/s, the learner's median ms an update (M x B / that = the frames/s the learner
    # alone could take) and its CUDA peak memory, and their ratios to the first run. On a CPU machine, E2E_DEVICE=cpu with
    # small sizes in E2E_EXTRA (appended: the last value wins) checks the step's plumbing.
    setup_path
    local seconds=${E2E_SECONDS:-220} device=${E2E_DEVICE:-cuda}
    local env=${E2E_ENV:-envpool/Breakout-v5}
    local runtimes=${E2E_RUNTIMES:-parallel@elstm-bptt parallel@elstm-rtrl \
parallel:learner@elstm-rtrl}
    # shellcheck disable=SC2086  # the runtimes are words
    run_logged e2e.txt "$PY" -m r2ac.cli bench runtime --runtimes $runtimes --repeats 1 \
        --seconds "$seconds" --json-out "$OUT/e2e.json" -- \
        --device "$device" --env "$env" --unroll-length 100 --image-stem resnet \
        --hidden-size 512 --total-frames 1000000000 --checkpoint-every 1000000 ${E2E_EXTRA:-}
}

step_popgym_e2e() {
    # Issue 36's end-to-end bar (rtrl/bptt >= 0.9 at `--preset popgym`'s eLSTM values), which
    # the 2-core CPU box misses (0.84-0.85; docs/results.md, "What exact RTRL costs at the
    # eLSTM's values"): scripts/rtrl_cost_in_process.py (the serial runtime's collect + update
    # of elstm-bptt and elstm-rtrl on RepeatPreviousEasy, alternated, medians after 10
    # warm-up iterations) with the agent on the GPU, then the same without the first-order
    # start state's correction. POPGYM_E2E_ITERATIONS iterations (70); E2E_DEVICE=cpu checks
    # the plumbing on a CPU machine.
    setup_path
    local iterations=${POPGYM_E2E_ITERATIONS:-70} device=${E2E_DEVICE:-cuda} rc=0
    run_logged popgym-e2e.txt "$PY" scripts/rtrl_cost_in_process.py "$iterations" \
        --device "$device" || rc=$?
    run_logged popgym-e2e-no-correction.txt "$PY" scripts/rtrl_cost_in_process.py \
        "$iterations" --device "$device" --no-rtrl-start-correction || rc=$?
    return "$rc"
}

step_wheels() {  # here, not on the GPU machine (which reaches no registry)
    rm -rf .whl && mkdir -p .whl/site
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d .whl "${WHEELS[@]}"
    local platform=(--python-version "$GPU_PYTHON" --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    "$PY" -m pip download -q --no-deps --only-binary=:all: "${platform[@]}" -d .whl \
        "${COMPILED_WHEELS[@]}"
    # envpool's wheel (50 MB) and its assets (60 MB) exceed the 64 MiB that travels: keep
    # its Python files, the Atari extension and the Atari ROMs (which envpool finds in
    # envpool/atari/roms), and drop every other env's compiled code
    local tmp
    tmp=$(mktemp -d)
    "$PY" -m pip download -q --no-deps --only-binary=:all: "${platform[@]}" -d "$tmp" \
        "${ENVPOOL[@]}"
    unzip -q "$tmp"/envpool-*.whl -d .whl/site
    find .whl/site/envpool -name '*.so' -not -path '*/atari/*' -delete
    rm -rf .whl/site/envpool/vizdoom/bin
    echo "import envpool.atari.registration  # noqa: F401  (Atari alone: gpu_session.sh)" \
        > .whl/site/envpool/entry.py  # it imported every env family's extension
    unzip -q "$tmp"/envpool_assets-*.whl 'envpool_assets/atari/roms/*' -d "$tmp/assets"
    mv "$tmp/assets/envpool_assets/atari/roms" .whl/site/envpool/atari/roms
    rm -rf "$tmp"
    ls -l .whl
    du -sh .whl
}

step=${1:-}
shift || true
case "$step" in
    env) step_env ;;
    tests) step_tests "$@" ;;
    bench) step_bench "$@" ;;
    bench-shapes) step_bench_shapes "$@" ;;
    cost) step_cost "$@" ;;
    profile) step_profile "$@" ;;
    tune) step_tune "$@" ;;
    e2e) step_e2e ;;
    popgym-e2e) step_popgym_e2e ;;
    wheels) step_wheels ;;
    *)
        sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
        exit 2
        ;;
esac
