#!/usr/bin/env bash
# infra/local/keycloak.sh - a local Keycloak (the OpenID Connect provider the sign-in tests and `make run` use),
# from its distribution on Maven Central (org.keycloak:keycloak-quarkus-dist), with the realm in
# infra/local/keycloak/realm-parley.json (a client, groups and people) imported at its first start.
#
#   infra/local/keycloak.sh fetch          # download and build the distribution once (cached outside the clone)
#   infra/local/keycloak.sh start          # idempotent; blocks until the realm answers
#   infra/local/keycloak.sh stop|status|logs|reset
#
# Env: KEYCLOAK_VERSION (26.5.6) KEYCLOAK_HOST (127.0.0.1) KEYCLOAK_PORT (8180) KEYCLOAK_MANAGEMENT_PORT (9180)
#      KEYCLOAK_HEAP (512m) KEYCLOAK_JAVA_HOME (else JAVA_HOME/PATH; needs 21+) KEYCLOAK_START_TIMEOUT (180)
#      KEYCLOAK_ADMIN_PASSWORD (admin of the master realm, user `admin`; local only) LOCAL_INFRA_STATE
set -euo pipefail
SVC=keycloak
# shellcheck source=infra/local/_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/_lib.sh"

KEYCLOAK_VERSION="${KEYCLOAK_VERSION:-26.5.6}"
KEYCLOAK_HOST="${KEYCLOAK_HOST:-127.0.0.1}"
KEYCLOAK_PORT="${KEYCLOAK_PORT:-8180}"
KEYCLOAK_MANAGEMENT_PORT="${KEYCLOAK_MANAGEMENT_PORT:-9180}"
KEYCLOAK_HEAP="${KEYCLOAK_HEAP:-512m}"
KEYCLOAK_START_TIMEOUT="${KEYCLOAK_START_TIMEOUT:-180}"
KEYCLOAK_ADMIN_PASSWORD="${KEYCLOAK_ADMIN_PASSWORD:-parley-local-admin}"

SRC="$LI_DIR/keycloak"
HOME_DIR="$STATE_ROOT/keycloak"
DIST="$CACHE_ROOT/keycloak-$KEYCLOAK_VERSION"
DATA="$HOME_DIR/data"; LOGS="$HOME_DIR/logs"; RUN="$HOME_DIR/run"; TMPD="$HOME_DIR/tmp"
PIDF="$RUN/keycloak.pid"; OUT="$LOGS/keycloak.out"
MARKER="-Dlocal.infra.service=keycloak:$HOME_DIR"
# build-time options: fixed into the cached distribution by `kc.sh build`, so each start skips that step
BUILD_OPTS=(--db=dev-file --health-enabled=true)
STAMP="$KEYCLOAK_VERSION-$(printf '%s' "${BUILD_OPTS[*]}" | sha256sum | cut -c1-16)"

java_home() {
  local java
  java="$(pick_java KEYCLOAK_JAVA_HOME 21 99)" || die "Keycloak $KEYCLOAK_VERSION needs Java 21 or later (set KEYCLOAK_JAVA_HOME)"
  dirname "$(dirname "$(readlink -f "$java")")"
}

cmd_fetch() {
  if [ -f "$DIST/.stamp" ] && [ "$(cat "$DIST/.stamp")" = "$STAMP" ]; then return 0; fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found on PATH"
  local dl="$CACHE_ROOT/keycloak-dl"
  mkdir -p "$dl"
  if [ ! -f "$dl/keycloak-quarkus-dist-$KEYCLOAK_VERSION.tar.gz" ]; then
    log "fetching keycloak-quarkus-dist $KEYCLOAK_VERSION from Maven Central"
    mvn -q -B "${MDEP_COPY%:*}:copy" \
      -Dartifact="org.keycloak:keycloak-quarkus-dist:$KEYCLOAK_VERSION:tar.gz" -DoutputDirectory="$dl" \
      || die "could not fetch org.keycloak:keycloak-quarkus-dist:$KEYCLOAK_VERSION (is Maven Central reachable?)"
  fi
  rm -rf "$DIST" "$DIST.tmp"; mkdir -p "$DIST.tmp"
  tar xzf "$dl/keycloak-quarkus-dist-$KEYCLOAK_VERSION.tar.gz" -C "$DIST.tmp" --strip-components=1
  log "building the distribution (${BUILD_OPTS[*]})"
  JAVA_HOME="$(java_home)" "$DIST.tmp/bin/kc.sh" build "${BUILD_OPTS[@]}" >"$CACHE_ROOT/keycloak-build.log" 2>&1 \
    || { tail -n 40 "$CACHE_ROOT/keycloak-build.log" >&2; die "kc.sh build failed"; }
  mv "$DIST.tmp" "$DIST"
  printf '%s\n' "$STAMP" > "$DIST/.stamp"
}

cmd_start() {
  with_lock "$RUN/lock"
  if is_running "$PIDF" "$MARKER"; then
    log "already running (pid $(cat "$PIDF"))"
  else
    cmd_fetch
    for p in "$KEYCLOAK_PORT" "$KEYCLOAK_MANAGEMENT_PORT"; do
      port_open "$KEYCLOAK_HOST" "$p" && die "port $KEYCLOAK_HOST:$p already in use"
    done
    mkdir -p "$DATA" "$LOGS" "$TMPD" "$DIST/data/import"
    cp "$SRC/realm-parley.json" "$DIST/data/import/"
    log "starting Keycloak $KEYCLOAK_VERSION on http://$KEYCLOAK_HOST:$KEYCLOAK_PORT"
    # --import-realm reads the distribution's data/import at every start and skips a realm that exists.
    JAVA_HOME="$(java_home)" \
    JAVA_OPTS_APPEND="-Xms$KEYCLOAK_HEAP -Xmx$KEYCLOAK_HEAP -Djava.io.tmpdir=$TMPD" \
    KC_BOOTSTRAP_ADMIN_USERNAME=admin KC_BOOTSTRAP_ADMIN_PASSWORD="$KEYCLOAK_ADMIN_PASSWORD" \
      launch "$PIDF" "$OUT" "$MARKER" "$DIST/bin/kc.sh" "$MARKER" start --optimized \
        --http-enabled=true --http-host="$KEYCLOAK_HOST" --http-port="$KEYCLOAK_PORT" \
        --http-management-port="$KEYCLOAK_MANAGEMENT_PORT" --hostname-strict=false \
        --db-url="jdbc:h2:file:$DATA/keycloakdb;NON_KEYWORDS=VALUE" \
        --import-realm --log-level=warn,org.keycloak.exportimport:info,io.quarkus:info
  fi
  local i
  for ((i = 0; i < KEYCLOAK_START_TIMEOUT * 2; i++)); do
    is_running "$PIDF" "$MARKER" || { tail -n 60 "$OUT" >&2 || true; die "keycloak died during startup (log: $OUT)"; }
    if curl -fsS -o /dev/null "http://$KEYCLOAK_HOST:$KEYCLOAK_PORT/realms/parley/.well-known/openid-configuration" 2>/dev/null; then
      log "keycloak ready on $KEYCLOAK_HOST:$KEYCLOAK_PORT after ~$((i / 2))s"; return 0
    fi
    sleep 0.5
  done
  tail -n 60 "$OUT" >&2 || true
  die "keycloak not ready after ${KEYCLOAK_START_TIMEOUT}s (log: $OUT)"
}

cmd_stop()   { with_lock "$RUN/lock"; stop_pid "$PIDF" "$MARKER" 30; }
cmd_status() { if is_running "$PIDF" "$MARKER"; then echo "running pid=$(cat "$PIDF") http://$KEYCLOAK_HOST:$KEYCLOAK_PORT"; else echo stopped; return 3; fi; }
cmd_logs()   { tail -n "${1:-200}" "$OUT"; }
cmd_reset()  { cmd_stop; rm -rf "$DATA" "$LOGS" "$RUN" "$TMPD"; log "data wiped (distribution kept in $DIST)"; }

case "${1:-}" in
  fetch) cmd_fetch ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  restart) cmd_stop; cmd_start ;;
  status) cmd_status ;;
  logs) shift; cmd_logs "$@" ;;
  reset) cmd_reset ;;
  *) echo "usage: $0 fetch|start|stop|restart|status|logs [N]|reset" >&2; exit 2 ;;
esac
