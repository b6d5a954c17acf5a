#!/usr/bin/env bash
# Issue 39's GPU figures in ONE device command (15 minutes of device time a session, machine
# start included, 10 minutes a command): each step of scripts/gpu_session.sh in priority
# order under its own time limit, so that one command fits and later steps still run when an
# earlier one fails. Run from the repository root with carry [".whl"] (made here first by
# `bash scripts/gpu_session.sh wheels`):
#   bash scripts/gpu_lease.sh            # ~9.5 minutes (limits sum to 570 s); all lands in $OUT
#   bash scripts/gpu_lease.sh tune       # ~5 minutes: carry tests, Triton sweep, bench with its best
#   bash scripts/gpu_lease.sh popgym     # <= 6 minutes: issue 36's rtrl/bptt at --preset popgym
# Step limits (seconds) can be changed by LIMIT_ENV, LIMIT_TESTS, LIMIT_BENCH, LIMIT_PROFILE,
# LIMIT_COST, LIMIT_E2E, and the e2e run length per rule by E2E_SECONDS. The first lease
# (2026-11-27, docs/log/gpu.md) took: env 15 s, tests 80 s, bench-shapes 40 s, profile 33 s,
# cost (no memory) ~15 s, e2e 217 s at E2E_SECONDS=40.
set -uo pipefail
cd "$(dirname "$0")/.."
# the device tool returns at most 8 files: the steps write elsewhere, and after each step
# everything they wrote is packed into $OUT/gpu-lease.tgz (so a later overrun loses nothing)
FINAL=${OUT:-out/gpu}
export OUT=${LEASE_WORK:-/tmp/gpu-lease}
mkdir -p "$FINAL" "$OUT"
S=scripts/gpu_session.sh
step() {  # step LIMIT ARGS...: one gpu_session.sh step, limited; a failure does not stop us
    local limit=$1; shift
    echo "=== [gpu_lease] $(date -u +%T) step: $* (limit ${limit}s)"
    STEP_LIMIT=$limit bash "$S" "$@" || echo "=== [gpu_lease] step failed: $*"
    tar czf "$FINAL/gpu-lease.tgz" -C "$OUT" .
}
if [ "${1:-}" = tune ]; then  # a short lease: the GPU tests of the carry, the Triton sweep,
    # and the bench at the paper's and the large shapes with the sweep's fastest launch
    [ -n "${TUNE_SKIP_TESTS:-}" ] || step "${LIMIT_TESTS:-70}" tests tests/test_perf.py \
        tests/gpu/test_gpu_carry_cuda.py
    # shellcheck disable=SC2086  # TUNE_ARGS: more arguments for the sweep, e.g. --groups ...
    step "${LIMIT_TUNE:-150}" tune ${TUNE_ARGS:-}
    best="$(cat "$OUT/tune-best.txt" 2>/dev/null)"  # the sweep's fastest launch, if any
    R2AC_TRITON_CONFIG="$best" step "${LIMIT_BENCH:-75}" bench-shapes 100,256,1024,257 \
        50,64,2048,257 100,128,512,257 100,32,512,257 1,32,512,257
    echo "=== [gpu_lease] $(date -u +%T) done"
    exit 0
fi
if [ "${1:-}" = popgym ]; then  # issue 36's end-to-end bar on the GPU (gpu_session.sh
    # popgym-e2e: each of its two measurements under this limit; ~30 s each on the CPU box)
    step "${LIMIT_ENV:-20}" env
    step "${LIMIT_POPGYM_E2E:-150}" popgym-e2e
    echo "=== [gpu_lease] $(date -u +%T) done"
    exit 0
fi
step "${LIMIT_ENV:-20}" env
step "${LIMIT_TESTS:-130}" tests  # +20 s since the first lease: the CUDA-graph candidates
# the paper's shapes first, then larger N and B (the whole --grid gpu does not fit one lease)
step "${LIMIT_BENCH:-75}" bench-shapes 100,32,512,257 50,32,256,257 1,32,512,257 \
    100,32,1024,257 100,32,2048,257 100,128,512,257 100,256,1024,257 50,64,2048,257
step "${LIMIT_PROFILE:-45}" profile
step "${LIMIT_COST:-30}" cost elstm-bptt elstm-rtrl rtu-bptt rtu-rtrl lru-bptt lru-rtrl
# three runs (gpu_session.sh e2e), each ~65 s of start-up (15 actors, envpool, CUDA) and then
# E2E_SECONDS
E2E_SECONDS=${E2E_SECONDS:-25} step "${LIMIT_E2E:-270}" e2e
echo "=== [gpu_lease] $(date -u +%T) done"
