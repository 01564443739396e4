#!/usr/bin/env bash
# The engine's GPU check, in one run (< 8 minutes on one H100/H200):
#   1. the engine, streaming and vector tests with the model on the GPU,
#   2. greedy parity on the upstream vectors in float32 and bfloat16,
#   3. the compiled decode frame (torch.compile fullgraph + CUDA graphs) against eager,
#   4. `bench --size s1-mini` in bfloat16 at 1/32/64/128 slots,
# writing everything to one JSON (default artifacts/gpu_check.json).
#
# Usage: bash scripts/gpu_check.sh [OUT_JSON]
#   CHORUS_PYTHON  the interpreter to use (default .venv/bin/python; `bash scripts/setup.sh`
#                  with CHORUS_TORCH set to a CUDA build makes one, e.g.
#                  CHORUS_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128")
# Without a GPU (CI) the same steps run on the CPU at tiny sizes: a check that the script and
# every command it runs still work, not a measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-artifacts/gpu_check.json}
PY=${CHORUS_PYTHON:-.venv/bin/python}
mkdir -p "$(dirname "$OUT")"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if [ ! -x "$PY" ] && ! command -v "$PY" >/dev/null 2>&1; then
  bash scripts/setup.sh
  PY=.venv/bin/python
fi
DEVICE=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
echo "gpu_check: device $DEVICE, python $PY"
if [ "$DEVICE" = cuda ]; then
  SIZE=s1-mini; SLOTS="1 32 64 128"; FRAMES=64; ROWS_PER_SLOT=2; DTYPES="float32 bfloat16"
  TESTS="tests/engine/test_engine.py tests/engine/test_engine_streaming.py tests/engine/test_model_vectors.py tests/engine/test_sampling.py"
  TEST_FILTER=""
else  # the CPU fallback: every step, at tiny sizes (the full engine tests run in the suite anyway)
  SIZE=tiny; SLOTS="1 4"; FRAMES=8; ROWS_PER_SLOT=1; DTYPES="float32"
  TESTS="tests/engine/test_engine_streaming.py"
  TEST_FILTER="not slow"
fi

step() { echo "== $1"; }

step "engine tests on $DEVICE"
# shellcheck disable=SC2086
CHORUS_TEST_DEVICE=$DEVICE "$PY" -m pytest -q -x -p no:cacheprovider $TESTS -m "$TEST_FILTER" \
  --junitxml "$WORK/tests.xml" | tail -3

step "greedy parity on the vectors ($DTYPES)"
for dtype in $DTYPES; do
  "$PY" -m actors.engine parity --device "$DEVICE" --dtype "$dtype" --json "$WORK/parity_$dtype.json"
done

step "compiled decode frame vs eager"
"$PY" -m actors.engine frame-check --device "$DEVICE" --json "$WORK/frame_check.json"

step "bench --size $SIZE in bfloat16 ($SLOTS slots)"
BENCH_DTYPE=bfloat16
[ "$DEVICE" = cuda ] || BENCH_DTYPE=float32  # bf16 matmuls are slow on CPUs without AVX512-BF16/AMX
for slots in $SLOTS; do
  "$PY" -m actors.engine bench --size "$SIZE" --device "$DEVICE" --dtype "$BENCH_DTYPE" \
    --rows $((slots * ROWS_PER_SLOT)) --max-rows "$slots" --frames "$FRAMES" --no-single \
    --json "$WORK/bench_$slots.json" | tail -2
done

"$PY" - "$WORK" "$OUT" "$DEVICE" <<'PYEOF'
import glob, json, os, sys
import xml.etree.ElementTree as ET
work, out, device = sys.argv[1:4]
suite = ET.parse(os.path.join(work, "tests.xml")).getroot()
suite = suite if suite.tag == "testsuite" else suite[0]
report = {
    "device": device,
    "tests": {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")},
    "parity": {os.path.basename(p)[7:-5]: json.load(open(p)) for p in sorted(glob.glob(f"{work}/parity_*.json"))},
    "frame_check": json.load(open(f"{work}/frame_check.json")),
    "bench": {os.path.basename(p)[6:-5]: json.load(open(p)) for p in glob.glob(f"{work}/bench_*.json")},
}
json.dump(report, open(out, "w"), indent=2)
print(f"gpu_check: wrote {out}")
PYEOF
