#!/usr/bin/env bash
# On the GPU machine: run the gpu_* test binaries, then the benchmarks (M3_BENCH=1), from a
# bundle made by scripts/device/pack.sh (binaries in bin/, the shared libraries the machine
# may lack in lib/). Logs go to $OUT (or ./out). Usage, from the bundle's folder:
#   bash gpu-run.sh            tests + benchmarks        bash gpu-run.sh tests   tests only
# Also works in a checkout built there with `make gpu`: BIN=build/tests bash scripts/device/gpu-run.sh
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${BIN:=$here/bin}" "${OUT:=$here/out}"
mkdir -p "$OUT"
[ -f "$here/lib.tar.xz" ] && [ ! -d "$here/lib" ] && tar -C "$here" -xJf "$here/lib.tar.xz"
[ -f "$here/bin.tar.xz" ] && [ ! -d "$here/bin" ] && tar -C "$here" -xJf "$here/bin.tar.xz"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# tests/gpu_model.c runs build/m3 and reads the tiny fixtures (both bundled by pack.sh)
[ -x "$BIN/m3" ] && export M3="$BIN/m3"
if [ -d "$here/fixtures" ]; then export M3_FIXTURES="$here/fixtures"
elif [ -d "$here/../../fixtures" ]; then export M3_FIXTURES="$here/../../fixtures"; fi
what=${1:-all}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  for b in "$BIN"/gpu_*; do ldd "$b" | grep -i "not found"; done; } | tee "$OUT/device.txt"
logs=$(mktemp -d)   # per-binary logs, concatenated into $OUT/tests.log (few files come back)
pass=0 fail=0 skip=0
for t in "$BIN"/gpu_*; do
  name=$(basename "$t"); [ "$name" = gpu_bench ] && continue
  CMOCKA_MESSAGE_OUTPUT=stdout timeout 300 "$t" >"$logs/$name.log" 2>&1; rc=$?
  p=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$logs/$name.log" | awk '{s+=$NF} END {print s+0}')
  f=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$logs/$name.log" | awk '{s+=$(NF-1)} END {print s+0}')
  s=$(grep -Eo '^\[  SKIPPED \] [0-9]+' "$logs/$name.log" | awk '{s+=$NF} END {print s+0}')
  [ $rc -ne 0 ] && [ "$f" -eq 0 ] && f=1
  pass=$((pass+p)); fail=$((fail+f)); skip=$((skip+s))
  printf '%-20s %3d passed %3d failed %3d skipped (exit %d)\n' "$name" "$p" "$f" "$s" "$rc"
  grep -E '^\[  (FAILED|ERROR)|^ERROR|Assert|exceeds|mismatch' "$logs/$name.log" | head -20
done | tee "$OUT/summary.txt"
for f in "$logs"/*.log; do echo "==== $(basename "$f")"; cat "$f"; done > "$OUT/tests.log"
grep -h 'nmse\|all scores forced\|near-tie' "$logs"/*.log > "$OUT/nmse.txt" 2>/dev/null
if [ "$what" = all ] && [ -x "$BIN/gpu_bench" ]; then
  BIN="$BIN" OUT="$OUT" DOC="$OUT/performance.md" timeout 500 bash "$here/bench-gpu.sh" 2>&1 | tee "$OUT/bench.txt"
fi
# The device tool brings back at most 8 files from $OUT: the summary, the table and bench.txt
# stay on top, the other logs (and the per-binary ones) go into one archive, so a caller may
# add its own files beside them.
( cd "$OUT" && set -- && for f in device.txt tests.log nmse.txt m3.log torch.log; do
    [ -f "$f" ] && set -- "$@" "$f"; done
  cp -r "$logs" binaries && tar -czf logs.tgz "$@" binaries && rm -rf binaries "$@" )
cat "$OUT/summary.txt" | tail -12
