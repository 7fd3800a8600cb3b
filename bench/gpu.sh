#!/usr/bin/env bash
# The CUDA graph measurement, from this repository alone, on a bare GPU machine.
#
# Installs nothing: a GPU machine here reaches no package index, so it runs on
# the machine's own Python and its CUDA build of torch, and imports
# strideguard from this checkout. The first Python whose torch sees a CUDA
# device is used (PYTHON overrides); with none, bench/gpu.py writes a JSON
# saying it skipped and exits 0. Writes bench/results/gpu.json and
# bench/results/gpu.png (the plot only where matplotlib is installed).
# Arguments go to bench/gpu.py (--steps, --jobs, --out, --plot).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

has_torch() { command -v "$1" >/dev/null && "$1" -c 'import torch' 2>/dev/null; }
sees_cuda() { "$1" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; }

python=${PYTHON:-}
if [[ -z $python ]]; then
  candidates=(python3 .venv/bin/python python)
  for candidate in "${candidates[@]}"; do
    if has_torch "$candidate" && sees_cuda "$candidate"; then python=$candidate; break; fi
  done
  for candidate in "${candidates[@]}"; do
    if [[ -z $python ]] && has_torch "$candidate"; then python=$candidate; fi
  done
fi
if [[ -z $python ]]; then
  echo "bench/gpu.sh: no Python with torch found; set PYTHON" >&2
  exit 1
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
echo "bench/gpu.sh: $("$python" -c 'import sys, torch; print(sys.executable, "torch", torch.__version__, "cuda", torch.version.cuda)')"
# First the oracle check: the fake-device CUDA lowering's predictions against the real compile, mismatches
# printed first (bench/gpu_oracle.py, bench/results/gpu_oracle.json); its failure does not stop the rest.
timeout --signal=INT --kill-after=10 240 "$python" bench/gpu_oracle.py || echo "bench/gpu.sh: the oracle check reported mismatches or failed"
# Under four minutes: bench/gpu.py writes its JSON after each variant, so a run
# stopped here keeps what it measured.
exec timeout --signal=INT --kill-after=10 215 "$python" bench/gpu.py "$@"
