#!/usr/bin/env bash
# Decode speed against context depth with coli-run: a prompt of D random ids,
# then N greedy tokens; prints "depth  decode_tok_s  ms_per_token" per depth.
# Gated DeltaNet layers carry a fixed-size state, so only the attention
# layers' KV reads should make a token cost more at larger depth.
# Usage: scripts/bench_decode_depth.sh MODEL_DIR [depths...]   (env: N=64, BIN=build/bin)
set -euo pipefail
model=${1:?usage: bench_decode_depth.sh MODEL_DIR [depths...]}
shift
depths=${*:-16 256 1024 4096}
N=${N:-64}
BIN=${BIN:-build/bin}
vocab=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1]+'/config.json')); print(c.get('text_config',c)['vocab_size'])" "$model")
printf 'depth\tdecode_tok_s\tms_per_token\n'
for d in $depths; do
  ids=$(python3 -c "import random,sys; r=random.Random(int(sys.argv[1])); print(','.join(str(r.randrange(int(sys.argv[2]))) for _ in range(int(sys.argv[1]))))" "$d" "$vocab")
  stats=$("$BIN/coli-run" --device cpu --model "$model" --prompt-ids "$ids" -n "$N" --ignore-eos 2>&1 >/dev/null | grep 'decode')
  tps=$(sed -E 's/.*decode ([0-9.]+) tok\/s.*/\1/' <<<"$stats")
  printf '%s\t%s\t%.3f\n' "$d" "$tps" "$(python3 -c "print(1000/float('$tps'))")"
done
