#!/usr/bin/env bash
# Build Parley's OpenTelemetry Collector (infra/otelcol: an OTLP receiver and a file exporter, nothing else)
# from the collector's modules on the Go module proxy; about a minute on 2 cores with a cold module cache.
# The binary is cached under $PARLEY_CACHE, named by a hash of the sources, so a fresh clone reuses it.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC="$HERE/../otelcol"
CACHE="${PARLEY_CACHE:-$HOME/.cache/parley}"
KEY="$(cat "$SRC/main.go" "$SRC/go.mod" "$SRC/go.sum" | sha256sum | cut -c1-12)"
BIN="$CACHE/otelcol-$KEY/parley-otelcol"
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
command -v go >/dev/null || { echo "[otelcol] needs Go (1.24 or newer) on PATH" >&2; exit 1; }
echo "[otelcol] building the OpenTelemetry Collector from the Go module proxy" >&2
mkdir -p "$(dirname "$BIN")"
export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOFLAGS=-mod=readonly
(cd "$SRC" && go build -trimpath -o "$BIN.tmp" .) >&2
mv "$BIN.tmp" "$BIN"
echo "$BIN"
