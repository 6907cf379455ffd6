#!/usr/bin/env bash
# Cold `make run` on a fresh clone, split by step: every download and build cache starts empty
# (pip, Maven, the jar, Go module and build caches), then the stack starts and is stopped again.
# Prints JSON (seconds per step) and writes bench/results/cold_start.json in the calling checkout.
set -euo pipefail
repo="$(git rev-parse --show-toplevel)"
work="$(mktemp -d)"
git clone -q "$repo" "$work/x"
cd "$work/x"
export PARLEY_CACHE="$work/cache" PIP_CACHE_DIR="$work/pip" MAVEN_OPTS="-Dmaven.repo.local=$work/m2" \
       LOCAL_INFRA_STATE="$work/state"

step() {  # step NAME CMD...: run, print seconds
  local name="$1" start; shift
  start=$(date +%s.%N)
  echo "[cold] $name" >&2
  "$@" >"$work/$name.log" 2>&1 || { tail -40 "$work/$name.log" >&2; exit 1; }
  python3 -c "print(round($(date +%s.%N) - $start, 1))"
}

venv=$(step venv_and_python_deps make .venv/.installed-stamp)
kafka_jars=$(step kafka_jars bash infra/local/kafka.sh fetch)
cassandra_jars=$(step cassandra_jars bash infra/local/cassandra.sh fetch)
llama_build=$(step llama_server_build bash infra/local/build-llama-server.sh)
otelcol_build=$(step otelcol_build bash infra/local/build-otelcol.sh)
helm_build=$(step helm_build bash infra/local/build-helm.sh)
stack_up=$(step stack_up .venv/bin/parley up)
.venv/bin/parley down >/dev/null 2>&1
python3 - "$venv" "$kafka_jars" "$cassandra_jars" "$llama_build" "$otelcol_build" "$helm_build" "$stack_up" \
  "$work/state/run/default/timings.json" "$repo/bench/results/cold_start.json" <<'PY'
import json, sys
venv, kafka, cassandra, llama, otelcol, helm, up, timings, out = sys.argv[1:]
started = json.load(open(timings))
result = {
    "benchmark": "cold_make_run",
    "downloads_s": {"venv_and_python_deps_incl_model": float(venv), "kafka_jars": float(kafka),
                    "cassandra_jars": float(cassandra)},
    "builds_s": {"llama_server": float(llama), "otelcol": float(otelcol), "helm": float(helm)},
    "service_start_s": {k: v for k, v in started.items() if not k.endswith(" build")},
    "stack_up_total_s": float(up),
}
result["total_s"] = round(sum(map(float, (venv, kafka, cassandra, llama, otelcol, helm, up))), 1)
open(out, "w").write(json.dumps(result, indent=2))
print(json.dumps(result, indent=2))
PY
rm -rf "$work"
