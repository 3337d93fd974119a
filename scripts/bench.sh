#!/usr/bin/env bash
# make bench: run every scripts/bench.d/*.sh in order. Each prints measured figures next to
# a ceiling measured in the same run (never a pass/fail on time).
set -euo pipefail
: "${M3:=build/m3}"; export M3
shopt -s nullglob
for b in scripts/bench.d/*.sh; do
  echo "== $(basename "$b" .sh)"
  bash "$b"
done
