#!/usr/bin/env bash
# promtool, to check and unit-test the alert rules (infra/prometheus): Debian's prometheus package carries it.
# Installs it once when missing (needs root, like infra/local/chromium.sh). Prints its path.
set -euo pipefail
if command -v promtool >/dev/null 2>&1; then command -v promtool; exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "[promtool] missing: install Debian's prometheus package (needs root)" >&2
  exit 1
fi
echo "[promtool] installing Debian's prometheus package (for promtool)" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v promtool
