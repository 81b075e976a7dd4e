#!/usr/bin/env bash
# Writes docs/quality.md: the reconstruction error of every weight format on
# Gaussian weights, and on the tiny qwen3_5_moe fixture the KL divergence and
# top-1 agreement of quantized containers against the unquantized model.
# Usage: scripts/quality_report.sh [OUT.md]   (needs build/bin/coli-convert)
set -euo pipefail
out=${1:-docs/quality.md}
bin=${BIN:-build/bin}
src=tests/data/tiny-qwen35moe-text
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
  echo "# Quantization quality"
  echo
  echo "Made by \`scripts/quality_report.sh\` at commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')."
  echo
  echo "## Reconstruction error of each format"
  echo
  echo "Relative RMS error ||W - Q(W)|| / ||W|| on a 1024 x 1024 matrix of N(0, 1)"
  echo "weights (\`coli-convert formats\`), and the bits each weight costs with its scales."
  echo
  echo "| format | bits / weight | relative RMS error |"
  echo "|---|---:|---:|"
  "$bin/coli-convert" formats | tail -n +2 | awk -F'\t' '{printf "| %s | %.3f | %.4f |\n", $1, $2, $3}'
  echo
  echo "## Tiny qwen3_5_moe fixture against its unquantized model"
  echo
  echo "\`coli-convert compare\`: 8 random sequences of 64 tokens (seed 0), logits of every"
  echo "position; KL(reference || quantized) in nats per token; weights error over all matrices."
  echo "Trunk, shared expert and lm_head int8 unless the row says otherwise; router and"
  echo "embeddings bf16; norms f32. The reference is the bf16 checkpoint run in float32."
  echo
  echo "| experts | trunk / lm_head | mean KL | max KL | top-1 agreement | max abs logit diff | weights rel. RMS error | greedy tokens = goldens |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|"
  for cfg in "bf16 bf16" "int8 int8" "int4-g32 int8" "int4-g64 int8" "int4-g128 int8" "int4-g32-asym int8" "int4-g64-asym int8" "int4-g128-asym int8" "int4 int8"; do
    set -- $cfg
    "$bin/coli-convert" "$src" -o "$tmp/m.coli" --experts "$1" --trunk "$2" --lm-head "$2" --force >/dev/null 2>&1
    row=$("$bin/coli-convert" compare "$src" "$tmp/m.coli" | tail -1)
    same=0
    for i in 0 1 2; do
      ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('tests/data/goldens/tiny-qwen35moe.json'))['prompts'][$i]['ids'])))")
      want=$(python3 -c "import json;print(' '.join(map(str,json.load(open('tests/data/goldens/tiny-qwen35moe.json'))['prompts'][$i]['greedy'])))")
      got=$("$bin/coli-run" --device cpu -m "$tmp/m.coli" --prompt-ids "$ids" -n 16 --temp 0 --ignore-eos 2>/dev/null)
      same=$((same + $(python3 -c "import sys;a=sys.argv[1].split();b=sys.argv[2].split();print(sum(x==y for x,y in zip(a,b)))" "$want" "$got")))
    done
    echo "$row" | awk -F'\t' -v e="$1" -v t="$2" -v s="$same" '{printf "| %s | %s | %.2e | %.2e | %.1f %% | %.3f | %.4f | %d / 48 |\n", e, t, $2, $3, 100*$4, $5, $6, s}'
  done
  echo
  echo "Greedy tokens are counted position by position over the 3 golden prompts (16 each);"
  echo "after a first difference the continuations drift apart, so a partial count is a lower"
  echo "bound on agreement. The fixture's logits reach about 25 in magnitude. Its rows are"
  echo "short (hidden 64, expert FFN 32), so int4-g64, int4-g128 and per-row int4 coincide on"
  echo "most matrices here; the Gaussian table above separates them at real row lengths."
} > "$out"
echo "wrote $out"
