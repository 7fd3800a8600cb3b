#!/usr/bin/env bash
# The CUDA graph measurement, from this repository alone, on a bare GPU machine.
#
# Installs nothing: a GPU machine here reaches no package index, so it runs on
# the machine's own Python and its CUDA build of torch, and imports
# strideguard from this checkout. The first Python whose torch sees a CUDA
# device is used (PYTHON overrides); with none, bench/gpu.py writes a JSON
# saying it skipped and exits 0. Writes bench/results/gpu.json and
# bench/results/gpu.png (the plot only where matplotlib is installed), then
# bench/results/gpu_oracle.json and bench/results/gpu_generated.json; bench/results/gpu_smoke.json first.
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

# One compile process per compile: Inductor's pool of compile workers is slow to start on some images, and
# the scripts compile in parallel themselves. TORCHINDUCTOR_VEC_ISA_OK=1 takes the CPU's vector ISA from its
# flags: on torch 2.11 the loader probes each ISA by compiling a program and importing torch in a child,
# which held bench/gpu.py for over two minutes on one image, for a CUDA package that runs no CPU kernel.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 MPLBACKEND=Agg \
  TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-1} TORCHINDUCTOR_VEC_ISA_OK=${TORCHINDUCTOR_VEC_ISA_OK:-1}
echo "bench/gpu.sh: $("$python" -c 'import sys, torch; print(sys.executable, "torch", torch.__version__, "cuda", torch.version.cuda)'); kernel $(uname -r); $(nproc) CPUs"
# A smoke test first: whether AOTInductor compiles, loads and runs a CUDA program on this machine at all, and
# which way of loading a package works here (bench/aoti_loader.py); the later steps load that way. Then the
# measurement (the README's GPU figures), then the two oracle checks of the fake-device CUDA lowering against
# the real compile: on attention (bench/gpu_oracle.py) and on generated programs, the fuzz's kept failures
# first (bench/gpu_generated.py). Mismatches print first; a check's failure does not stop the rest. Each
# step writes its JSON as it goes, so a step stopped at its limit keeps what it measured; the limits add up
# to under nine minutes.
# STRIDEGUARD_BENCH_AOTI_LOADER set beforehand (package or runner) skips the smoke test.
if [[ -z ${STRIDEGUARD_BENCH_AOTI_LOADER:-} ]]; then
  smoke=bench/results/gpu_smoke.json
  rm -f "$smoke"
  timeout --kill-after=10 150 "$python" bench/gpu_smoke.py --with-strideguard --timeout 45 --out "$smoke" \
    || echo "bench/gpu.sh: the smoke test failed"
  chosen=$("$python" -c 'import json, sys; c = json.load(open(sys.argv[1]))["chosen"]; print(c["loader"], c["preload"] or "") if c else None' "$smoke" 2>/dev/null || true)
  if [[ -z $chosen ]]; then
    echo "bench/gpu.sh: no way of loading an AOTInductor package works here; see $smoke" >&2
    exit 1
  fi
  read -r loader preload <<<"$chosen"
  export STRIDEGUARD_BENCH_AOTI_LOADER=$loader
  if [[ -n $preload ]]; then export LD_PRELOAD=$preload; fi
  echo "bench/gpu.sh: packages load through torch's $loader loader${preload:+, with $preload preloaded}"
fi
status=0
timeout --signal=INT --kill-after=10 150 "$python" bench/gpu.py "$@" || status=$?
timeout --signal=INT --kill-after=10 100 "$python" bench/gpu_oracle.py || echo "bench/gpu.sh: the attention oracle reported mismatches or failed"
timeout --signal=INT --kill-after=10 100 "$python" bench/gpu_generated.py --minutes 0.8 --batch 10 || echo "bench/gpu.sh: the generated-program oracle reported mismatches or failed"
exit $status
