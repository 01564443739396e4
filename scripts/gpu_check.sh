#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py says what it runs): with the python3 on the PATH, as the lent
# GPU machine's image has it; nothing is installed. CI runs `--device cpu --quick`.
#   bash scripts/gpu_check.sh [--out DIR] [--deadline-s S] [--only STEP,...] [--device cpu --quick]
#   CHORUS_PYTHON=...  another interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${CHORUS_PYTHON:-python3}" scripts/gpu_check.py "$@"
