#!/usr/bin/env bash
# One real-size MiniMax-M3 sparse MoE layer through the CPU reference (T = 64 tokens,
# context 4096) with per-stage GFLOP/s and the ratio to OpenBLAS sgemm measured in the
# same run (compare/cmd_bench.c). Threads: M3_THREADS or all online CPUs.
set -euo pipefail
: "${M3:=build/m3}"
"$M3" bench ref --tokens 64 --ctx 4096 ${M3_THREADS:+--threads "$M3_THREADS"}
