#!/usr/bin/env bash
# Install the Debian packages m3kit builds with. Idempotent; silent when all are present.
# Usage: scripts/install-deps.sh [--gpu-amd] [--browser]
#   --gpu-amd   also Debian's hipcc (for `make gpu-amd-check`)
#   --browser   also chromium (headless HTML report tests)
set -euo pipefail
pkgs=(build-essential pkg-config libopenblas-dev libhdf5-dev libcmocka-dev libcjson-dev
      libpcre2-dev python3)
for a in "$@"; do
  case "$a" in
    --gpu-amd) pkgs+=(hipcc) ;;
    --browser) pkgs+=(chromium) ;;
    *) echo "install-deps.sh: unknown option $a" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps.sh: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
