#!/usr/bin/env bash
# Prefill thread scaling (issue 6): pp512 on one container at 1, 2, 4, ...
# threads, with the engine's stage times, to separate serial from parallel
# cost. Usage: scripts/bench_cpu_scaling.sh MODEL "1 2 4 8 16" [OUT.tsv]
# (env BIN=build/bin)
set -euo pipefail
model=${1:?usage: bench_cpu_scaling.sh MODEL THREADS [OUT.tsv]}
threads=${2:-"1 2 4 8 $(nproc)"}
out=${3:-/dev/null}
bin=${BIN:-build/bin}
list=$(echo $threads | tr ' ' ',')
"$bin/coli-bench" --device cpu -m "$model" -p 512 -n 0 -r 2 -t "$list" -o tsv | tee "$out" |
  awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
              { printf "pp512 t=%-3s %8.1f t/s  trunk %5.0f  router %4.0f  shared %4.0f  experts %5.0f  combine %3.0f ms %s\n",
                $c["n_threads"], $c["avg_ts"], $c["t_trunk_ms"], $c["t_router_ms"], $c["t_shared_ms"], $c["t_cpu_experts_ms"], $c["t_combine_ms"], $c["error"] }'
