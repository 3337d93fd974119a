#!/usr/bin/env bash
# make fuzz: build the libFuzzer targets tests/fuzz_*.c with clang
# (-fsanitize=fuzzer,address,undefined) against the sources they exercise, and run each for a
# bounded time (FUZZ_SECONDS, default 20) over its committed corpus fixtures/fuzz/<target>/.
# New inputs go to build/fuzz/corpus-<target>/ (never into the committed corpus); crashes
# are written to build/fuzz/ and fail the run. Without clang's libFuzzer runtime it tries to
# install libclang-rt-14-dev; if that is impossible it prints one skip line and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-20}
CLANG=${CLANG:-$(command -v clang-14 || command -v clang || true)}
out=build/fuzz
mkdir -p "$out"

probe() {
  [ -n "$CLANG" ] || return 1
  printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
    > "$out/probe.c"
  "$CLANG" -fsanitize=fuzzer,address,undefined "$out/probe.c" -o "$out/probe" >/dev/null 2>&1
}

if ! probe; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "fuzz: libFuzzer runtime missing; installing clang-14 libclang-rt-14-dev" >&2
  export DEBIAN_FRONTEND=noninteractive
  { $SUDO apt-get install -y -qq --no-install-recommends clang-14 libclang-rt-14-dev >/dev/null 2>&1 ||
    { $SUDO apt-get update -qq >/dev/null 2>&1 &&
      $SUDO apt-get install -y -qq --no-install-recommends clang-14 libclang-rt-14-dev >/dev/null 2>&1; }; } || true
  CLANG=${CLANG:-$(command -v clang-14 || command -v clang || true)}
  if ! probe; then
    echo "fuzz: skipped (clang libFuzzer runtime not available and could not be installed)"
    exit 0
  fi
fi

CJ_CFLAGS=$(pkg-config --cflags libcjson)
CJ_LIBS=$(pkg-config --libs libcjson)
SRC="ref/base.c ref/json.c ref/config.c ref/weights.c"
rc=0
for t in safetensors config; do
  bin="$out/fuzz_$t"
  "$CLANG" -std=c11 -g -O1 -D_GNU_SOURCE -I. $CJ_CFLAGS -ffp-contract=off \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    "tests/fuzz_$t.c" $SRC -o "$bin" $CJ_LIBS -lpthread -lm
  mkdir -p "$out/corpus-$t"
  echo "fuzz_$t: ${secs}s over fixtures/fuzz/$t ($(ls "fixtures/fuzz/$t" | wc -l) seeds)"
  if ! "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -artifact_prefix="$out/crash-$t-" -print_final_stats=1 \
      "$out/corpus-$t" "fixtures/fuzz/$t" >"$out/fuzz_$t.log" 2>&1; then
    echo "fuzz_$t: FAILED (log $out/fuzz_$t.log)"
    grep -E 'ERROR|SUMMARY|Test unit written' "$out/fuzz_$t.log" | head -20
    rc=1
  else
    grep -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "$out/fuzz_$t.log" | tail -1 || true
  fi
done
exit $rc
