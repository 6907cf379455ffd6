#!/usr/bin/env bash
# infra/local/kafka.sh - single-node Apache Kafka (KRaft, combined broker+controller, no ZooKeeper),
# run as a plain local JVM from jars fetched from Maven Central.
#
#   infra/local/kafka.sh fetch          # download jars only (mvn dependency:copy-dependencies)
#   infra/local/kafka.sh start          # idempotent; blocks until the broker is ready
#   infra/local/kafka.sh stop           # SIGTERM (controlled shutdown), SIGKILL after 30 s
#   infra/local/kafka.sh status|logs|reset
#
# Env: KAFKA_VERSION (4.3.1) KAFKA_HOST (127.0.0.1) KAFKA_PORT (9092) KAFKA_CONTROLLER_PORT (9093)
#      KAFKA_HEAP (384m) KAFKA_JAVA_HOME (else JAVA_HOME/PATH; needs 17+) KAFKA_START_TIMEOUT (90)
#      KAFKA_ROOT_LOG_LEVEL (WARN) KAFKA_CLUSTER_ID (random) LOCAL_INFRA_STATE (<repo>/.local-infra)
#      KAFKA_SECURE_DIR (unset: plaintext; else infra/certs.py's files: SASL_SSL with SCRAM users and ACLs)
#   One node of a cluster (infra/stack.py starts three): KAFKA_NAME (kafka: the state folder under
#      LOCAL_INFRA_STATE) KAFKA_NODE_ID (1) KAFKA_VOTERS (id@host:port,...; default this node alone)
#      KAFKA_REPLICATION (1: copies of the internal topics and the default for new ones; min ISR is a
#      majority of them), and every node formatted with the same KAFKA_CLUSTER_ID
set -euo pipefail
SVC=kafka
# shellcheck source=infra/local/_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/_lib.sh"

KAFKA_VERSION="${KAFKA_VERSION:-4.3.1}"
KAFKA_HOST="${KAFKA_HOST:-127.0.0.1}"
KAFKA_PORT="${KAFKA_PORT:-9092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
KAFKA_HEAP="${KAFKA_HEAP:-384m}"
KAFKA_START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
KAFKA_ROOT_LOG_LEVEL="${KAFKA_ROOT_LOG_LEVEL:-WARN}"
KAFKA_NAME="${KAFKA_NAME:-kafka}"
KAFKA_NODE_ID="${KAFKA_NODE_ID:-1}"
KAFKA_VOTERS="${KAFKA_VOTERS:-${KAFKA_NODE_ID}@${KAFKA_HOST}:${KAFKA_CONTROLLER_PORT}}"
KAFKA_REPLICATION="${KAFKA_REPLICATION:-1}"
KAFKA_MIN_ISR=$((KAFKA_REPLICATION / 2 + 1))
KAFKA_SECURE_DIR="${KAFKA_SECURE_DIR:-}"

SRC="$LI_DIR/kafka"
HOME_DIR="$STATE_ROOT/$KAFKA_NAME"
LIB="$CACHE_ROOT/kafka-lib"; DATA="$HOME_DIR/data"; LOGS="$HOME_DIR/logs"; RUN="$HOME_DIR/run"; TMPD="$HOME_DIR/tmp"
CONF="$RUN/server.properties"; PIDF="$RUN/kafka.pid"; OUT="$LOGS/kafka.out"
MARKER="-Dlocal.infra.service=kafka:$HOME_DIR"
READY_RE='Kafka Server started'

cmd_fetch() {
  fetch_jars "$SRC/pom.xml" "$LIB" "kafka-$KAFKA_VERSION-$(file_hash "$SRC/pom.xml")" \
    -Dli.kafka.version="$KAFKA_VERSION"
}

# Open (the default): plaintext, anyone may do anything. Secured (KAFKA_SECURE_DIR, infra/certs.py's files):
# clients sign in with SCRAM-SHA-512 over TLS, each user may do only what its ACLs grant (infra/kafka_acls.py),
# and the brokers talk to each other as `admin` and to the controllers over mutual TLS as the nodes' certificate.
listeners() {
  if [ -z "$KAFKA_SECURE_DIR" ]; then
    cat <<PROPS
listeners=PLAINTEXT://${KAFKA_HOST}:${KAFKA_PORT},CONTROLLER://${KAFKA_HOST}:${KAFKA_CONTROLLER_PORT}
advertised.listeners=PLAINTEXT://${KAFKA_HOST}:${KAFKA_PORT}
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
PROPS
    return
  fi
  cat <<PROPS
listeners=SASL_SSL://${KAFKA_HOST}:${KAFKA_PORT},CONTROLLER://${KAFKA_HOST}:${KAFKA_CONTROLLER_PORT}
advertised.listeners=SASL_SSL://${KAFKA_HOST}:${KAFKA_PORT}
inter.broker.listener.name=SASL_SSL
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$(cat "$KAFKA_SECURE_DIR/kafka-admin-password")";
ssl.keystore.type=PEM
ssl.keystore.location=${KAFKA_SECURE_DIR}/node.pem
ssl.truststore.type=PEM
ssl.truststore.location=${KAFKA_SECURE_DIR}/ca.pem
listener.name.controller.ssl.client.auth=required
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin;User:CN=parley-node
allow.everyone.if.no.acl.found=false
PROPS
}

write_config() {
  # Static quorum (controller.quorum.voters) => format WITHOUT --standalone: every node of a cluster is a
  # broker and a controller, and names the same voters. (The 4.x sample config/server.properties uses
  # controller.quorum.bootstrap.servers instead, which requires `kafka-storage format --standalone`.)
  cat > "$CONF" <<PROPS
process.roles=broker,controller
node.id=${KAFKA_NODE_ID}
controller.quorum.voters=${KAFKA_VOTERS}
controller.listener.names=CONTROLLER
$(listeners)
log.dirs=${DATA}

# Copies: the internal topics (consumer offsets, transactions) and new topics get KAFKA_REPLICATION copies, a
# write needs a majority of them in sync, and a replica that fell behind never becomes leader (no unclean
# election: an acknowledged record is never dropped). A single node: 1 and 1.
num.partitions=1
default.replication.factor=${KAFKA_REPLICATION}
min.insync.replicas=${KAFKA_MIN_ISR}
unclean.leader.election.enable=false
offsets.topic.replication.factor=${KAFKA_REPLICATION}
offsets.topic.num.partitions=$([ "$KAFKA_REPLICATION" -gt 1 ] && echo 12 || echo 1)
transaction.state.log.replication.factor=${KAFKA_REPLICATION}
transaction.state.log.min.isr=${KAFKA_MIN_ISR}
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=${KAFKA_REPLICATION}
share.coordinator.state.topic.min.isr=${KAFKA_MIN_ISR}
share.coordinator.state.topic.num.partitions=1
# A broker stopped with SIGTERM hands its leaderships over first (a rolling restart loses nothing in flight).
controlled.shutdown.enable=true

# test/dev friendliness
group.initial.rebalance.delay.ms=0
# How often the broker deletes the segments past their topic's retention (default 5 minutes): locally every 10 s,
# so a test sees a period end (tests/stack/test_periods.py).
log.retention.check.interval.ms=10000
auto.create.topics.enable=true
delete.topic.enable=true
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.cleaner.dedupe.buffer.size=2097152
PROPS
}

# Run Kafka's StorageTool (kafka.tools.StorageTool in 3.x/4.x core). Falls back to a Java-package
# name in case a later release moved it. Its log output goes to stderr (tools-log4j2.xml).
storage_tool() {
  local cls err rc
  err="$(mktemp)"
  for cls in kafka.tools.StorageTool org.apache.kafka.tools.StorageTool; do
    rc=0
    "$JAVA" -Xmx256m -Djava.io.tmpdir="$TMPD" -Dlog4j2.configurationFile="$SRC/tools-log4j2.xml" \
      -cp "$LIB/*" "$cls" "$@" 2>"$err" || rc=$?
    if [ "$rc" -eq 0 ]; then rm -f "$err"; return 0; fi
    grep -q 'Could not find or load main class' "$err" || break
  done
  cat "$err" >&2; rm -f "$err"; return 1
}

format_if_needed() {
  [ -f "$DATA/meta.properties" ] && return 0
  local cid="${KAFKA_CLUSTER_ID:-}"
  [ -n "$cid" ] || cid="$(storage_tool random-uuid | tail -n 1)"
  log "formatting $DATA (cluster.id=$cid)"
  # the = form: a random id may start with "-", which would read as an option
  local -a scram=()
  # the brokers' own user, there before any broker is up (the others are made through the cluster)
  [ -n "$KAFKA_SECURE_DIR" ] && \
    scram=(--add-scram "SCRAM-SHA-512=[name=admin,password=$(cat "$KAFKA_SECURE_DIR/kafka-admin-password")]")
  storage_tool format --ignore-formatted --cluster-id="$cid" -c "$CONF" "${scram[@]}" >"$LOGS/format.out"
}

cmd_start() {
  with_lock "$RUN/lock"
  if is_running "$PIDF" "$MARKER"; then
    log "already running (pid $(cat "$PIDF"))"
    wait_ready kafka "$PIDF" "$MARKER" "$OUT" "$READY_RE" "$KAFKA_HOST" "$KAFKA_PORT" "$KAFKA_START_TIMEOUT"
    return 0
  fi
  cmd_fetch
  JAVA="$(pick_java KAFKA_JAVA_HOME 17 99)" || die "Kafka 4.x brokers need Java 17+ (set KAFKA_JAVA_HOME)"
  for p in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT"; do
    port_open "$KAFKA_HOST" "$p" && die "port $KAFKA_HOST:$p already in use"
  done
  mkdir -p "$DATA" "$LOGS" "$RUN" "$TMPD"
  raise_nofile
  write_config
  format_if_needed
  log "starting Kafka $KAFKA_VERSION with $JAVA (Java $(java_major "$JAVA"))"
  launch "$PIDF" "$OUT" "$MARKER" \
    "$JAVA" -Xms"$KAFKA_HEAP" -Xmx"$KAFKA_HEAP" \
      -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
      -XX:+ExplicitGCInvokesConcurrent -XX:+ExitOnOutOfMemoryError \
      -Djava.awt.headless=true -Djava.io.tmpdir="$TMPD" \
      -Dlog4j2.configurationFile="$SRC/log4j2.xml" \
      -Dkafka.root.log.level="$KAFKA_ROOT_LOG_LEVEL" -Dkafka.logs.dir="$LOGS" \
      "$MARKER" \
      -cp "$LIB/*" kafka.Kafka "$CONF"
  wait_ready kafka "$PIDF" "$MARKER" "$OUT" "$READY_RE" "$KAFKA_HOST" "$KAFKA_PORT" "$KAFKA_START_TIMEOUT"
}

cmd_stop()   { with_lock "$RUN/lock"; stop_pid "$PIDF" "$MARKER" 30; }
cmd_status() { if is_running "$PIDF" "$MARKER"; then echo "running pid=$(cat "$PIDF") bootstrap=$KAFKA_HOST:$KAFKA_PORT"; else echo stopped; return 3; fi; }
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
