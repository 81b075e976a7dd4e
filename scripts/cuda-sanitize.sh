#!/usr/bin/env bash
# The CUDA sanitizers (compute-sanitizer memcheck, racecheck, synccheck,
# initcheck) over every CUDA test and one real-shaped hybrid run, with the
# tools' default settings. Run on the GPU machine for every CUDA change;
# record the table it prints last (docs/perf/sanitize.md).
#
# Usage: scripts/cuda-sanitize.sh [OUTDIR]
#   env BIN=build/bin                     the built tools and coli-tests
#       TOOLS="memcheck racecheck synccheck initcheck"
#       LAYERS=4                          the hybrid run's real-shaped model (3 DeltaNet + 1 attention layer)
#       LIMIT=240                         seconds per sanitizer and target before it counts as not finished
#
# Racecheck serialises the device's work: a kernel that spins on a flag a
# host thread writes (the expert handoff's join) may not see it change
# under it. Its runs therefore serve the handoff inline
# (CudaOptions::serve_handoff_inline: the host's part computed on the
# calling thread after the post, the same kernels and results;
# COLI_CUDA_HANDOFF=inline for the tools), and leave out the tier tests that
# need the threaded handoff; CudaTier.InlineHandoffMatchesTheThreadedOne
# runs the post and join kernels there. The other three sanitizers run
# every CUDA test as it is.
set -uo pipefail
out=${1:-sanitize-out}
bin=${BIN:-build/bin}
tools=${TOOLS:-memcheck racecheck synccheck initcheck}
layers=${LAYERS:-4}
limit=${LIMIT:-240}
cs=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
mkdir -p "$out"
export COLI_BIN_DIR=$bin

cuda_tests='Cuda.*:CudaBackend.*:CudaTier.*:HeatCuda.*'
# The tier tests whose handoff a host thread serves (racecheck leaves them out, above).
threaded='CudaTier.SameGreedyTokensAtEveryPlacement:CudaTier.LayerStepsAddTheHostsExperts:CudaTier.TheBudgetIsNeverExceeded:CudaTier.SwapsDoNotChangeTokens:CudaTier.DecodeMissesOverPcieKeepTokens:CudaTier.PcieReadsKeepTokens:CudaTier.PrefillUploadsMatchTheWholeModel:CudaTier.BackendsShareOneRegistrationOfAMirror'

# The hybrid run's model and mirror: the real shapes at int4-g32, a budget
# that holds part of the tier, the experts in a coli-pin mirror (registered:
# the PCIe reads and the prefill uploads run).
model=$out/real-L$layers.coli
[ -f "$model" ] || "$bin/coli-convert" synth -o "$model" --layers "$layers" --seed 0 --experts int4-g32 --trunk int4-g32 --lm-head int4-g32 >/dev/null
"$bin/coli-pin" start --model "$model" >/dev/null 2>&1 || echo "coli-pin start failed: the hybrid run reads the container" >&2
hybrid=("$bin/coli-run" -m "$model" --device cuda --vram-budget 1.6G --prefill-upload --no-swap --heat none
        --prompt-ids "$(seq -s, 1 40)" -n 6 --temp 0 --ignore-eos)

# run NAME TOOL CMD...: one sanitizer over one target, its summary kept.
declare -A result
run() {
  local name=$1 tool=$2; shift 2
  local log=$out/$tool-$name.log
  local t0=$SECONDS
  timeout "$limit" "$cs" --tool "$tool" --target-processes all --error-exitcode 99 "$@" >"$log" 2>&1
  local rc=$? secs=$((SECONDS - t0))
  local errors
  errors=$(grep -hoE '(ERROR SUMMARY|RACECHECK SUMMARY): [0-9]+ (errors|hazards)' "$log" | grep -oE '[0-9]+' | awk '{s += $1} END {print s + 0}')
  local note=ok
  [ $rc -eq 124 ] && note="not finished in ${limit}s"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 99 ] && note="exit $rc"
  [ $rc -eq 99 ] && note="errors"
  result[$tool/$name]="$errors|$secs|$note"
}

for tool in $tools; do
  if [ "$tool" = racecheck ]; then
    COLI_CUDA_HANDOFF=inline run tests "$tool" "$bin/coli-tests" --gtest_filter="$cuda_tests-$threaded"
    COLI_CUDA_HANDOFF=inline run hybrid "$tool" "${hybrid[@]}"
  else
    run tests "$tool" "$bin/coli-tests" --gtest_filter="$cuda_tests"
    run hybrid "$tool" "${hybrid[@]}"
  fi
done
"$bin/coli-pin" stop --model "$model" >/dev/null 2>&1 || true

printf '%-10s %-7s %8s %6s  %s\n' sanitizer target errors secs note | tee "$out/summary.txt"
for tool in $tools; do
  for name in tests hybrid; do
    IFS='|' read -r e s n <<<"${result[$tool/$name]}"
    printf '%-10s %-7s %8s %6s  %s\n' "$tool" "$name" "$e" "$s" "$n"
  done
done | tee -a "$out/summary.txt"
