#!/usr/bin/env bash
# Plots a coli-bench sweep to PNG with gnuplot: one line per test name, Y
# against a swept parameter X.
# Usage: scripts/plot_bench.sh RESULTS.tsv X_FIELD OUT.png [Y_FIELD]
#   e.g. coli-bench -m m.coli -p 64,128,256,512 -n 0 > pp.tsv
#        scripts/plot_bench.sh pp.tsv n_prompt pp.png avg_ts
# Needs gnuplot (Debian: gnuplot-nox). Records with an error are skipped.
set -euo pipefail
in=${1:?usage: plot_bench.sh RESULTS.tsv X_FIELD OUT.png [Y_FIELD]}
x=${2:?X field}
out=${3:?OUT.png}
y=${4:-avg_ts}
command -v gnuplot >/dev/null || { echo "plot_bench.sh: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Per test (with its depth suffix stripped of spaces), "x y" lines sorted by x.
awk -F'\t' -v X="$x" -v Y="$y" -v dir="$tmp" '
  NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i
            if (!(X in col) || !(Y in col) || !("test" in col)) { print "plot_bench.sh: no field " X " or " Y > "/dev/stderr"; exit 2 }
            next }
  $col["error"] != "" { next }
  { t = $col["test"]; gsub(/[0-9]+/, "N", t); gsub(/ /, "", t); print $col[X], $col[Y] >> (dir "/" t ".dat") }
' "$in"
plots=""
for f in "$tmp"/*.dat; do
  [ -e "$f" ] || { echo "plot_bench.sh: no records to plot" >&2; exit 1; }
  sort -n "$f" -o "$f"
  name=$(basename "$f" .dat)
  plots+="${plots:+, }'$f' using 1:2 with linespoints title '$name'"
done
gnuplot <<GP
set terminal pngcairo size 900,560 noenhanced
set output '$out'
set xlabel '$x'
set ylabel '$y'
set grid
set key left top
set title 'coli-bench: $y vs $x ($(basename "$in"))'
plot $plots
GP
echo "$out"
