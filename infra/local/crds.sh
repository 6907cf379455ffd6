#!/usr/bin/env bash
# The CRDs the chart's optional objects are validated against (tests/unit/test_helm.py), from the Go modules
# that ship them on the Go module proxy: the Prometheus Operator's (PodMonitor, PrometheusRule) and the
# Gateway API's standard channel (HTTPRoute). Cached under $PARLEY_CACHE; prints the two module directories.
set -euo pipefail
CACHE="${PARLEY_CACHE:-$HOME/.cache/parley}"
export GOMODCACHE="$CACHE/go/mod" GOFLAGS=-mod=mod GOTOOLCHAIN=local
for module in "github.com/prometheus-operator/prometheus-operator@${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}" \
              "sigs.k8s.io/gateway-api@${GATEWAY_API_VERSION:-v1.5.1}"; do
  dir="$GOMODCACHE/$module"
  if [ ! -d "$dir" ]; then
    command -v go >/dev/null || { echo "[crds] needs Go on PATH" >&2; exit 1; }
    (cd /tmp && go mod download "$module") >&2
  fi
  echo "$dir"
done
