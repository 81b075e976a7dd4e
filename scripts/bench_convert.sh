#!/usr/bin/env bash
# Times coli-convert on a synthetic Qwen3.6-35B-A3B-shaped checkpoint:
# synth (bf16 HF checkpoint), then conversion to containers.
# Usage: scripts/bench_convert.sh WORKDIR [LAYERS]   (env BIN=build/bin)
# Prints a TSV table: step, seconds, GB in, GB out, GB/s.
set -euo pipefail
work=${1:?usage: bench_convert.sh WORKDIR [LAYERS]}
layers=${2:-8}
bin=${BIN:-build/bin}
mkdir -p "$work"
t() { local s=$(date +%s.%N); "$@" >/dev/null 2>"$work/log"; local e=$(date +%s.%N); python3 -c "print(f'{$e-$s:.1f}')"; }
gb() { du -sb "$1" | awk '{printf "%.2f", $1/1e9}'; }
printf 'step\tseconds\tGB_in\tGB_out\tGB_in_per_s\n'
s=$(t "$bin/coli-convert" synth -o "$work/synth" --layers "$layers" --seed 0 --force)
printf 'synth %s layers\t%s\t-\t%s\t-\n' "$layers" "$s" "$(gb "$work/synth")"
for fmt in int4-g64 int8; do
  s=$(t "$bin/coli-convert" "$work/synth" -o "$work/$fmt.coli" --experts "$fmt" --force)
  sed -n 's/^coli-convert: //p' "$work/log" >&2
  in=$(gb "$work/synth"); out=$(gb "$work/$fmt.coli")
  printf 'convert experts=%s\t%s\t%s\t%s\t%s\n' "$fmt" "$s" "$in" "$out" "$(python3 -c "print(f'{$in/$s:.2f}')")"
  rm -f "$work/$fmt.coli"
done
