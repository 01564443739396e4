#!/usr/bin/env bash
# Create .venv with everything chorus needs. Idempotent; ~1.5 min on a fresh machine.
# torch is installed first and pinned: a bare `torch` requirement with nothing installed would
# pull a multi-GB CUDA build. On a GPU machine set CHORUS_TORCH to the build you want
# (e.g. CHORUS_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # shellcheck disable=SC2086
  .venv/bin/python -m pip install -q ${CHORUS_TORCH:-torch==2.13.0}
fi
.venv/bin/python -m pip install -q -e ".[test]"
echo "chorus: environment ready in .venv"
