#!/usr/bin/env bash
# make gpu-amd-check: compile every gpu/*.hip for AMD CDNA (gfx90a by default) with hipcc,
# objects only (no link, no device needed). Debian 12's `hipcc` package (HIP 5.2, clang 14)
# is enough; it has no hipBLAS, so gpu/hip_compat.h sets M3_HAVE_BLAS=0 and the GEMM helper
# reports M3_ERR_UNSUPPORTED there. Prints one line per file and a summary; exit 1 on any
# failure, 0 with a note when hipcc is not installed (CI installs it where it can).
set -uo pipefail
: "${HIPCC_AMD:=hipcc}" "${AMD_ARCH:=gfx90a}" "${BUILD:=build}"
if ! command -v "$HIPCC_AMD" >/dev/null 2>&1; then
  echo "gpu-amd-check: $HIPCC_AMD not found (apt-get install hipcc); skipped"
  exit 0
fi
out="$BUILD/amd"
mkdir -p "$out"
ok=0 bad=0
[ $# -gt 0 ] || set -- gpu/*.hip
for f in "$@"; do
  o="$out/$(basename "${f%.hip}").o"
  # rocm_agent_enumerator may print a traceback when no AMD GPU is present: harmless, hidden
  if "$HIPCC_AMD" --offload-arch="$AMD_ARCH" -x hip -std=c++17 -O2 -I. -Wall \
       -fno-fast-math -c "$f" -o "$o" >"$o.log" 2>&1; then
    ok=$((ok + 1)); echo "  ok    $f"
    grep -E 'warning:' "$o.log" | head -5
  else
    bad=$((bad + 1)); echo "  FAIL  $f"
    grep -E 'error' "$o.log" | head -20
  fi
done
echo "gpu-amd-check: $ok compiled, $bad failed for $AMD_ARCH ($("$HIPCC_AMD" --version 2>/dev/null | grep -m1 -i 'hip version' | tr -d '\n'))"
[ $bad -eq 0 ]
