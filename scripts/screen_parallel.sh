#!/usr/bin/env bash
# A tuning screen (docs/rl.md, "Tuning protocol") as many single-threaded `r2ac train` runs at
# once, for a machine with more cores than ours (the device machine's 16 CPU cores: fifteen
# 1 M-frame POPGym runs in one command). Every arm runs every seed on the same machine and
# code, so the arms compare; runs on different machines do not (docs/log/learner.md,
# eighteenth session: the eLSTM's RTRL runs change with the CPU's rounding).
#
#   SCREEN_SEEDS="10 11 12 13 14" bash scripts/screen_parallel.sh ENV CORE 'TAG=FLAGS' ...
#   e.g. bash scripts/screen_parallel.sh gym/popgym-RepeatPreviousEasy-v0 elstm-rtrl \
#            'pre=' 'decay=--lr-decay'
#
# Each run: `python -m r2ac.cli train --preset ${SCREEN_PRESET:-popgym} --env ENV --core CORE
# FLAGS --seed S --num-threads 1 --no-progress`, stopped after SCREEN_LIMIT seconds (default
# 390). Results: $OUT/screen.tgz (every run directory: config, metrics.csv, eval.json) and
# $OUT/screen.txt (one line a run: tag, seed, greedy eval, the last training return, wall s),
# then each arm's mean and runs at 0.9. Carried wheels in .whl/ are installed first (the
# device machine reaches no registry: `pip download popgym==1.0.7 --no-deps -d .whl`) where
# tyro, gymnasium or popgym do not import.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 3 ]; then sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2; fi
ENV_ID=$1 CORE=$2; shift 2
OUT=${OUT:-out/screen}
WORK=${SCREEN_WORK:-/tmp/r2ac-screen}
mkdir -p "$OUT" "$WORK"
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
if ! "$PY" -c "import tyro, gymnasium, popgym" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/r2ac-site .whl/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/r2ac-site"
fi
# build the native kernels once, before the runs race for it
"$PY" -c "from r2ac.rtrl.elstm import native; print('native kernels:', native.load() is not None)"
echo "$(date -u +%T) $(nproc) CPUs; $ENV_ID, $CORE, seeds ${SCREEN_SEEDS:-10 11 12 13 14}"
jobs=()
for arm in "$@"; do
    tag=${arm%%=*} flags=${arm#*=}
    for seed in ${SCREEN_SEEDS:-10 11 12 13 14}; do
        dir="$WORK/${tag}_s$seed"
        # shellcheck disable=SC2086  # FLAGS: several flags
        timeout "${SCREEN_LIMIT:-390}" "$PY" -m r2ac.cli train --preset "${SCREEN_PRESET:-popgym}" \
            --env "$ENV_ID" --core "$CORE" $flags --seed "$seed" --num-threads 1 \
            --no-progress --out-dir "$dir" >"$WORK/${tag}_s$seed.log" 2>&1 &
        jobs+=("$!:${tag}:$seed:$(date +%s)")
    done
done
for job in "${jobs[@]}"; do
    IFS=: read -r pid tag seed start <<<"$job"
    wait "$pid"; rc=$?
    "$PY" - "$WORK/${tag}_s$seed" "$tag" "$seed" "$rc" "$(($(date +%s) - start))" <<'EOF' \
        | tee -a "$OUT/screen.txt"
import csv, json, os, sys
run, tag, seed, rc, wall = sys.argv[1:]
path = os.path.join(run, "eval.json")
greedy = json.load(open(path))["mean"] if os.path.exists(path) else float("nan")
rows = list(csv.DictReader(open(os.path.join(run, "metrics.csv")))) if os.path.exists(
    os.path.join(run, "metrics.csv")) else []
last = float(rows[-1]["return_mean"]) if rows else float("nan")
frames = int(rows[-1]["frames"]) if rows else 0
print(f"{tag:12s} seed {seed:3s} greedy {greedy:7.3f}  train {last:7.3f}  frames {frames:8d}"
      f"  rc {rc}  wall {wall} s")
EOF
done
"$PY" - "$OUT/screen.txt" <<'EOF' | tee -a "$OUT/screen.txt"
import math, sys
arms = {}
for line in open(sys.argv[1]):
    words = line.split()
    if len(words) > 4 and words[1] == "seed":
        arms.setdefault(words[0], []).append(float(words[4]))
for tag, evals in arms.items():
    done = [v for v in evals if not math.isnan(v)]
    mean = sum(done) / len(done) if done else float("nan")
    print(f"arm {tag:12s} mean {mean:7.3f} over {len(done)} of {len(evals)} runs,"
          f" {sum(v >= 0.9 for v in done)} at >= 0.9")
EOF
tar czf "$OUT/screen.tgz" -C "$WORK" --exclude='*.pt' .
echo "$(date -u +%T) done"
