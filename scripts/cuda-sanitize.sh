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
#       LIMIT=300                         seconds per (sanitizer, test) before it counts as not finished
#       JOBS=1                            sanitizer runs at once (each test is its own process; two or
#                                         more slow each other down far more than they overlap: 16 s
#                                         alone, over 240 s with 3 others, for one memcheck run)
#       PAIRS="TOOL:TEST ..."             only these (sanitizer, test) runs (TEST: a test's full name or hybrid)
#
# Each (sanitizer, test) pair runs as its own process, JOBS at a time: the
# tests then share the device, and say so to the tests
# (COLI_TEST_SHARED_DEVICE=1: the device's free memory is not held against a
# budget; the budget's own ledger still is).
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
limit=${LIMIT:-300}
jobs=${JOBS:-1}
cs=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export COLI_BIN_DIR=$bin COLI_TEST_SHARED_DEVICE=1

cuda_tests='Cuda.*:CudaRows.*:CudaBackend.*:CudaBackend/*:CudaTier.*:HeatCuda.*:VramLedgerCuda.*:RunSetupCuda.*:ServeCuda.*:MtpCuda.*'
# The tier tests whose handoff a host thread serves (racecheck leaves them out, above).
threaded=' CudaRows.UnderABudgetMatchesEachSessionAlone RunSetupCuda.TakesTheFreeMemoryItFinds RunSetupCuda.ABackgroundPinIsTakenOrRefusedWithALine CudaTier.ABackgroundPinSwitchesOverBetweenChunks RunSetupCuda.RefusedPinningRunsPageableAndSaysSo CudaTier.SameGreedyTokensAtEveryPlacement CudaTier.LayerStepsAddTheHostsExperts CudaTier.TheBudgetIsNeverExceeded CudaTier.SwapsDoNotChangeTokens CudaTier.DecodeMissesOverPcieKeepTokens CudaTier.PcieReadsKeepTokens CudaTier.SplitExpertsKeepTheWholeModelsLogits CudaTier.PrefillUploadsMatchTheWholeModel CudaTier.TheCpuTakesPartOfAPromptsUploads CudaTier.BackendsShareOneRegistrationOfAMirror ServeCuda.GreedyRepliesWholeAndUnderABudget CudaTier.FusedDecodeKernelsKeepEveryLogit CudaTier.OtherFamiliesKeepTheWholeModelsLogits CudaTier.OtherFamiliesFixturesUnderBudgets '
tests=$("$bin/coli-tests" --gtest_list_tests --gtest_filter="$cuda_tests" | awk '/^[^ ]/ { s = $1 } /^  / { print s $1 }')

# The hybrid run's model and mirror: the real shapes at int4-g32, a budget
# that holds part of the tier, the experts in a coli-pin mirror (registered:
# the PCIe reads and the prefill uploads run).
model=$out/real-L$layers.coli
[ -f "$model" ] || "$bin/coli-convert" synth -o "$model" --layers "$layers" --seed 0 --experts int4-g32 --trunk int4-g32 --lm-head int4-g32 >/dev/null
"$bin/coli-pin" start --model "$model" >/dev/null 2>&1 || echo "coli-pin start failed: the hybrid run reads the container" >&2
hybrid="$bin/coli-run -m $model --device cuda --vram-budget 1.6G --prefill-upload --no-swap --heat none --prompt-ids $(seq -s, 1 40) -n 6 --temp 0 --ignore-eos -v"

# one TOOL NAME: one sanitizer over one test (or "hybrid"); a line
# "TOOL NAME ERRORS SECONDS NOTE" into its .res file.
one() {
  local tool=$1 name=$2 file=${2//\//_}  # a parameterized test's name has slashes
  local log=$out/$1-$file.log
  local cmd=("$bin/coli-tests" --gtest_filter="$name")
  [ "$name" = hybrid ] && read -r -a cmd <<<"$hybrid"
  local env=()
  [ "$tool" = racecheck ] && env=(COLI_CUDA_HANDOFF=inline)
  local t0=$SECONDS
  env "${env[@]}" timeout "$limit" "$cs" --tool "$tool" --target-processes all --error-exitcode 99 "${cmd[@]}" >"$log" 2>&1
  local rc=$? secs=$((SECONDS - t0)) note=ok
  local errors
  errors=$(grep -hoE '(ERROR SUMMARY|RACECHECK SUMMARY): [0-9]+ (errors|hazards)' "$log" | grep -oE '[0-9]+' | awk '{s += $1} END {print s + 0}')
  grep -qE '(ERROR|RACECHECK) SUMMARY' "$log" || errors=-
  [ $rc -eq 124 ] && note="not finished in ${limit}s"
  [ $rc -eq 99 ] && note=errors
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 99 ] && note="exit $rc (the test or run failed)"
  echo "$tool $name $errors $secs $note" >"$out/$tool-$file.res"
}
export -f one
export out bin limit cs hybrid

pairs() {
  if [ -n "${PAIRS:-}" ]; then
    for p in $PAIRS; do echo "${p%%:*} ${p#*:}"; done
    return
  fi
  for tool in $tools; do
    for t in $tests hybrid; do
      [ "$tool" = racecheck ] && [[ "$threaded" == *" $t "* ]] && continue
      echo "$tool $t"
    done
  done
}
pairs | xargs -P "$jobs" -L 1 bash -c 'one "$0" "$1"'
"$bin/coli-pin" stop --model "$model" >/dev/null 2>&1 || true

{
  printf '%-10s %-55s %7s %5s  %s\n' sanitizer target errors secs note
  for tool in $tools; do cat "$out/$tool"-*.res 2>/dev/null | sort -k2 | awk '{ n = $5; for (i = 6; i <= NF; i++) n = n " " $i; printf "%-10s %-55s %7s %5s  %s\n", $1, $2, $3, $4, n }'; done
  for tool in $tools; do
    cat "$out/$tool"-*.res 2>/dev/null | awk -v t="$tool" '{ if ($3 != "-") e += $3; n++; if ($5 != "ok") bad++ } END { printf "%-10s %-55s %7d %5s  %d runs, %d not clean\n", t, "TOTAL", e, "", n, bad }'
  done
} | tee "$out/summary.txt"
