#!/usr/bin/env bash
# Installs the headless browser of the dashboard's browser tests (tests/browser): Debian's
# chromium and its chromedriver. Idempotent: does nothing when both are already on PATH.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    echo "install_browser: chromium and chromedriver are already installed"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver
chromium --version
chromedriver --version
