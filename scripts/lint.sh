#!/usr/bin/env bash
# Dependency fences (docs/style.md): each external library is reached through one file.
set -uo pipefail
rc=0
fence() { # pattern allowed-file...
  local pat=$1; shift
  local hits
  hits=$(git grep -lE "$pat" -- '*.c' '*.h' '*.hip' | grep -vxF -f <(printf '%s\n' "$@") || true)
  if [ -n "$hits" ]; then echo "lint: '$pat' outside $*:" $hits; rc=1; fi
}
fence '#include [<"]cblas\.h' ref/linear.c
fence '#include [<"]hdf5\.h' compare/dump.c
fence '#include [<"](hip/|cuda|cublas)' gpu/hip_compat.h
fence '#include [<"](cjson/)?cJSON\.h' ref/json.c
fence '#include [<"]pcre2\.h' compare/tokenizer.c
if git grep -nE '#include "(gpu|compare)/' -- 'ref/*' ; then echo "lint: ref/ includes gpu/ or compare/"; rc=1; fi
[ $rc -eq 0 ] && echo "lint: fences hold"
exit $rc
