#!/usr/bin/env bash
# The job on a GPU (scripts/gpu_job.py says what it runs and measures), with the python3 on the
# PATH, as the lent GPU machine's image has it: nothing is installed but the wheels of what the
# image lacks, soundfile (FLAC, with libsndfile inside) and soxr (reference clips' resampling), if
# python3 cannot import them. They are carried as wheels in .whl/ (1.8 MB in all), fetched once on
# a machine with pip, for the image's Python 3.12:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 soxr==1.1.0
# and installed here into a temporary folder on PYTHONPATH (no network needed).
#   bash scripts/gpu_job.sh [--out DIR] [--deadline-s S] [--models s1-mini,s2-pro] [--device cpu --quick]
#   CHORUS_PYTHON=...  another interpreter (CI: the GPU check's reduced venv, which holds them)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${CHORUS_PYTHON:-python3}"
if ! "$PY" -c "import soundfile, soxr" 2>/dev/null; then
  if ! compgen -G ".whl/*.whl" >/dev/null; then
    echo "gpu_job: $PY cannot import soundfile and soxr, and .whl/ holds no wheels: see scripts/gpu_job.sh" >&2
    exit 2
  fi
  site="$(mktemp -d)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PY" scripts/gpu_job.py "$@"
