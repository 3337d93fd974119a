#!/usr/bin/env bash
# make bench: `m3 compare` throughput (target >= 1 GB/s of dump data on 2 cores) next to the
# raw HDF5 read ceiling and memcpy, measured in the same run. Builds compare_bench against
# build/libm3.a. Writes two ~512 MiB dumps to a temp dir (M3_BENCH_TMP, default /tmp).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-build}
make -s "$B/libm3.a"
mkdir -p "$B/bench"
PKGS="openblas hdf5 cmocka libcjson libpcre2-8"
cc -std=c11 -O2 -D_GNU_SOURCE -I. $(pkg-config --cflags $PKGS) -o "$B/bench/compare_bench" \
  scripts/bench.d/compare_bench.c "$B/libm3.a" $(pkg-config --libs $PKGS) -lpthread -lm
tmp=$(mktemp -d "${M3_BENCH_TMP:-/tmp}/m3bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$B/bench/compare_bench" "$tmp" "${M3_BENCH_MIB:-512}"
