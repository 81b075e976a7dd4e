#!/usr/bin/env bash
# Before/after speeds of two builds in one call (issue 27: a restructuring
# keeps speed): the 8-layer real-shaped int4-g32 model whole on the GPU, and
# under VRAM budgets without and with a coli-pin mirror (the mirror runs
# with --prefill-upload, --pcie-read at its default auto). Per
# configuration the builds run old, new, new, old, so that drift in the
# machine (page cache, clocks, a warming disk) hits both alike.
# Usage: scripts/bench_ab.sh WORKDIR OLD_BIN NEW_BIN [BUDGETS] [REPS]
# Prints one line per (configuration, build, test) last; records in WORKDIR.
set -euo pipefail
work=${1:?usage: bench_ab.sh WORKDIR OLD_BIN NEW_BIN [BUDGETS] [REPS]}
old=${2:?}; new=${3:?}
budgets=${4:-1.75G,2.5G,3.3G}
reps=${5:-3}
layers=${LAYERS:-8}
mkdir -p "$work"
model="$work/q4-L$layers.coli"
[ -f "$model" ] || "$new/coli-convert" synth -o "$model" --layers "$layers" --seed 0 --experts int4-g32 --trunk int4-g32 --lm-head int4-g32 >/dev/null
common=(--device cuda -m "$model" -p 512 -n 128 -r "$reps" --no-swap --heat none -o tsv)
bench() {  # NAME BIN ARGS...
  local name=$1 bin=$2; shift 2
  "$bin/coli-bench" "${common[@]}" "$@" | awk -v n="$name" 'NR == 1 { print "config\t" $0; next } { print n "\t" $0 }' >>"$work/ab.tsv.tmp"
}
rm -f "$work/ab.tsv.tmp"
for side in old new new old; do bin=${!side}; bench "whole/$side" "$bin" --mirror off; done
for side in old new new old; do bin=${!side}; bench "budget/$side" "$bin" --mirror off --vram-budget "$budgets"; done
"$new/coli-pin" start --model "$model" >/dev/null
for side in old new new old; do bin=${!side}; bench "mirror+upload/$side" "$bin" --vram-budget "$budgets" --prefill-upload; done
"$new/coli-pin" stop --model "$model" >/dev/null || true
# One header, then the records.
awk 'NR == 1 || $1 != "config"' "$work/ab.tsv.tmp" >"$work/ab.tsv" && rm -f "$work/ab.tsv.tmp"
awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
            { printf "%-20s %-6s budget %6s MiB  %10.1f +- %6.1f t/s  hit %6s  pcie %6s %s\n", $1, $c["test"], $c["vram_budget_mb"], $c["avg_ts"], $c["stddev_ts"],
              $c["tier_hit_rate"], $c["tier_pcie_pairs"], $c["error"] }' "$work/ab.tsv"
