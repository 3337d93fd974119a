#!/bin/bash
# Regenerates every oracle fixture from its spec with transformers (GPU machine).
#   bash scripts/hf_fixtures/make_all.sh [DEST]      (DEST defaults to fixtures)
# Needs python3 with torch, transformers 5.17 (minimax_m3_vl), h5py, safetensors.
# When $OUT is set (the device runner), DEST and the logs are also packed into
# $OUT/fixtures.tar.gz; unpack that in the repository root and run
#   /usr/bin/python3 scripts/check_fixtures.py fixtures/tiny-moe fixtures/tiny-deep
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
dest=${1:-fixtures}
mkdir -p "$dest" build/hf_fixtures_logs
rc=0
for spec in scripts/hf_fixtures/*.json; do
  n=$(basename "$spec" .json)
  rm -rf "${dest:?}/$n"
  start=$SECONDS
  python3 scripts/hf_dump.py fixture --spec "$spec" --out "$dest/$n" > "build/hf_fixtures_logs/$n.log" 2>&1
  r=$?
  echo "$n: rc=$r $((SECONDS - start))s"
  grep -v '^\[hf_dump\] checks' "build/hf_fixtures_logs/$n.log" | grep -v Warning | tail -6 | cut -c1-600
  [ $r -eq 0 ] || rc=1
done
du -ab "$dest" | sort -k2
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/fixtures.tar.gz" "$dest" build/hf_fixtures_logs
fi
exit $rc
