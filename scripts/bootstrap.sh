#!/usr/bin/env bash
# Install the Debian packages mmc builds against, if any is missing. Idempotent and quiet
# when everything is present. See README.md ("Dependencies") for why each one is here.
set -euo pipefail
PKGS=(build-essential cmake pkg-config libomp-dev libyaml-dev libcjson-dev
      libjpeg62-turbo-dev libpng-dev libpcre2-dev libutf8proc-dev libcairo2-dev
      libopenmpi-dev openmpi-bin
      libavformat-dev libavcodec-dev libswscale-dev libavutil-dev libswresample-dev
      libmicrohttpd-dev curl python3-venv espeak-ng)
[ "${MMC_BOOTSTRAP_EXTRA:-}" ] && PKGS+=(${MMC_BOOTSTRAP_EXTRA})
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "bootstrap: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
