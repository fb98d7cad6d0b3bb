#!/usr/bin/env bash
# Installs Debian's chromium for the widget browser tests and export_png, when missing.
# Playwright drives this system browser (its own browser download is not used).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    echo "chromium already installed: $(command -v chromium)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium
command -v chromium
