#!/usr/bin/env bash
# The CUDA graph measurement, from this repository alone, on a bare GPU machine.
#
# Installs nothing: a GPU machine here reaches no package index, so it runs on
# the machine's own Python and its CUDA build of torch, and imports
# strideguard from this checkout. The first Python whose torch sees a CUDA
# device is used (PYTHON overrides); with none, bench/gpu.py writes a JSON
# saying it skipped and exits 0. Writes bench/results/gpu.json and
# bench/results/gpu.png (the plot only where matplotlib is installed), then
# bench/results/gpu_oracle.json and bench/results/gpu_generated.json.
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

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 MPLBACKEND=Agg
echo "bench/gpu.sh: $("$python" -c 'import sys, torch; print(sys.executable, "torch", torch.__version__, "cuda", torch.version.cuda)')"
# The measurement first (the README's GPU figures), then the two oracle checks of the fake-device CUDA
# lowering against the real compile: on attention (bench/gpu_oracle.py) and on generated programs, the
# fuzz's kept failures first (bench/gpu_generated.py). Mismatches print first; a check's failure does not
# stop the rest. Each step writes its JSON as it goes, so a step stopped at its limit keeps what it measured;
# the limits add up to under eight minutes.
# A smoke test first, with and without strideguard imported, side by side: whether AOTInductor compiles,
# loads and runs a CUDA program on this machine at all (a crash prints where it happened).
status=0
timeout 90 "$python" bench/gpu_smoke.py & smoke=$!
timeout 90 "$python" bench/gpu_smoke.py --with-strideguard || echo "bench/gpu.sh: the smoke test failed with strideguard imported"
wait $smoke || echo "bench/gpu.sh: the smoke test failed without strideguard"
timeout --signal=INT --kill-after=10 150 "$python" bench/gpu.py "$@" || status=$?
timeout --signal=INT --kill-after=10 100 "$python" bench/gpu_oracle.py || echo "bench/gpu.sh: the attention oracle reported mismatches or failed"
timeout --signal=INT --kill-after=10 100 "$python" bench/gpu_generated.py --minutes 0.8 --batch 10 || echo "bench/gpu.sh: the generated-program oracle reported mismatches or failed"
exit $status
