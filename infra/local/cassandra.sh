#!/usr/bin/env bash
# infra/local/cassandra.sh - single-node Apache Cassandra 5.0 run as a plain local JVM
# (org.apache.cassandra.service.CassandraDaemon) from jars fetched from Maven Central.
#
#   infra/local/cassandra.sh fetch|start|stop|restart|status|logs [N]|reset
#
# Env: CASSANDRA_VERSION (5.0.8) CASSANDRA_PORT (9042) CASSANDRA_STORAGE_PORT (7000)
#      CASSANDRA_JMX_PORT (unset = no JMX/nodetool) CASSANDRA_HEAP (512m)
#      CASSANDRA_JAVA_HOME (else JAVA_HOME/PATH/usr/lib/jvm; must be Java 11 or 17 for 5.0)
#      CASSANDRA_START_TIMEOUT (180) CASSANDRA_ROOT_LOG_LEVEL (WARN) LOCAL_INFRA_STATE
#   One node of a cluster (infra/stack.py starts three, each on its own loopback address and the same ports):
#      CASSANDRA_NAME (cassandra: the state folder) CASSANDRA_HOST (127.0.0.1: listen and client address)
#      CASSANDRA_SEEDS (this host) CASSANDRA_INITIAL_TOKEN (unset: the single node's own choice)
#   CASSANDRA_SECURE_DIR (unset: open): a folder of infra/certs.py's files; clients then sign in and speak TLS
set -euo pipefail
SVC=cassandra
# shellcheck source=infra/local/_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/_lib.sh"

CASSANDRA_VERSION="${CASSANDRA_VERSION:-5.0.8}"
CASSANDRA_HOST="${CASSANDRA_HOST:-127.0.0.1}"
CASSANDRA_NAME="${CASSANDRA_NAME:-cassandra}"
CASSANDRA_SEEDS="${CASSANDRA_SEEDS:-$CASSANDRA_HOST}"
CASSANDRA_INITIAL_TOKEN="${CASSANDRA_INITIAL_TOKEN:-}"
CASSANDRA_PORT="${CASSANDRA_PORT:-9042}"
CASSANDRA_STORAGE_PORT="${CASSANDRA_STORAGE_PORT:-7000}"
CASSANDRA_JMX_PORT="${CASSANDRA_JMX_PORT:-}"
CASSANDRA_HEAP="${CASSANDRA_HEAP:-512m}"
CASSANDRA_START_TIMEOUT="${CASSANDRA_START_TIMEOUT:-180}"
CASSANDRA_ROOT_LOG_LEVEL="${CASSANDRA_ROOT_LOG_LEVEL:-WARN}"
CASSANDRA_SECURE_DIR="${CASSANDRA_SECURE_DIR:-}"

SRC="$LI_DIR/cassandra"
HOME_DIR="$STATE_ROOT/$CASSANDRA_NAME"
LIB="$CACHE_ROOT/cassandra-lib"; DATA="$HOME_DIR/data"; LOGS="$HOME_DIR/logs"; RUN="$HOME_DIR/run"; TMPD="$HOME_DIR/tmp"
PIDF="$RUN/cassandra.pid"; OUT="$LOGS/cassandra.out"
MARKER="-Dlocal.infra.service=cassandra:$HOME_DIR"
READY_RE='Startup complete|Starting listening for CQL clients'

# JPMS flags: union of Cassandra 5.0 conf/jvm17-server.options and the sets used by
# cassandra-unit (5.0.8 / JDK 17) and openzipkin's zipkin-cassandra image. Modules absent from a
# JRE-only install (jdk.compiler, jdk.attach) only produce "WARNING: Unknown module", not an error.
JPMS=(
  --add-exports java.base/jdk.internal.misc=ALL-UNNAMED
  --add-exports java.base/jdk.internal.ref=ALL-UNNAMED
  --add-exports java.base/sun.nio.ch=ALL-UNNAMED
  --add-exports java.base/java.lang.ref=ALL-UNNAMED
  --add-exports java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED
  --add-exports java.management/com.sun.jmx.remote.security=ALL-UNNAMED
  --add-exports java.rmi/sun.rmi.registry=ALL-UNNAMED
  --add-exports java.rmi/sun.rmi.server=ALL-UNNAMED
  --add-exports java.sql/java.sql=ALL-UNNAMED
  --add-exports jdk.unsupported/sun.misc=ALL-UNNAMED
  --add-exports jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED
  --add-exports jdk.attach/sun.tools.attach=ALL-UNNAMED
  --add-opens java.base/java.lang.module=ALL-UNNAMED
  --add-opens java.base/jdk.internal.loader=ALL-UNNAMED
  --add-opens java.base/jdk.internal.ref=ALL-UNNAMED
  --add-opens java.base/jdk.internal.reflect=ALL-UNNAMED
  --add-opens java.base/jdk.internal.math=ALL-UNNAMED
  --add-opens java.base/jdk.internal.module=ALL-UNNAMED
  --add-opens java.base/jdk.internal.util.jar=ALL-UNNAMED
  --add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED
  --add-opens java.base/sun.nio.ch=ALL-UNNAMED
  --add-opens java.base/java.io=ALL-UNNAMED
  --add-opens java.base/java.nio=ALL-UNNAMED
  --add-opens java.base/java.lang=ALL-UNNAMED
  --add-opens java.base/java.lang.reflect=ALL-UNNAMED
  --add-opens java.base/java.util=ALL-UNNAMED
  --add-opens java.base/java.util.concurrent=ALL-UNNAMED
  --add-opens java.base/java.util.concurrent.atomic=ALL-UNNAMED
  --add-opens jdk.compiler/com.sun.tools.javac=ALL-UNNAMED
)

cmd_fetch() {
  fetch_jars "$SRC/pom.xml" "$LIB" "cassandra-$CASSANDRA_VERSION-$(file_hash "$SRC/pom.xml")" \
    -Dli.cassandra.version="$CASSANDRA_VERSION"
}

cmd_start() {
  with_lock "$RUN/lock"
  if is_running "$PIDF" "$MARKER"; then
    log "already running (pid $(cat "$PIDF"))"
    wait_ready cassandra "$PIDF" "$MARKER" "$OUT" "$READY_RE" "$CASSANDRA_HOST" "$CASSANDRA_PORT" "$CASSANDRA_START_TIMEOUT"
    return 0
  fi
  cmd_fetch
  JAVA="$(pick_java CASSANDRA_JAVA_HOME 11 17)" \
    || die "Cassandra 5.0 runs on Java 11 or 17 only (set CASSANDRA_JAVA_HOME to a JDK 17)"
  for p in "$CASSANDRA_PORT" "$CASSANDRA_STORAGE_PORT" ${CASSANDRA_JMX_PORT:+"$CASSANDRA_JMX_PORT"}; do
    port_open "$CASSANDRA_HOST" "$p" && die "port $CASSANDRA_HOST:$p already in use"
  done
  mkdir -p "$DATA" "$LOGS" "$RUN/triggers" "$TMPD"
  raise_nofile

  local -a extra=()
  local jamm=""
  for f in "$LIB"/jamm-*.jar; do [ -f "$f" ] && { jamm="$f"; break; }; done
  # cassandra-env.sh always adds the jamm agent; optional since jamm falls back to Unsafe without it
  [ -n "$jamm" ] && extra+=("-javaagent:$jamm")
  [ -n "$CASSANDRA_JMX_PORT" ] && extra+=("-Dcassandra.jmx.local.port=$CASSANDRA_JMX_PORT")
  # This node's copy of the config: its addresses and seeds, everything else as in the shared file.
  sed -e "s/^listen_address: .*/listen_address: $CASSANDRA_HOST/" \
      -e "s/^rpc_address: .*/rpc_address: $CASSANDRA_HOST/" \
      -e "s/- seeds: .*/- seeds: \"$CASSANDRA_SEEDS\"/" \
      "$SRC/cassandra.yaml" > "$RUN/cassandra.yaml"
  # Secured (the local cluster profile, infra/certs.py): password authentication and TLS for every client.
  if [ -n "$CASSANDRA_SECURE_DIR" ]; then
    sed -i -e "s/^authenticator: .*/authenticator: PasswordAuthenticator/" \
           -e "s/^authorizer: .*/authorizer: CassandraAuthorizer/" "$RUN/cassandra.yaml"
    cat >> "$RUN/cassandra.yaml" <<YAML
client_encryption_options:
  enabled: true
  optional: false
  keystore: $CASSANDRA_SECURE_DIR/node.p12
  keystore_password: $(cat "$CASSANDRA_SECURE_DIR/keystore-password")
  store_type: PKCS12
  require_client_auth: false
YAML
    extra+=("-Dcassandra.superuser_setup_delay_ms=0")
  fi
  # A node of a fresh cluster takes its place in the ring at once (no data to stream yet); the caller spreads
  # the ring's tokens evenly. Restarted later, a node keeps the tokens it saved.
  if [ -n "$CASSANDRA_INITIAL_TOKEN" ]; then
    printf 'initial_token: %s\nauto_bootstrap: false\n' "$CASSANDRA_INITIAL_TOKEN" >> "$RUN/cassandra.yaml"
    extra+=("-Dcassandra.ring_delay_ms=3000")
  fi

  log "starting Cassandra $CASSANDRA_VERSION with $JAVA (Java $(java_major "$JAVA"))"
  launch "$PIDF" "$OUT" "$MARKER" \
    "$JAVA" -Xms"$CASSANDRA_HEAP" -Xmx"$CASSANDRA_HEAP" \
      -XX:+UseG1GC -XX:+ParallelRefProcEnabled -XX:MaxGCPauseMillis=300 \
      -XX:+ExitOnOutOfMemoryError -XX:+PerfDisableSharedMem \
      -Djava.net.preferIPv4Stack=true \
      -Djava.io.tmpdir="$TMPD" -Djna.tmpdir="$TMPD" \
      -Djdk.attach.allowAttachSelf=true \
      -Dio.netty.tryReflectionSetAccessible=true \
      -Dio.netty.allocator.useCacheForAllThreads=true \
      -Dio.netty.allocator.maxOrder=11 \
      "${JPMS[@]}" \
      ${extra[@]+"${extra[@]}"} \
      -Dcassandra-foreground=yes \
      -Dcassandra.config="file://$RUN/cassandra.yaml" \
      -Dcassandra.storagedir="$DATA" \
      -Dcassandra.logdir="$LOGS" \
      -Dcassandra.triggers_dir="$RUN/triggers" \
      -Dlogback.configurationFile="$SRC/logback.xml" \
      -Dcassandra.root.log.level="$CASSANDRA_ROOT_LOG_LEVEL" \
      -Dcassandra.native_transport_port="$CASSANDRA_PORT" \
      -Dcassandra.storage_port="$CASSANDRA_STORAGE_PORT" \
      -Dcassandra.skip_wait_for_gossip_to_settle=0 \
      -Dcassandra.superuser_setup_delay_ms=0 \
      -Dcassandra.libjemalloc=- \
      "$MARKER" \
      -cp "$LIB/*" org.apache.cassandra.service.CassandraDaemon
  wait_ready cassandra "$PIDF" "$MARKER" "$OUT" "$READY_RE" "$CASSANDRA_HOST" "$CASSANDRA_PORT" "$CASSANDRA_START_TIMEOUT"
}

cmd_stop()   { with_lock "$RUN/lock"; stop_pid "$PIDF" "$MARKER" 60; }
cmd_status() { if is_running "$PIDF" "$MARKER"; then echo "running pid=$(cat "$PIDF") cql=$CASSANDRA_HOST:$CASSANDRA_PORT"; else echo stopped; return 3; fi; }
cmd_pid()    { is_running "$PIDF" "$MARKER" && cat "$PIDF"; }
cmd_logs()   { tail -n "${1:-200}" "$OUT"; }
cmd_reset()  { cmd_stop; rm -rf "$DATA" "$LOGS" "$RUN" "$TMPD"; log "data wiped (jars kept in $LIB)"; }

case "${1:-}" in
  fetch) cmd_fetch ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  restart) cmd_stop; cmd_start ;;
  status) cmd_status ;;
  pid) cmd_pid ;;
  logs) shift; cmd_logs "$@" ;;
  reset) cmd_reset ;;
  *) echo "usage: $0 fetch|start|stop|restart|status|logs [N]|reset" >&2; exit 2 ;;
esac
