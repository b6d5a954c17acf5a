#!/usr/bin/env bash
# Idempotent set-up of the project's virtual environment in .venv/.
# torch is installed first and pinned to the local CPU wheel (2.13.0), so that
# no dependency pulls the CUDA build. Re-runs are a no-op unless pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${R2AC_EXTRAS:-dev}
stamp=".venv/.r2ac-setup-$(sha1sum pyproject.toml | cut -c1-12)-${EXTRAS//,/_}"
if [ -f "$stamp" ]; then exit 0; fi
echo "[bootstrap] setting up .venv (extras: $EXTRAS) ..." >&2
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >&2
.venv/bin/python -m pip install -q "torch==2.13.0" >&2
.venv/bin/python -m pip install -q -e ".[$EXTRAS]" >&2
rm -f .venv/.r2ac-setup-*
touch "$stamp"
echo "[bootstrap] done" >&2
