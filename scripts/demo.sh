#!/usr/bin/env bash
# make demo: the main job on the bundled model.
set -euo pipefail
: "${M3:=build/m3}"
"$M3" --version
