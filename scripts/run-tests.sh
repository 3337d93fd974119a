#!/usr/bin/env bash
# Run cmocka test binaries, then print one closing line: "tests: N passed, N failed, N skipped".
# Exit 1 if any test failed or a binary crashed. Logs of each binary go to build/test-logs/.
set -uo pipefail
logdir=build/test-logs
mkdir -p "$logdir"
pass=0 fail=0 skip=0 bad=()
for t in "$@"; do
  name=$(basename "$t")
  log="$logdir/$name.log"
  CMOCKA_MESSAGE_OUTPUT=stdout "$t" >"$log" 2>&1
  rc=$?
  p=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$log" | awk '{s+=$NF} END {print s+0}')
  f=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$log" | awk '{s+=$(NF-1)} END {print s+0}')
  s=$(grep -Eo '^\[  SKIPPED \] [0-9]+' "$log" | awk '{s+=$NF} END {print s+0}')
  pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
  if [ $rc -ne 0 ] || [ "$f" -gt 0 ]; then
    bad+=("$name")
    [ "$f" -eq 0 ] && fail=$((fail + 1))   # a crash counts as a failure
    echo "---- $name (exit $rc) ----"
    grep -E 'FAILED|ERROR|error|Assert|assert|Sanitizer|runtime error|\[  FAIL' "$log" | head -40
  fi
  printf '%-28s %4d passed %3d failed %3d skipped\n' "$name" "$p" "$f" "$s"
done
[ ${#bad[@]} -gt 0 ] && echo "failing binaries: ${bad[*]} (logs in $logdir)"
echo "tests: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
