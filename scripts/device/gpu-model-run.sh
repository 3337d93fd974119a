#!/usr/bin/env bash
# On the GPU machine, from a bundle made by scripts/device/pack.sh: the whole-model test
# first (gpu_model: runs bin/m3, reads the checkout's fixtures/), then the kernel tests, each
# with a time limit, logs into $OUT (few files: gpu_model.log, kernels.log, device.txt).
# Usage: cd .dev/gpu && bash gpu-model-run.sh [SECONDS_FOR_GPU_MODEL] [SECONDS_PER_KERNEL_TEST]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${OUT:=$here/out}"
mkdir -p "$OUT"
[ -f "$here/lib.tar.xz" ] && [ ! -d "$here/lib" ] && tar -C "$here" -xJf "$here/lib.tar.xz"
[ -f "$here/bin.tar.xz" ] && [ ! -d "$here/bin" ] && tar -C "$here" -xJf "$here/bin.tar.xz"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export M3="$here/bin/m3" CMOCKA_MESSAGE_OUTPUT=stdout
# the checkout's fixtures (the bundle sits in .dev/gpu of it) unless bundled (FIXTURES=1)
if [ -d "$here/fixtures" ]; then export M3_FIXTURES="$here/fixtures"
else export M3_FIXTURES="$(cd "$here/../.." && pwd)/fixtures"; fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  ldd "$here/bin/gpu_model" "$M3" | grep -i "not found"; } > "$OUT/device.txt"
cd "$here"
start=$(date +%s)
timeout "${1:-70}" bin/gpu_model > "$OUT/gpu_model.log" 2>&1
echo "gpu_model: exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu_model.log"
for t in gpu_base gpu_norm_rope gpu_attn gpu_indexer gpu_kvcache gpu_moe; do
  [ -x "bin/$t" ] || continue
  s=$(date +%s)
  echo "==== $t"
  timeout "${2:-30}" "bin/$t" 2>&1
  echo "==== $t: exit $? in $(( $(date +%s) - s )) s"
done > "$OUT/kernels.log" 2>&1
grep -E '^==== .*exit|^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/kernels.log"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|gpu_model: exit' "$OUT/gpu_model.log"
