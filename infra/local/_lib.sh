#!/usr/bin/env bash
# infra/local/_lib.sh -- helpers shared by kafka.sh and cassandra.sh (sourced, not executed).
# shellcheck shell=bash

LI_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$LI_DIR/../.." && pwd)"
# Everything mutable (jars, data, logs, pid files) lives here; add it to .gitignore.
STATE_ROOT="${LOCAL_INFRA_STATE:-$REPO_ROOT/.local-infra}"
# Downloads and builds (jars, llama-server) are cached outside the clone so a fresh clone reuses them.
CACHE_ROOT="${PARLEY_CACHE:-$HOME/.cache/parley}"
# Pinned plugin version: 3.7.0+ requires Maven >= 3.6.3 (MDEP-925), fine for Maven 3.8.7.
MDEP_COPY="org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"

log() { printf '[%s] %s\n' "${SVC:-infra}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# java_major /path/to/java  -> 17, 21, ...
java_major() {
  "$1" -XshowSettings:properties -version 2>&1 \
    | awk -F'= ' '/java.specification.version/ {print $2; exit}' | cut -d. -f1
}

# pick_java ENV_VAR_NAME MIN MAX -> prints a java binary whose major version is in [MIN, MAX]
pick_java() {
  local var="$1" min="$2" max="$3" cand m
  for cand in ${!var:+"${!var}/bin/java"} ${JAVA_HOME:+"$JAVA_HOME/bin/java"} \
              "$(command -v java || true)" /usr/lib/jvm/*/bin/java /opt/java/*/bin/java; do
    [ -x "$cand" ] || continue
    m="$(java_major "$cand" 2>/dev/null || true)"
    [ -n "$m" ] || continue
    if [ "$m" -ge "$min" ] && [ "$m" -le "$max" ]; then printf '%s\n' "$cand"; return 0; fi
  done
  return 1
}

# port_open HOST PORT -> 0 if something accepts TCP connections there
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# fetch_jars POM LIBDIR STAMP [extra mvn args...]: copy the runtime closure of POM into LIBDIR once.
fetch_jars() {
  local pom="$1" lib="$2" stamp="$3"; shift 3
  if [ -f "$lib/.stamp" ] && [ "$(cat "$lib/.stamp")" = "$stamp" ]; then return 0; fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found on PATH"
  rm -rf "$lib"; mkdir -p "$lib"
  log "fetching jars from Maven Central into $lib ($stamp)"
  mvn -q -B -f "$pom" "$MDEP_COPY" -DoutputDirectory="$lib" -DincludeScope=runtime "$@" \
    || die "mvn copy-dependencies failed (is Maven Central reachable? try: mvn -B dependency:get -Dartifact=org.apache.kafka:kafka-clients:4.3.1)"
  printf '%s\n' "$stamp" > "$lib/.stamp"
}

file_hash() { cat "$@" | sha256sum | cut -c1-16; }

# is_running PIDFILE MARKER -> 0 if the pid in PIDFILE is alive and its command line carries MARKER
is_running() {
  local pidf="$1" marker="$2" pid
  [ -f "$pidf" ] || return 1
  pid="$(cat "$pidf" 2>/dev/null || true)"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$marker"
}

# stop_pid PIDFILE MARKER TIMEOUT_S: SIGTERM (JVM shutdown hooks run), then SIGKILL after TIMEOUT_S
stop_pid() {
  local pidf="$1" marker="$2" timeout="$3" pid i
  if ! is_running "$pidf" "$marker"; then rm -f "$pidf"; log "not running"; return 0; fi
  pid="$(cat "$pidf")"
  log "stopping pid $pid"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < timeout * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$pidf"; log "stopped"; return 0; }
    sleep 0.1
  done
  log "still alive after ${timeout}s, sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pidf"
}

# launch PIDFILE STDOUT_LOG MARKER cmd...: start detached (own session, survives Ctrl-C of the caller)
launch() {
  local pidf="$1" out="$2" marker="$3"; shift 3
  local -a pre=()
  command -v setsid >/dev/null 2>&1 && pre=(setsid)
  [ -f "$out" ] && mv -f "$out" "$out.prev"
  # 9>&- : do not let the long-lived JVM inherit the lock fd (flock would stay held)
  nohup ${pre[@]+"${pre[@]}"} "$@" >"$out" 2>&1 </dev/null 9>&- &
  printf '%s\n' "$!" > "$pidf"
  sleep 0.5
  is_running "$pidf" "$marker" || { tail -n 50 "$out" >&2 || true; die "process exited immediately"; }
}

# wait_ready NAME PIDFILE MARKER LOGFILE LOG_REGEX HOST PORT TIMEOUT_S
wait_ready() {
  local name="$1" pidf="$2" marker="$3" out="$4" re="$5" host="$6" port="$7" timeout="$8" i
  for ((i = 0; i < timeout * 2; i++)); do
    if ! is_running "$pidf" "$marker"; then
      tail -n 80 "$out" >&2 || true; die "$name died during startup (log: $out)"
    fi
    if grep -qE "$re" "$out" 2>/dev/null && port_open "$host" "$port"; then
      log "$name ready on $host:$port after ~$((i / 2))s"; return 0
    fi
    sleep 0.5
  done
  tail -n 80 "$out" >&2 || true
  die "$name not ready after ${timeout}s (log: $out)"
}

# with_lock FILE: serialise concurrent start/stop calls (pytest-xdist workers, parallel CI steps)
with_lock() {
  mkdir -p "$(dirname "$1")"
  exec 9>"$1"
  if command -v flock >/dev/null 2>&1; then flock -w "${LOCAL_INFRA_LOCK_TIMEOUT:-300}" 9 || die "could not take lock $1"; fi
}

raise_nofile() {
  local hard; hard="$(ulimit -Hn 2>/dev/null || echo 4096)"
  [ "$hard" = unlimited ] && hard=1048576
  [ "$hard" -gt 100000 ] && hard=100000
  ulimit -Sn "$hard" 2>/dev/null || true
}
