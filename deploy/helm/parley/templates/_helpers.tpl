{{/* Names, labels and the environment every Parley process shares. */}}
{{- define "parley.fullname" -}}
{{- printf "%s-parley" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "parley.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "parley.labels" -}}
app.kubernetes.io/name: parley
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: include "parley.selector" (list $ "api") */}}
{{- define "parley.selector" -}}
app.kubernetes.io/name: parley
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "parley.secretName" -}}
{{- default (printf "%s-secrets" (include "parley.fullname" .)) .Values.secrets.existingSecret -}}
{{- end -}}

{{- define "parley.group" -}}
{{- $root := index . 0 -}}
{{- if $root.Values.namespace -}}{{ printf "%s.%s" $root.Values.namespace (index . 1) }}{{- else -}}{{ printf "parley.%s" (index . 1) }}{{- end -}}
{{- end -}}

{{- define "parley.topic" -}}
{{- $root := index . 0 -}}
{{- if $root.Values.namespace -}}{{ printf "%s.%s" $root.Values.namespace (index . 1) }}{{- else -}}{{ index . 1 }}{{- end -}}
{{- end -}}

{{- define "parley.registryUrl" -}}
{{- if .Values.schemaRegistry.enabled -}}
{{- printf "http://%s-registry:8081" (include "parley.fullname" .) -}}
{{- else -}}
{{- required "schemaRegistry.url is required when schemaRegistry.enabled is false" .Values.schemaRegistry.url -}}
{{- end -}}
{{- end -}}

{{/* The environment of a Parley process whose credentials come from the release's Secret. */}}
{{- define "parley.env" -}}
{{ include "parley.envFrom" (list . (include "parley.secretName" .)) }}
{{- end -}}

{{/* With kafka.sasl, the Kafka user a process signs in as (its stage's: ACLs let it read and write only its
topics) and its password, the Secret's kafka-password-<user>: include "parley.kafkaUser" (list $ "api" [secret]) */}}
{{- define "parley.kafkaUser" -}}
{{- $root := index . 0 -}}
{{- $secret := ternary (index . (sub (len .) 1)) (include "parley.secretName" $root) (eq (len .) 3) -}}
{{- if $root.Values.kafka.sasl }}
- name: PARLEY_KAFKA_USERNAME
  value: {{ index . 1 | quote }}
- name: PARLEY_KAFKA_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: {{ printf "kafka-password-%s" (index . 1) }}}}
{{- end }}
{{- end -}}

{{/* The same, with the credentials from a named Secret: include "parley.envFrom" (list $ "name") */}}
{{- define "parley.envFrom" -}}
{{- $secret := index . 1 -}}
{{- with index . 0 -}}
- name: PARLEY_NAMESPACE
  value: {{ .Values.namespace | quote }}
- name: PARLEY_KAFKA_BOOTSTRAP
  value: {{ .Values.kafka.bootstrap | quote }}
- name: PARLEY_KAFKA_REPLICATION_FACTOR
  value: {{ .Values.kafka.replicationFactor | quote }}
- name: PARLEY_KAFKA_MIN_INSYNC_REPLICAS
  value: {{ .Values.kafka.minInsyncReplicas | quote }}
- name: PARLEY_CHAT_PARTITIONS
  value: {{ .Values.kafka.chatPartitions | quote }}
- name: PARLEY_REPLY_PARTITIONS
  value: {{ .Values.kafka.replyPartitions | quote }}
- name: PARLEY_POOLS
  value: {{ include "parley.pools" . | quote }}
- name: PARLEY_SCHEMA_REGISTRY_URL
  value: {{ include "parley.registryUrl" . | quote }}
- name: PARLEY_CASSANDRA_HOSTS
  value: {{ .Values.cassandra.hosts | quote }}
- name: PARLEY_CASSANDRA_PORT
  value: {{ .Values.cassandra.port | quote }}
- name: PARLEY_CASSANDRA_DATACENTER
  value: {{ .Values.cassandra.datacenter | quote }}
- name: PARLEY_CASSANDRA_REPLICATION
  value: {{ .Values.cassandra.replication | toJson | quote }}
- name: PARLEY_CASSANDRA_CONSISTENCY
  value: {{ .Values.cassandra.consistency | quote }}
{{- if .Values.cassandra.username }}
- name: PARLEY_CASSANDRA_USERNAME
  value: {{ .Values.cassandra.username | quote }}
- name: PARLEY_CASSANDRA_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: cassandra-password}}
{{- end }}
{{- if .Values.cassandra.caSecret }}
- name: PARLEY_CASSANDRA_CA_FILE  # TLS to every node (docs/decisions/0032)
  value: /etc/parley/cassandra-ca/ca.crt
{{- end }}
{{- if .Values.kafka.caSecret }}
- name: PARLEY_KAFKA_CA_FILE
  value: /etc/parley/kafka-ca/ca.crt
{{- end }}
- name: PARLEY_USAGE_URL
  value: {{ required "clickhouse.url is required: a cluster stores usage in a ClickHouse server" .Values.clickhouse.url | quote }}
- name: PARLEY_USAGE_USER
  value: {{ .Values.clickhouse.user | quote }}
- name: PARLEY_USAGE_DATABASE
  value: {{ .Values.clickhouse.database | quote }}
- name: PARLEY_USAGE_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: clickhouse-password}}
- name: PARLEY_JWT_SECRET
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: jwt-secret}}
- name: PARLEY_INTERNAL_TOKEN
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: internal-token}}
- name: PARLEY_KEK  # wraps each person's data key (docs/privacy.md)
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: kek}}
{{- if include "parley.guardUrl" . }}
- name: PARLEY_GUARD_URL
  value: {{ include "parley.guardUrl" . | quote }}
- name: PARLEY_GUARD_MODEL
  value: {{ .Values.guard.model | quote }}
- name: PARLEY_GUARD_API_KEY  # when the Secret has one
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: guard-api-key, optional: true}}
{{- end }}
{{- with .Values.retention }}
- name: PARLEY_RETAIN_EVENTS_DAYS
  value: {{ .eventsDays | quote }}
- name: PARLEY_RETAIN_STREAM_DAYS
  value: {{ .streamDays | quote }}
- name: PARLEY_RETAIN_USAGE_DAYS
  value: {{ .usageDays | quote }}
- name: PARLEY_RETAIN_SAFETY_DAYS
  value: {{ .safetyDays | quote }}
- name: PARLEY_RETAIN_AUDIT_DAYS
  value: {{ .auditDays | quote }}
- name: PARLEY_RETAIN_EVALS_DAYS
  value: {{ .evalsDays | quote }}
- name: PARLEY_RETAIN_RESPONSES_DAYS
  value: {{ .responsesDays | quote }}
{{- if .chatsDays }}
- name: PARLEY_MAX_CHAT_AGE_DAYS
  value: {{ .chatsDays | quote }}
{{- end }}
{{- end }}
- name: PARLEY_METERING_URL
  value: {{ printf "http://%s-metering:%v" (include "parley.fullname" .) .Values.stageDefaults.webPort | quote }}
- name: PARLEY_LOG_FORMAT
  value: {{ .Values.observability.logFormat | quote }}
- name: PARLEY_HOST
  value: "0.0.0.0"
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: "k8s.pod.name=$(POD_NAME),k8s.namespace.name={{ .Release.Namespace }}"
{{- if .Values.observability.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.observability.otlpEndpoint | quote }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The edge's sign-in settings (docs/signin.md). */}}
{{- define "parley.authEnv" -}}
- name: PARLEY_OIDC_ISSUER
  value: {{ .Values.auth.oidcIssuer | quote }}
- name: PARLEY_OIDC_CLIENT_ID
  value: {{ .Values.auth.oidcClientId | quote }}
- name: PARLEY_OIDC_CLIENT_SECRET  # when the Secret has one
  valueFrom: {secretKeyRef: {name: {{ include "parley.secretName" . }}, key: oidc-client-secret, optional: true}}
- name: PARLEY_OIDC_ROLE_MAP
  value: {{ .Values.auth.roleMap | quote }}
- name: PARLEY_PUBLIC_URL
  value: {{ .Values.auth.publicUrl | quote }}
{{- with .Values.auth.localAccounts }}
- name: PARLEY_LOCAL_ACCOUNTS
  value: {{ . | quote }}
{{- end }}
- name: PARLEY_SESSION_CHECK_S
  value: {{ .Values.auth.sessionCheckS | quote }}
{{- end -}}

{{/* The operator's own variables, last in every Parley container's env (so they win). */}}
{{- define "parley.extraEnv" -}}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The keys of the Secret the chart makes when no existing one is named. */}}
{{- define "parley.secretData" -}}
jwt-secret: {{ required "secrets.jwtSecret (or secrets.existingSecret) is required" .Values.secrets.jwtSecret | quote }}
internal-token: {{ required "secrets.internalToken (or secrets.existingSecret) is required" .Values.secrets.internalToken | quote }}
kek: {{ required "secrets.kek (or secrets.existingSecret) is required: base64 of 32 random bytes" .Values.secrets.kek | quote }}
clickhouse-password: {{ required "secrets.clickhousePassword (or secrets.existingSecret) is required" .Values.secrets.clickhousePassword | quote }}
{{- if .Values.secrets.guardApiKey }}
guard-api-key: {{ .Values.secrets.guardApiKey | quote }}
{{- end }}
{{- if .Values.secrets.oidcClientSecret }}
oidc-client-secret: {{ .Values.secrets.oidcClientSecret | quote }}
{{- end }}
{{- if .Values.cassandra.username }}
cassandra-password: {{ required "secrets.cassandraPassword is required with cassandra.username" .Values.secrets.cassandraPassword | quote }}
{{- end }}
{{- if .Values.kafka.sasl }}
{{- range list "admin" "api" "moderation" "scheduling" "inference" "persistence" "metering" "memory" "registry" }}
{{ printf "kafka-password-%s" . }}: {{ required (printf "secrets.kafkaPasswords.%s is required with kafka.sasl" .) (get $.Values.secrets.kafkaPasswords .) | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The Secret the migration reads: the existing one, or the hook's own copy (the release's Secret is made
only after the pre-install hooks have run). */}}
{{- define "parley.migrationSecretName" -}}
{{- default (printf "%s-migrate" (include "parley.fullname" .)) .Values.secrets.existingSecret -}}
{{- end -}}

{{/* What every Parley container shares: non-root, read-only root, no privileges; its state on an emptyDir. */}}
{{- define "parley.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end -}}

{{- define "parley.stateMounts" -}}
volumeMounts:
  - {name: state, mountPath: /var/lib/parley}
  - {name: tmp, mountPath: /tmp}
{{- if .Values.kafka.caSecret }}
  - {name: kafka-ca, mountPath: /etc/parley/kafka-ca, readOnly: true}
{{- end }}
{{- if .Values.cassandra.caSecret }}
  - {name: cassandra-ca, mountPath: /etc/parley/cassandra-ca, readOnly: true}
{{- end }}
{{- end -}}

{{/* A process that counts tokens (engine: gpu): the stateMounts and the models volume, where each pool's
tokenizer is. */}}
{{- define "parley.processMounts" -}}
{{ include "parley.stateMounts" . }}
{{- if eq .Values.inference.engine "gpu" }}
  - {name: models, mountPath: /models, readOnly: true}
{{- end }}
{{- end -}}

{{- define "parley.stateVolumes" -}}
- name: state
  emptyDir: {}
- name: tmp
  emptyDir: {}
{{- with .Values.kafka.caSecret }}
- name: kafka-ca
  secret: {secretName: {{ . }}, defaultMode: 0444, items: [{key: ca.crt, path: ca.crt}]}
{{- end }}
{{- with .Values.cassandra.caSecret }}
- name: cassandra-ca
  secret: {secretName: {{ . }}, defaultMode: 0444, items: [{key: ca.crt, path: ca.crt}]}
{{- end }}
{{- end -}}

{{- define "parley.processVolumes" -}}
{{ include "parley.stateVolumes" . }}
{{- if eq .Values.inference.engine "gpu" }}
- name: models
  persistentVolumeClaim: {claimName: {{ include "parley.fullname" . }}-models, readOnly: true}
{{- end }}
{{- end -}}

{{/* engine: gpu. Where a model lives on the models volume, by its Hugging Face id. */}}
{{- define "parley.modelDir" -}}
{{- printf "/models/%s" (replace "/" "--" .) -}}
{{- end -}}

{{/* Every model the GPU pools serve, once each, sorted. */}}
{{- define "parley.modelRepos" -}}
{{- $repos := list -}}
{{- range $_, $pool := .Values.inference.pools -}}
{{- $repos = append $repos $pool.gpu.modelPath -}}
{{- end -}}
{{- if .Values.guard.serve.enabled -}}
{{- $repos = append $repos .Values.guard.serve.modelPath -}}
{{- end -}}
{{- $repos | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* engine: gpu. An init container that waits until the models Job has put what this pod reads on the models
volume: [root, "tokenizer" or "weights", the models' ids]. */}}
{{- define "parley.modelWait" -}}
{{- $root := index . 0 -}}
{{- if eq $root.Values.inference.engine "gpu" -}}
{{- $marks := list -}}
{{- range index . 2 -}}
{{- $marks = append $marks (printf "%s/.%s-ready" (include "parley.modelDir" .) (index $ 1)) -}}
{{- end -}}
- name: wait-models
  image: {{ include "parley.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  command: ["python", "-c", {{ $root.Files.Get "files/wait_models.py" | quote }}]
  args: {{ toJson $marks }}
  resources: {requests: {cpu: 10m, memory: 32Mi}, limits: {memory: 64Mi}}
  {{- include "parley.containerSecurity" $root | nindent 2 }}
  volumeMounts:
    - {name: models, mountPath: /models, readOnly: true}
{{- end -}}
{{- end -}}

{{/* What every pod of the chart takes: the registry's pull secrets. */}}
{{- define "parley.pullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "parley.podExtras" -}}
{{- include "parley.pullSecrets" . }}
{{- with .Values.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "parley.scrape" -}}
{{- $root := index . 0 -}}
{{- if $root.Values.observability.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ index . 1 | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/* liveness and readiness on a port: include "parley.probes" 8000, or over TLS: (list 8000 "HTTPS") */}}
{{- define "parley.probes" -}}
{{- $port := . }}{{ $scheme := "HTTP" }}
{{- if kindIs "slice" . }}{{ $port = index . 0 }}{{ $scheme = index . 1 }}{{ end -}}
livenessProbe:
  httpGet: {path: /livez, port: {{ $port }}, scheme: {{ $scheme }}}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 6
readinessProbe:
  httpGet: {path: /readyz, port: {{ $port }}, scheme: {{ $scheme }}}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
startupProbe:
  httpGet: {path: /livez, port: {{ $port }}, scheme: {{ $scheme }}}
  periodSeconds: 5
  failureThreshold: 60
{{- end -}}

{{- define "parley.pdb" -}}
{{- $root := index . 0 -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "parley.fullname" $root }}-{{ index . 1 }}
  labels: {{- include "parley.labels" $root | nindent 4 }}
spec:
  maxUnavailable: {{ $root.Values.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels: {{- include "parley.selector" (list $root (index . 1)) | nindent 6 }}
{{- end -}}

{{- define "parley.pools" -}}
{{- $pools := dict -}}
{{- range $name, $pool := .Values.inference.pools -}}
{{- $spec := dict "model" $pool.model "context" $pool.context "prompt_budget" $pool.promptBudget -}}
{{- if eq $.Values.inference.engine "gpu" -}}
{{- /* counted with the serving model's own tokenizer, from the models volume */ -}}
{{- $_ := set $spec "tokenizer" (printf "hf:%s" (include "parley.modelDir" $pool.gpu.modelPath)) -}}
{{- end -}}
{{- $_ := set $pools $name $spec -}}
{{- end -}}
{{- toJson $pools -}}
{{- end -}}

{{/* Where the guard model is asked: the one served here, or guard.url; empty: no guard model. */}}
{{- define "parley.guardUrl" -}}
{{- if .Values.guard.serve.enabled -}}
{{- printf "http://%s-guard:30000" (include "parley.fullname" .) -}}
{{- else -}}
{{- .Values.guard.url -}}
{{- end -}}
{{- end -}}
