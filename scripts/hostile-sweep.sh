#!/usr/bin/env bash
# hostile-sweep.sh: issue 29's hostile-user sweep, re-runnable.
#
#   BIN=build/bin scripts/hostile-sweep.sh        (BIN: the built tools)
#
# About 70 cases over coli-pin, coli-place, coli-run and coli-bench: the
# bad and weak cases issue 29 lists, and the good ones as a hostile user
# tries them (garbage, negative, NaN and huge flag values; missing,
# unreadable and non-regular files; truncated and corrupted containers;
# empty, CR-only, binary, huge-line and huge heat, plan and rates files;
# paths under a regular file; missing output directories; odd segment
# names; keepers started and stopped at once; runs merging one heat file
# at once; output onto a full device).
#
# Each case runs in a scratch directory under `timeout` (SWEEP_TIMEOUT, 20 s;
# a few that are expected to hang, 5 s) and a virtual-memory cap (ulimit -v,
# SWEEP_MEM_KB), with XDG_CACHE_HOME and HOME inside the scratch directory.
# A case states the exit status it expects and an extended regular
# expression (case-insensitive) that its stderr must match: the file, flag
# or tensor the error is about. The verdict, by these rules, in this order:
#
#   bad   hang (killed by the timeout: 124/137); crash (killed by a signal:
#         status > 128); the memory cap hit (bad_alloc, "out of memory");
#         the case's own check finds data lost or corrupted, a process or
#         segment left behind, or a claim that is not true; exit 0 where
#         an error was expected (bad input taken silently).
#   weak  an error exit with another status than expected (usage errors
#         exit 2, other errors 1); a message that does not match the
#         pattern (does not name the file/flag/tensor); the error not on
#         stderr's first line; the case's check finds something minor;
#         exit 0 on bad input where the case marks the acceptance as
#         harmless ("lenient": nothing lost, the input is reinterpreted).
#   good  otherwise: the expected status, a one-line error naming the
#         thing, nothing left behind (or, for valid input, exit 0).
#
# A case may carry a note ("intended: ..." or "open: ..."), printed with it.
#
# Models: the tests' tiny checkpoint (tests/data/tiny-qwen35moe-text with
# tests/data/tiny-tokenizer) converted to a 1.9 MB container in a second,
# for all cases but the keeper races; those need a start that takes long
# enough to hit, so they use `coli-convert synth -o s.coli --layers
# $SYNTH_LAYERS` (default 1: 2.0 GB, 0.4 GB of experts, about 30 s on 2
# cores, made in the background while the other cases run; --layers 2 is
# 2.5 GB and about 55 s). SWEEP_SYNTH=0 runs the races on the tiny model.
#
# Prints each case as it runs, then a table (id, verdict, rc, expected rc,
# seconds, stderr's first line) and the counts; exits 0 when no case is
# bad, 1 otherwise. Keepers the sweep starts are stopped on exit, and the
# scratch directory removed (SWEEP_KEEP=1 keeps it).
set -u
export LC_ALL=C

BIN=${BIN:-build/bin}
BIN=$(cd "$BIN" && pwd) || { echo "hostile-sweep: BIN=$BIN is not a directory" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
DATA=$REPO/tests/data
TO=${SWEEP_TIMEOUT:-20}
MEM_KB=${SWEEP_MEM_KB:-2000000}      # 2 GB of address space for the tiny model's cases
BIG_MEM_KB=${SWEEP_BIG_MEM_KB:-8000000}  # the synthetic model's keepers map 2-2.5 GB
SYNTH_LAYERS=${SYNTH_LAYERS:-1}
SWEEP_SYNTH=${SWEEP_SYNTH:-1}
for t in coli-pin coli-place coli-run coli-bench coli-convert; do
  [ -x "$BIN/$t" ] || { echo "hostile-sweep: no $BIN/$t" >&2; exit 2; }
done
command -v python3 >/dev/null || { echo "hostile-sweep: needs python3 (to corrupt containers)" >&2; exit 2; }

T=$(mktemp -d "${TMPDIR:-/tmp}/coli-sweep.XXXXXX")
W=$T/w
mkdir -p "$W" "$T/cache" "$T/home" "$T/res"
export PATH=$BIN:$PATH XDG_CACHE_HOME=$T/cache HOME=$T/home
TAG=sweep$$
SHM_JUNK=()   # /dev/shm entries this sweep makes
FPS=()        # fingerprints whose keepers this sweep may start
SYNTH_PID=

cleanup() {
  for fp in "${FPS[@]}"; do
    [ -n "$fp" ] || continue
    # The keeper's own pid, read from its segment (never a pattern kill).
    pid=$(coli-pin status --json 2>/dev/null | python3 -c "import json,sys
for s in json.load(sys.stdin):
  if s['name']=='coli-$fp' and s['owner_alive']: print(s['owner_pid'])" 2>/dev/null)
    timeout 15 coli-pin stop "coli-$fp" >/dev/null 2>&1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && kill "$pid" 2>/dev/null
  done
  for j in "${SHM_JUNK[@]}"; do
    [ -p "$j" ] && timeout 2 bash -c ": <> '$j'" 2>/dev/null  # release openers blocked on the FIFO
    rm -rf "$j"
  done
  [ -n "$SYNTH_PID" ] && kill -0 "$SYNTH_PID" 2>/dev/null && kill "$SYNTH_PID" 2>/dev/null
  if [ "${SWEEP_KEEP:-0}" = 1 ]; then echo "hostile-sweep: kept $T" >&2; else rm -rf "$T"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cd "$W" || exit 2

# ---- fixtures ---------------------------------------------------------------
start_s=$(date +%s.%N)
if [ "$SWEEP_SYNTH" = 1 ]; then
  (coli-convert synth -o s.coli --layers "$SYNTH_LAYERS" --seed 0 >"$T/synth.log" 2>&1) &
  SYNTH_PID=$!
fi
mkdir -p src && cp "$DATA"/tiny-qwen35moe-text/*.json "$DATA"/tiny-qwen35moe-text/*.safetensors "$DATA"/tiny-tokenizer/*.json src/
# Formats no test uses, so that this model's segment name is the sweep's own.
coli-convert src -o m.coli --experts int4-g32-asym --down int8 >/dev/null 2>&1 || { echo "hostile-sweep: cannot convert the tiny model" >&2; exit 2; }
FP=$(coli-convert info m.coli | awk '$1=="fingerprint"{print $2}')
FPS+=("$FP")
mkfifo f.coli
mkdir nomodel
printf '\r\r\r\r' >cr.txt
: >empty.txt
python3 -c "import random,sys; random.seed(29); sys.stdout.buffer.write(bytes(random.randrange(256) for _ in range(20480)))" >junk.bin
head -c 3000000 /dev/zero | tr '\0' x >longline.txt
truncate -s 300M huge.txt
printf 'x\n' >plain.txt
printf '\xff\xfe hello \xc3\x28 world\n' >nonutf8.txt
printf '[{"role": "user", "content": ' >bad.json
coli-run -m m.coli --device cpu --prompt-ids 1,2,3 -n 4 --temp 0 --heat heat.txt >/dev/null 2>&1
sed "s/^model $FP/model 0000000000000bad/" heat.txt >other-heat.txt
sed 's/^\(layer 0 \)\([0-9]\)/\1-\2/' heat.txt >neg-heat.txt
coli-place plan -m m.coli --vram 1G --heat none -o good.plan >/dev/null 2>&1
sed 's/^\(layer 3 vram \)0-15/\10-99/' good.plan >range.plan
coli-place probe -o rates.txt --seconds 0.01 >/dev/null 2>&1
sed 's/^host_expert_gbs .*/host_expert_gbs nan/' rates.txt >nan-rates.txt
sz=$(stat -c %s m.coli)
head -c $((sz / 2)) m.coli >half.coli
python3 - <<'EOF'
import json, struct
d = bytes(open('m.coli', 'rb').read())
off, ln = struct.unpack_from('<QQ', d, 24)          # the manifest's offset and length
blobs = json.loads(d[off:off + ln])['blobs']
e = bytearray(d)
for b in blobs:
    if b['kind'] == 'expert':
        e[b['offset'] + b['bytes'] // 2] ^= 0x40     # one bit in each expert blob
open('flip.coli', 'wb').write(e)
i = bytearray(d); i[off + ln // 2] ^= 0x01; open('manifest.coli', 'wb').write(i)
EOF
for f in heat.txt good.plan rates.txt; do [ -s "$f" ] || { echo "hostile-sweep: fixture $f not made" >&2; exit 2; }; done

# ---- the case runner --------------------------------------------------------
IDS=() ; declare -A V RC EXP SECS LINE WHY NOTES CMD
n_good=0 n_weak=0 n_bad=0

# hc ID EXPECTED_RC PATTERN COMMAND  (environment for one case: CASE_TO,
# CASE_MEM, LENIENT=1, NOTE=..., CHECK=function run after it; the function
# prints "bad: ..." or "weak: ..." or nothing, and sees $OUT and $ERR).
hc() {
  local id=$1 exp=$2 pat=$3 cmd=$4
  local to=${CASE_TO:-$TO} mem=${CASE_MEM:-$MEM_KB}
  OUT=$T/res/$id.out ERR=$T/res/$id.err
  local t0 t1 rc
  t0=$(date +%s.%N)
  (ulimit -v "$mem"; exec timeout -k 2 "$to" bash -c "$cmd") >"$OUT" 2>"$ERR" </dev/null
  rc=$?
  t1=$(date +%s.%N)
  local first verdict why=""
  first=$(head -n 1 "$ERR" | tr -d '\r' | cut -c1-160)
  local check=""
  [ -n "${CHECK:-}" ] && check=$($CHECK 2>&1 | head -n 1)
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    verdict=bad why="hang: killed by the ${to} s timeout"
  elif [ "$rc" -gt 128 ]; then
    verdict=bad why="crash: killed by signal $((rc - 128))"
  elif grep -qiE 'bad_alloc|out of memory|cannot allocate memory' "$ERR"; then
    verdict=bad why="memory: the ${mem} KiB cap was hit"
  elif [ "${check%%:*}" = bad ]; then
    verdict=bad why=${check#bad: }
  elif [ "$exp" != 0 ] && [ "$rc" = 0 ]; then
    if [ "${LENIENT:-0}" = 1 ]; then verdict=weak why="exit 0: the bad input is taken (lenient: nothing lost)"
    else verdict=bad why="exit 0 on bad input"; fi
  elif [ "$rc" != "$exp" ]; then
    verdict=weak why="exit $rc, expected $exp"
  elif ! grep -qiE -- "$pat" "$ERR"; then
    verdict=weak why="stderr does not match /$pat/"
  elif [ "$exp" != 0 ] && ! head -n 1 "$ERR" | grep -qiE -- "$pat"; then
    verdict=weak why="the error is not stderr's first line"
  elif [ "${check%%:*}" = weak ]; then
    verdict=weak why=${check#weak: }
  else
    verdict=good
  fi
  case $verdict in good) n_good=$((n_good + 1)) ;; weak) n_weak=$((n_weak + 1)) ;; bad) n_bad=$((n_bad + 1)) ;; esac
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b - a}')
  IDS+=("$id"); V[$id]=$verdict RC[$id]=$rc EXP[$id]=$exp SECS[$id]=$secs LINE[$id]=$first WHY[$id]=$why NOTES[$id]=${NOTE:-} CMD[$id]=$cmd
  printf '[%s] %s\n' "$id" "$cmd"
  printf '      expect exit %s, stderr /%s/; got exit %s in %s s\n' "$exp" "$pat" "$rc" "$secs"
  printf '      stderr: %s\n' "${first:-(empty)}"
  printf '      verdict: %s%s\n' "$verdict" "${why:+ ($why)}"
  [ -n "${NOTE:-}" ] && printf '      note: %s\n' "$NOTE"
  return 0
}

# Checks used by several cases.
no_stdout() { [ -s "$OUT" ] && echo "weak: wrote to stdout before failing"; }
no_segment() { [ -e "/dev/shm/coli-$FP" ] && echo "bad: /dev/shm/coli-$FP left behind"; }

echo "hostile-sweep: $(date -u '+%Y-%m-%d %H:%M UTC'), tools $BIN ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?') checkout), $(nproc) cores, scratch $T"
echo "hostile-sweep: tiny model m.coli fingerprint $FP; timeout ${TO} s; ulimit -v ${MEM_KB} KiB (${BIG_MEM_KB} for the synthetic model)"
echo

# ---- coli-pin ---------------------------------------------------------------
hc P01 2 'start, status or stop' 'coli-pin'
hc P02 2 "unknown subcommand 'list'" 'coli-pin list'
hc P03 2 'model' 'coli-pin stop ""'
hc P04 1 'no mirror coli-0000000000000bad' 'coli-pin stop /dev/shm/coli-0000000000000bad'
hc P05 1 'etc|no mirror' 'coli-pin stop coli-../../etc'
hc P06 1 'missing\.coli' 'coli-pin start -m missing.coli --heat none'
CHECK=no_segment hc P07 1 'f\.coli: is not a regular file' 'coli-pin start -m f.coli --heat none'
hc P08 1 'nomodel.*model\.coli' 'coli-pin start -m nomodel --heat none'
CHECK=no_segment hc P09 1 '/dev/zero: is not a regular file' 'coli-pin start -m m.coli --heat /dev/zero'
CHECK=no_segment hc P10 1 'cr\.txt:1' 'coli-pin start -m m.coli --plan cr.txt'
CHECK=no_segment hc P11 2 '^coli-pin: --plan and --heat' 'coli-pin start -m m.coli --budget 1M --heat heat.txt --plan good.plan'
CHECK=no_segment hc P12 1 'expert .* of layer .*checksum' 'coli-pin start -m flip.coli --heat none'
chk_p13() {
  grep -q 'before the mirror was ready' "$ERR" || { echo "weak: the start did not say the keeper died"; return; }
  grep -q 'second start: rc 0.*stale' "$ERR" || { echo "bad: the next start did not replace the stale segment"; return; }
  grep -q 'stop: rc 0' "$ERR" || { echo "bad: the keeper could not be stopped"; return; }
  no_segment
}
CHECK=chk_p13 hc P13 1 'was killed by' '
  COLI_PIN_TEST_DIE_LOADING=1 coli-pin start -m m.coli --heat none; rc=$?
  coli-pin start -m m.coli --heat none >s2.out 2>&1; echo "second start: rc $? $(tr "\n" " " <s2.out)" >&2
  coli-pin stop -m m.coli >/dev/null 2>&1; echo "stop: rc $?" >&2
  exit $rc'
CHECK=no_segment hc P14 1 '--gpu|no usable (GPU|device)|no NVIDIA driver' 'coli-pin start -m m.coli --gpu --heat none'

# A FIFO and a directory named like segments (anyone can make them in /dev/shm).
FIFO_SHM=/dev/shm/coli-$TAG-fifo DIR_SHM=/dev/shm/coli-$TAG-dir
SHM_JUNK+=("$FIFO_SHM" "$DIR_SHM")
mkfifo "$FIFO_SHM"
NOTE="any user can make /dev/shm/coli-NAME; status lists it as no segment, without opening it" \
  CASE_TO=5 hc P15 0 "coli-$TAG-fifo.*not a shared-memory segment" 'coli-pin status >&2'
[ -p "$FIFO_SHM" ] && timeout 2 bash -c ": <> '$FIFO_SHM'"; rm -f "$FIFO_SHM"
mkdir "$DIR_SHM"
chk_p16() { [ -e "$DIR_SHM" ] && grep -q '^coli-pin: removed' "$ERR" && echo "bad: said it removed $DIR_SHM, which is still there"; }
CHECK=chk_p16 hc P16 1 "coli-$TAG-dir.*(director|not a segment)" "coli-pin stop coli-$TAG-dir"
rm -rf "$DIR_SHM"

# ---- coli-place ---------------------------------------------------------------
hc L01 2 "unknown subcommand 'frobnicate'" 'coli-place frobnicate -m m.coli'
hc L02 2 '--vram' 'coli-place plan -m m.coli --vram nan --heat none'
hc L03 2 '--chunks.*(count|chunk size)' 'coli-place plan -m m.coli --vram 1G --heat none --chunks 512,1e9'
hc L04 1 'f\.coli: is not a regular file' 'coli-place plan -m f.coli --vram 1G --heat none'
hc L05 1 '/dev/zero: is not a regular file' 'coli-place plan -m m.coli --vram 1G --heat /dev/zero'
hc L06 1 '/dev/null: is not a regular file' 'coli-place plan -m m.coli --vram 1G --heat /dev/null'
hc L07 1 'nomodel: is a directory' 'coli-place plan -m m.coli --vram 1G --heat nomodel'
hc L08 1 'cr\.txt:1' 'coli-place plan -m m.coli --vram 1G --heat cr.txt'
hc L09 1 'junk\.bin:1' 'coli-place plan -m m.coli --vram 1G --heat junk.bin'
hc L10 1 'longline\.txt' 'coli-place plan -m m.coli --vram 1G --heat longline.txt'
hc L11 1 'huge\.txt.*more than' 'coli-place plan -m m.coli --vram 1G --heat huge.txt'
hc L12 1 'other-heat\.txt.*not of this model' 'coli-place plan -m m.coli --vram 1G --heat other-heat.txt'
hc L13 1 'neg-heat\.txt:[0-9]+' 'coli-place plan -m m.coli --vram 1G --heat neg-heat.txt'
hc L14 1 'nan-rates\.txt:[0-9]+: host_expert_gbs' 'coli-place plan -m m.coli --vram 1G --heat none --rates nan-rates.txt'
CHECK=no_stdout hc L15 1 'nodir' 'coli-place plan -m m.coli --vram 1G --heat none -o nodir/p.plan'
hc L16 1 'plain\.txt' 'coli-place plan -m m.coli --vram 1G --heat none --rates rates.txt -o plain.txt/p.plan'
hc L17 1 '/dev/full' 'coli-place plan -m m.coli --vram 1G --heat none --rates rates.txt -o /dev/full'
hc L18 1 'cr\.txt:1: only blank lines' 'coli-place explain -m m.coli --plan cr.txt --heat none'
hc L19 1 '/dev/full: is not a regular file' 'coli-place probe -o /dev/full'
chk_l20() { grep -q 'host memory read' "$ERR" && echo "weak: measured before refusing"; [ -e nodir ] && echo "weak: made nodir"; }
CHECK=chk_l20 hc L20 1 'nodir.*not a directory' 'coli-place probe -o nodir/r.txt'
chk_l21() { [ -e junk-heat.txt ] && echo "bad: junk routing merged into junk-heat.txt"; }
CHECK=chk_l21 hc L21 1 'junk\.bin.*not UTF-8' 'coli-place calibrate -m m.coli --prompts junk.bin --heat junk-heat.txt'
hc L22 1 'stdout|standard output|write|no space' 'coli-place plan -m m.coli --vram 1G --heat none --rates rates.txt >/dev/full'

# ---- coli-run -----------------------------------------------------------------
RUN0="coli-run -m m.coli --device cpu"
RUN="$RUN0 -t 1 --temp 0"
hc R01 2 '--n-predict' "$RUN --prompt-ids 1,2 -n -5 --heat none"
hc R02 2 '--temp' "$RUN0 -t 1 --prompt-ids 1,2 --temp nan --heat none"
hc R03 2 "--prompt-ids: '-3'" "$RUN --prompt-ids 1,-3 --heat none"
hc R04 0 'vram-budget .*ignored: no usable GPU' 'coli-run -m m.coli -t 1 --prompt-ids 1,2 -n 2 --vram-budget 16T --heat none'
hc R05 1 'no usable device|no NVIDIA driver' 'coli-run -m m.coli --device cuda --prompt-ids 1,2 -n 2 --heat none'
hc R06 1 'missing\.coli' "coli-run -m missing.coli --prompt-ids 1,2 --heat none"
hc R07 1 'f\.coli' "coli-run -m f.coli --prompt-ids 1,2 --heat none"
hc R08 1 'half\.coli.*truncated' "coli-run -m half.coli --prompt-ids 1,2 --heat none"
hc R09 1 'manifest\.coli.*(checksum|corrupt)' "coli-run -m manifest.coli --prompt-ids 1,2 --heat none"
LENIENT=1 NOTE="intended: coli-run maps blobs and reads them as it needs them, unhashed; coli-pin start and coli-convert verify check every blob's xxh64 (coli-pin(1))" \
  hc R10 1 'checksum' "coli-run -m flip.coli --device cpu -t 1 --temp 0 --prompt-ids 1,2 -n 2 --heat none"
hc R11 1 '/dev/zero: is not a regular file' "$RUN --prompt-file /dev/zero -n 2 --heat none"
hc R12 1 'bad\.json' "$RUN --messages bad.json -n 2 --heat none"
NOTE="accepted: the byte-level tokenizer takes any bytes (calibrate refuses them: it merges heat)" \
  hc R13 0 'backend cpu' "$RUN -f nonutf8.txt -n 2 --heat none"
hc R14 1 '/dev/full: is not a regular file' "$RUN --prompt-ids 1,2 -n 2 --heat /dev/full"
chk_r15() { [ -s "$OUT" ] && echo "weak: generated before refusing the heat path"; }
CHECK=chk_r15 hc R15 1 'plain\.txt.*not a directory' "$RUN --prompt-ids 1,2 -n 4 --heat plain.txt/h.txt"
chk_r16() { [ -s nodir2/h.txt ] || echo "bad: no heat file nodir2/h.txt"; }
CHECK=chk_r16 NOTE="intended: --heat DIR/FILE makes missing directories, as for the default cache directory (coli-run(1)); -o of coli-place refuses them" \
  hc R16 0 'backend cpu' "$RUN --prompt-ids 1,2 -n 2 --heat nodir2/h.txt"
hc R17 1 'other-heat\.txt.*not of this model' "$RUN --prompt-ids 1,2 -n 2 --heat other-heat.txt"
hc R18 2 '--seed' "$RUN --prompt-ids 1,2 -n 2 --heat none --seed -1"
hc R19 0 'exceeds the model' "$RUN --prompt-ids 1,2 -n 2 --heat none -c 999999999"
chk_r20() {
  local a b
  a=$(awk '$1=="tokens"{print $2}' seq-heat.txt 2>/dev/null) b=$(awk '$1=="tokens"{print $2}' par-heat.txt 2>/dev/null)
  [ -n "$a" ] || { echo "bad: no heat from the runs one after the other"; return; }
  cmp -s seq-heat.txt par-heat.txt || echo "bad: heat lost: 8 runs at once left $b tokens, one after the other $a"
}
CHECK=chk_r20 hc R20 0 'eight runs at once' "
  R='$RUN --prompt-ids 1,2,3,4,5,6,7,8,9,10 -n 16 --ignore-eos'
  for i in 1 2 3 4 5 6 7 8; do \$R --heat seq-heat.txt >/dev/null 2>&1 || exit 3; done
  for i in 1 2 3 4 5 6 7 8; do \$R --heat par-heat.txt >/dev/null 2>&1 & done; wait
  echo \"eight runs at once: \$(awk '\$1==\"tokens\"{print \$2}' par-heat.txt) tokens; one after the other: \$(awk '\$1==\"tokens\"{print \$2}' seq-heat.txt)\" >&2"
hc R21 1 'stdout|standard output|write|no space' "$RUN --prompt-ids 1,2 -n 4 --heat none >/dev/full"
# A FIFO where this model's segment would be: what coli-run, coli-bench and
# coli-place attach or read by default (--mirror auto).
FIFO_FP=/dev/shm/coli-$FP
SHM_JUNK+=("$FIFO_FP")
mkfifo "$FIFO_FP"
chk_r22() { [ -p "$FIFO_FP" ] || echo "bad: the FIFO $FIFO_FP is gone"; }
CHECK=chk_r22 NOTE="intended: any user can make /dev/shm/coli-FINGERPRINT; --mirror auto reads the container and says so once (--mirror NAME refuses it)" \
  CASE_TO=5 hc R22 0 "ignoring coli-$FP: not a coli mirror" "$RUN --prompt-ids 1,2 -n 2 --heat none"
timeout 2 bash -c ": <> '$FIFO_FP'"; rm -f "$FIFO_FP"

# ---- coli-bench ---------------------------------------------------------------
BENCH="coli-bench -m m.coli --device cpu -t 1 -r 1"
hc C01 2 "-p: '1e9' is not a count" "$BENCH -p 512,1e9 -n 0 --heat none"
hc C02 1 'missing\.txt' "$BENCH -p 4 -n 0 --heat none --prompt-file missing.txt"
hc C03 1 '/dev/zero: is not a regular file' "$BENCH -p 4 -n 0 --heat none --prompt-file /dev/zero"
hc C04 1 'cr\.txt:1' "$BENCH -p 4 -n 0 --heat cr.txt"
hc C05 1 'mirror coli-0000000000000bad' "$BENCH -p 4 -n 0 --heat none --mirror coli-0000000000000bad"
hc C06 1 'missing\.coli' "coli-bench -m m.coli,missing.coli --device cpu -t 1 -r 1 -p 4 -n 0 --heat none"
hc C07 1 'exceed the model.s context' "$BENCH -p 8 -n 0 -d 99999999 --heat none"
hc C08 1 'stdout|standard output|write|no space' "$BENCH -p 4 -n 0 --heat none >/dev/full"

# ---- coli-pin: keepers at once (the synthetic model) ----------------------------
if [ "$SWEEP_SYNTH" = 1 ]; then
  wait "$SYNTH_PID"; src=$?; SYNTH_PID=
  if [ "$src" != 0 ] || [ ! -s s.coli ]; then echo "hostile-sweep: synth failed: $(tail -n 1 "$T/synth.log")" >&2; exit 2; fi
  S=s.coli
else
  S=m.coli
fi
SFP=$(coli-convert info $S | awk '$1=="fingerprint"{print $2}')
FPS+=("$SFP")
echo "hostile-sweep: keeper races on $S ($(tail -n 1 "$T/synth.log" 2>/dev/null | cut -c1-100)), fingerprint $SFP"
keepers_of() {  # pids of coli-pin processes that hold segment $1 (read from /proc, for the checks only)
  local p
  for p in /proc/[0-9]*; do grep -qs "/dev/shm/.*$1" "$p/maps" && [ "$(cat "$p/comm" 2>/dev/null)" = coli-pin ] && echo "${p#/proc/}"; done
}
chk_race() {
  grep -q 'bad magic' "$ERR" && { echo "bad: a stop or start met a half-made segment (bad magic)"; return 1; }
  grep -q 'ORPHAN' "$ERR" && { echo "bad: $(grep -m1 ORPHAN "$ERR")"; return 1; }
  local k; k=$(keepers_of "$SFP" | wc -l)
  [ "$k" -gt 0 ] && { echo "bad: $k keeper(s) of coli-$SFP still alive after the stop"; return 1; }
  ls -a /dev/shm | grep -q "coli-$SFP" && { echo "bad: /dev/shm still holds $(ls -a /dev/shm | grep "coli-$SFP" | tr '\n' ' ')"; return 1; }
  return 0
}
export -f keepers_of
export SFP S
CASE_MEM=$BIG_MEM_KB CASE_TO=90 CHECK=chk_race NOTE="issue 29 bad 1: its reproduction, 6 trials, then a new keeper" hc P17 0 '^trials: 6' '
  stopped=0 early=0 ready=0; : >race.log
  for i in 1 2 3 4 5 6; do
    coli-pin start -m $S --heat none >st.out 2>&1 & sp=$!
    # stop as soon as the segment name exists (or the start has ended)
    while [ ! -e /dev/shm/coli-$SFP ] && kill -0 $sp 2>/dev/null; do :; done
    coli-pin stop coli-$SFP >stop.out 2>&1; st=$?
    wait $sp; sr=$?
    echo "trial $i: start exit $sr: $(tr "\n" " " <st.out)| stop exit $st: $(tr "\n" " " <stop.out)" >>race.log
    [ $st = 0 ] && stopped=$((stopped + 1))
    if [ $sr = 0 ]; then
      ready=$((ready + 1))
      # start said ready: stop stopped that keeper (segment gone), or the mirror is still there
      if [ $st = 0 ]; then [ -e /dev/shm/coli-$SFP ] && echo "ORPHAN: trial $i: stop said stopped, the segment is still there" >>race.log
      elif [ ! -e /dev/shm/coli-$SFP ]; then echo "ORPHAN: trial $i: start said ready, stop failed, and the segment is gone" >>race.log; fi
    else early=$((early + 1)); fi
    k=$(keepers_of $SFP | wc -l)
    [ -e /dev/shm/coli-$SFP ] || [ $k = 0 ] || echo "ORPHAN: trial $i: $k keeper(s) alive without a segment" >>race.log
    coli-pin stop coli-$SFP >/dev/null 2>&1
  done
  # the old failure: a new keeper whose segment a leftover keeper removed
  coli-pin start -m $S --heat none >/dev/null 2>&1 || echo "ORPHAN: the start after the trials failed" >>race.log
  sleep 0.5
  [ -e /dev/shm/coli-$SFP ] || echo "ORPHAN: the new keeper'"'"'s segment disappeared" >>race.log
  coli-pin stop coli-$SFP >/dev/null 2>&1
  echo "trials: 6; stop stopped a keeper $stopped times; the start ended ready $ready times, stopped while loading $early times" >&2
  cat race.log >&2'

chk_two() {
  grep -q 'bad magic' "$ERR" && { echo "bad: a start met a half-made segment (bad magic)"; return; }
  grep -q 'KEEPERS' "$ERR" && { echo "bad: $(grep -m1 KEEPERS "$ERR")"; return; }
  chk_race || return
  grep -q 'EXIT' "$ERR" && echo "weak: $(grep -m1 EXIT "$ERR")"
}
# two_starts MODEL FINGERPRINT TRIALS: the command of a two-starts case.
two_starts() {
  cat <<SNIP
  : >two.log; ok=0
  for i in \$(seq 1 $3); do
    coli-pin start -m $1 --heat none >a.out 2>&1 & a=\$!
    coli-pin start -m $1 --heat none >b.out 2>&1 & b=\$!
    wait \$a; ra=\$?; wait \$b; rb=\$?
    k=\$(keepers_of $2 | wc -l)
    echo "trial \$i: exit \$ra: \$(tr '\\n' ' ' <a.out)| exit \$rb: \$(tr '\\n' ' ' <b.out)| \$k keeper(s)" >>two.log
    if [ \$ra = 0 ] && [ \$rb = 0 ] && [ "\$k" = 1 ] && cat a.out b.out | grep -q "already running"; then ok=\$((ok + 1))
    elif [ "\$k" != 1 ]; then echo "KEEPERS: trial \$i: \$k keepers after two starts" >>two.log
    else echo "EXIT: trial \$i: the starts exit \$ra and \$rb (coli-pin(1): the second waits for the first's mirror, exit 0)" >>two.log; fi
    coli-pin stop coli-$2 >/dev/null 2>&1
  done
  echo "two starts at once: in \$ok of $3 trials both exit 0, one keeper, the second says already running" >&2
  cat two.log >&2
SNIP
}
CASE_MEM=$BIG_MEM_KB CASE_TO=90 CHECK=chk_two NOTE="issue 29 bad 1: two starts at once, 3 trials on $S" \
  hc P18 0 '^two starts at once' "$(two_starts "$S" "$SFP" 3)"
# The tiny model loads in milliseconds: the second start's keeper can find
# the first's segment already published.
SFP_SAVE=$SFP; SFP=$FP
CASE_TO=60 CHECK=chk_two NOTE="issue 29 bad 1: two starts at once, 12 trials on m.coli" \
  hc P19 0 '^two starts at once' "$(two_starts m.coli "$FP" 12)"
SFP=$SFP_SAVE

# ---- table --------------------------------------------------------------------
end_s=$(date +%s.%N)
echo
echo "== table"
printf '%-4s  %-4s  %3s  %3s  %5s  %s\n' id verdict rc exp secs "stderr's first line"
for id in "${IDS[@]}"; do
  printf '%-4s  %-4s  %3s  %3s  %5s  %s\n' "$id" "${V[$id]}" "${RC[$id]}" "${EXP[$id]}" "${SECS[$id]}" "${LINE[$id]:-(empty)}"
done
echo
echo "== not good"
for id in "${IDS[@]}"; do
  [ "${V[$id]}" = good ] && continue
  printf '%s %s: %s\n    %s\n' "$id" "${V[$id]}" "${WHY[$id]}" "$(echo "${CMD[$id]}" | tr -s ' \n' ' ' | cut -c1-200)"
  [ -n "${NOTES[$id]}" ] && printf "    note: %s\n" "${NOTES[$id]}"
done
echo
printf 'hostile-sweep: %d cases: %d good, %d weak, %d bad (%.0f s)\n' "${#IDS[@]}" "$n_good" "$n_weak" "$n_bad" \
  "$(awk -v a="$start_s" -v b="$end_s" 'BEGIN{print b - a}')"
[ "$n_bad" = 0 ]
