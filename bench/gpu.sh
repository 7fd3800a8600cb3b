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
#
# Rehearsed on the CPU (`make rehearse-gpu`): `bash bench/gpu.sh --rehearse-on-cpu`, or
# STRIDEGUARD_REHEARSE_ON_CPU=1, runs every step in its CPU form under the limit it has on a GPU and writes
# to out/gpu-rehearsal/ (STRIDEGUARD_GPU_RESULTS overrides either folder); there any step that fails or
# runs past its limit makes the exit status 1, where on a GPU only the measurement's own status counts.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rehearse=${STRIDEGUARD_REHEARSE_ON_CPU:-}
[[ $rehearse == 0 ]] && rehearse=
if [[ ${1:-} == --rehearse-on-cpu ]]; then rehearse=1; shift; fi
results=${STRIDEGUARD_GPU_RESULTS:-$([[ -n $rehearse ]] && echo out/gpu-rehearsal || echo bench/results)}
mkdir -p "$results"

has_torch() { command -v "$1" >/dev/null && "$1" -c 'import torch' 2>/dev/null; }
sees_cuda() { "$1" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; }

python=${PYTHON:-}
if [[ -z $python ]]; then
  candidates=(python3 .venv/bin/python python)
  for candidate in "${candidates[@]}"; do
    if [[ -z $rehearse ]] && has_torch "$candidate" && sees_cuda "$candidate"; then python=$candidate; break; fi
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
# the scripts compile in parallel themselves. TORCHINDUCTOR_VEC_ISA_OK=0 declares no CPU vector ISA, for
# packages that run no CPU kernel (in the rehearsal the CPU kernels run unvectorized, to the same values):
# torch 2.11 probes each ISA by compiling a program and importing torch in a child, which held bench/gpu.py
# for over two minutes on one image, and with =1 it still probes AVX-512's bf16, VNNI and AMX where the CPU
# has them (six child imports in every process that compiles or loads a package: 17 s of an 18.5 s load
# on a development machine).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 MPLBACKEND=Agg \
  TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-1} TORCHINDUCTOR_VEC_ISA_OK=${TORCHINDUCTOR_VEC_ISA_OK:-0}
echo "bench/gpu.sh: $("$python" -c 'import sys, torch; print(sys.executable, "torch", torch.__version__, "cuda", torch.version.cuda)'); kernel $(uname -r); $(nproc) CPUs${rehearse:+; rehearsed on the CPU}"

# A smoke test first: whether AOTInductor compiles, loads and runs a CUDA program on this machine at all, and
# which way of loading a package works here (bench/aoti_loader.py); the later steps load that way. Then the
# measurement (the README's GPU figures), then the two oracle checks of the fake-device CUDA lowering against
# the real compile, side by side: on attention (bench/gpu_oracle.py) and on generated programs, the fuzz's
# kept failures first (bench/gpu_generated.py). Mismatches print first; on a GPU a check's failure does not
# stop the rest. Each step writes its JSON as it goes, so a step stopped at its limit keeps what it measured.
#
# The limits, for 9 minutes (540 s) in all on a GPU machine as last seen: 16 cores, an AOTInductor CUDA
# compile of one program (a lone nn.Linear) 55 to 81 s, taken as C = 81 s; a process's import of torch and
# strideguard taken as I = 15 s. Every step compiles all it compiles at once, one process per compile
# (the oracles split the cores between them), so that each step waits for one compile, not several:
#   header      I                                                                      15 s
#   smoke       I + export 2 + C + the load ways side by side (each at most 40 s)
#               15 + 2 + 81 + 40 = 138                                                 limit 140 s
#   gpu.py      I + 6 compile workers at once (I + export and fix 5 + C) + 6 x (export, fix, load,
#               2 x 2,000 timed steps and the checks: about 6 s)
#               15 + (15 + 5 + 81) + 6 x 6 = 152                                       limit 170 s
#   the oracles side by side, 8 workers each (nproc / 2):
#     gpu_oracle.py     I + 6 (8 with two more cases) compile workers at once + 6 loads and runs
#                       15 + (15 + 5 + 81) + 6 x 2 = 128                               limit 200 s
#     gpu_generated.py  I + 8 compile workers, batches of 10 (kernels of ten programs: 1.5 C = 120)
#                       + the predictions and comparisons, about 5 s a batch
#                       15 + (15 + 5 + 120) + 4 x 5 = 175                              limit 200 s
#                       No compile starts after 60 s (--minutes 1): with C = 81 the first 8 compiles
#                       (4 batches, 40 of the 50 kept failures) run; faster compiles let more start.
#   each limit + 5 s to end a process that ignores the interrupt: 15 + 140 + 170 + 200 + 3 x 5 = 540 s.
# STRIDEGUARD_BENCH_AOTI_LOADER set beforehand (package or runner) skips the smoke test.
GRACE=5 SMOKE_LIMIT=140 SMOKE_CHILD_LIMIT=40 MEASURE_LIMIT=170 ORACLE_LIMIT=200 GENERATED_MINUTES=1
cores=$(nproc)
oracle_jobs=$(( cores / 2 > 0 ? cores / 2 : 1 )) generated_jobs=$(( cores - cores / 2 > 0 ? cores - cores / 2 : 1 ))
cpu_flag=${rehearse:+--rehearse-on-cpu}
failed=() times=()

# step NAME LIMIT COMMAND...: COMMAND under LIMIT seconds; says how it ended and returns its status.
step() {
  local name=$1 limit=$2 started=$SECONDS status=0
  shift 2
  timeout --signal=INT --kill-after=$GRACE "$limit" "$@" || status=$?
  if (( status == 124 || status == 137 )); then
    echo "bench/gpu.sh: $name: stopped at its limit, $limit s"
  elif (( status != 0 )); then
    echo "bench/gpu.sh: $name: exit $status after $((SECONDS - started)) s"
  else
    echo "bench/gpu.sh: $name: done in $((SECONDS - started)) s (limit $limit s)"
  fi
  return "$status"
}

if [[ -z ${STRIDEGUARD_BENCH_AOTI_LOADER:-} ]]; then
  smoke=$results/gpu_smoke.json
  rm -f "$smoke"
  started=$SECONDS
  step smoke "$SMOKE_LIMIT" "$python" bench/gpu_smoke.py --with-strideguard --timeout "$SMOKE_CHILD_LIMIT" --out "$smoke" \
    || { echo "bench/gpu.sh: the smoke test failed"; failed+=(smoke); }
  times+=("smoke $((SECONDS - started)) s")
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

status=0 started=$SECONDS
step measurement "$MEASURE_LIMIT" "$python" bench/gpu.py $cpu_flag --out "$results/gpu.json" "$@" || { status=$?; failed+=(measurement); }
times+=("measurement $((SECONDS - started)) s")

# The two oracles at once, each line marked with its step's name: they share the cores between them.
started=$SECONDS
marked() { local mark=$1; shift; "$@" 2>&1 | sed -u "s/^/[$mark] /"; }
marked oracle step gpu_oracle "$ORACLE_LIMIT" "$python" bench/gpu_oracle.py $cpu_flag --jobs "$oracle_jobs" \
  --out "$results/gpu_oracle.json" & oracle=$!
marked generated step gpu_generated "$ORACLE_LIMIT" "$python" bench/gpu_generated.py $cpu_flag --jobs "$generated_jobs" \
  --minutes "$GENERATED_MINUTES" --batch 10 --out "$results/gpu_generated.json" & generated=$!
wait "$oracle" || { echo "bench/gpu.sh: the attention oracle reported mismatches or failed"; failed+=(gpu_oracle); }
wait "$generated" || { echo "bench/gpu.sh: the generated-program oracle reported mismatches or failed"; failed+=(gpu_generated); }
times+=("oracles $((SECONDS - started)) s")

echo "bench/gpu.sh: ${times[*]}; $SECONDS s in all; results in $results${failed:+; failed: ${failed[*]}}"
if [[ -n $rehearse ]]; then
  exit $(( ${#failed[@]} > 0 ))
fi
exit $status
