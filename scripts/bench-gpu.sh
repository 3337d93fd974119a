#!/usr/bin/env bash
# make bench-gpu: kernel timings against the ceilings measured in the same run (device copy
# bandwidth, vendor BLAS bf16 GEMM), then the PyTorch equivalents (scripts/bench_torch.py,
# when python3 has torch) and a table with the speed-up of each m3kit kernel over PyTorch.
# Run on the GPU machine after `make gpu`.
set -uo pipefail
: "${BIN:=build/tests}" "${OUT:=build/bench-gpu}"
mkdir -p "$OUT"
M3_BENCH=1 CMOCKA_MESSAGE_OUTPUT=stdout "$BIN/gpu_bench" >"$OUT/m3.log" 2>&1 || echo "gpu_bench failed (see $OUT/m3.log)"
grep -E '^bench:' "$OUT/m3.log"
here=$(cd "$(dirname "$0")" && pwd)
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  PYTHONUNBUFFERED=1 python3 "$here/bench_torch.py" >"$OUT/torch.log" 2>&1 || echo "bench_torch.py failed"
  echo "== speed-up over PyTorch (same shapes, same timing method)"
  python3 - "$OUT/m3.log" "$OUT/torch.log" <<'PY'
import re, sys
m3 = {}
for l in open(sys.argv[1]):
    r = re.match(r"bench: (.+?)\s+([0-9.]+) ms", l)
    if r: m3[r.group(1).strip()] = float(r.group(2))
for l in open(sys.argv[2]):
    r = re.match(r"torch: (.+) ([0-9.]+) ms", l)
    if r and r.group(1).strip() in m3:
        n, t = r.group(1).strip(), float(r.group(2))
        print(f"{n:44s} m3 {m3[n]:9.4f} ms  torch {t:9.4f} ms  x{t / m3[n]:.1f}")
PY
else
  echo "bench-gpu: python3 with CUDA torch not found; PyTorch comparison skipped"
fi
