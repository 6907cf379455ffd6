#!/usr/bin/env bash
# Headless Chromium for the browser tests: Debian's package at /usr/bin/chromium, driven by Playwright's
# driver (Playwright's own browser download cannot reach its CDN here). Installs it once when missing.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "[chromium] /usr/bin/chromium is missing: install Debian's chromium package (needs root)" >&2
  exit 1
fi
echo "[chromium] installing Debian's chromium package" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
/usr/bin/chromium --version >&2
