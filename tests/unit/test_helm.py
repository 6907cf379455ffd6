"""The Helm chart (deploy/helm/parley) renders, for each of its value sets, only objects valid against the
Kubernetes API schemas of a current release (kubernetes-validate's bundled schemas, strict: unknown fields
fail) and KEDA's ScaledObject CRD (vendored), offline; and what it renders means what the design says: probes
on /livez and /readyz, a PodDisruptionBudget and resource requests for every workload, KEDA scaling each stage
and pool on its own consumer group's lag over the topics the pipeline gives it, never past their partitions."""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from runtime.settings import REPO_ROOT, StackSettings
from topics.pipeline import POOLS, RUN_SCHEDULED, STAGES, TOPICS

CHART = REPO_ROOT / "deploy" / "helm" / "parley"
VALUE_SETS = ("cpu-demo", "gpu-production", "external-stores")
KUBERNETES = "1.37.0"  # the newest release kubernetes-validate bundles; helm renders for it too


@cache
def helm() -> str:
    built = subprocess.run(["bash", str(REPO_ROOT / "infra/local/build-helm.sh")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return built.stdout.strip()


@cache
def rendered(values: str) -> tuple[dict, ...]:
    out = subprocess.run(
        [
            helm(),
            "template",
            "rel",
            str(CHART),
            "-f",
            str(CHART / "ci" / f"{values}.yaml"),
            "--kube-version",
            KUBERNETES,
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def crd_schema(path: Path, version: str) -> dict:
    crd = yaml.safe_load(path.read_text())
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return served["schema"]["openAPIV3Schema"]


@cache
def scaled_object_schema() -> dict:
    return crd_schema(REPO_ROOT / "tests/unit/data/keda/keda.sh_scaledobjects.yaml", "v1alpha1")


@cache
def custom_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the CRD's schema, for the chart's optional objects (infra/local/crds.sh)."""
    got = subprocess.run(["bash", str(REPO_ROOT / "infra/local/crds.sh")], capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    operator, gateway = (Path(line) for line in got.stdout.split())
    monitoring = operator / "example/prometheus-operator-crd"
    return {
        ("keda.sh/v1alpha1", "ScaledObject"): scaled_object_schema(),
        ("monitoring.coreos.com/v1", "PodMonitor"): crd_schema(
            monitoring / "monitoring.coreos.com_podmonitors.yaml", "v1"
        ),
        ("monitoring.coreos.com/v1", "PrometheusRule"): crd_schema(
            monitoring / "monitoring.coreos.com_prometheusrules.yaml", "v1"
        ),
        ("gateway.networking.k8s.io/v1", "HTTPRoute"): crd_schema(
            gateway / "config/crd/standard/gateway.networking.k8s.io_httproutes.yaml", "v1"
        ),
    }


def strict(schema: dict) -> dict:
    """A CRD schema that, like the API server's pruning, refuses fields it does not declare."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema:
            if not schema.get("x-kubernetes-preserve-unknown-fields"):
                schema["additionalProperties"] = False
    elif isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def of_kind(values: str, kind: str) -> list[dict]:
    return [doc for doc in rendered(values) if doc["kind"] == kind]


@pytest.mark.parametrize("values", VALUE_SETS)
def test_the_chart_lints(values):
    out = subprocess.run(
        [helm(), "lint", str(CHART), "-f", str(CHART / "ci" / f"{values}.yaml"), "--kube-version", KUBERNETES],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("values", VALUE_SETS)
def test_every_rendered_object_is_valid_against_the_api_schemas(values):
    docs = rendered(values)
    assert len(docs) > 20
    custom = custom_schemas()
    for doc in docs:
        kind = (doc["apiVersion"], doc["kind"])
        if kind in custom:  # its spec against the CRD; its metadata is a standard object's
            # CRDs are OpenAPI with Go's regular expressions (some not Python's): the schema is not checked
            # itself, only used.
            validator = jsonschema.Draft202012Validator(strict(custom[kind]))
            validator.validate({k: v for k, v in doc.items() if k != "metadata"})
        else:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_validation_fails_on_an_invalid_object():
    [deployment, *_] = of_kind("cpu-demo", "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/livez"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)
    [monitor, *_] = of_kind("gpu-production", "PodMonitor")
    misspelled = {**monitor, "spec": {**monitor["spec"], "podMetricEndpoints": []}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(strict(custom_schemas()[("monitoring.coreos.com/v1", "PodMonitor")])).validate(
            {k: v for k, v in misspelled.items() if k != "metadata"}
        )
    [scaled, *_] = of_kind("cpu-demo", "ScaledObject")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**scaled, "spec": {**scaled["spec"], "minReplicaCount": "two"}}, scaled_object_schema())


@pytest.mark.parametrize("values", VALUE_SETS)
def test_every_workload_has_probes_that_mean_what_they_say_requests_and_a_disruption_budget(values):
    budgets = {
        d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        for d in of_kind(values, "PodDisruptionBudget")
    }
    deployments = of_kind(values, "Deployment")
    for deployment in deployments:
        component = deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        assert component in budgets, component
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            assert container["resources"]["requests"], (component, container["name"])
            if container["image"].startswith("ghcr.io/parley-chat/parley:"):
                assert container["livenessProbe"]["httpGet"]["path"] == "/livez", component
                assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", component
                assert container["securityContext"]["readOnlyRootFilesystem"] is True
            else:  # an engine beside its consumer
                assert container["readinessProbe"] and container["livenessProbe"], component
    names = {d["metadata"]["name"].removeprefix("rel-parley-") for d in deployments}
    stages = {s for s in STAGES if s not in ("api", "inference")}
    assert {"api", *stages, *(f"inference-{p}" for p in POOLS)} <= names


@pytest.mark.parametrize("values", VALUE_SETS)
def test_keda_scales_each_stage_and_pool_on_its_own_lag_bounded_by_partitions(values):
    partitions = {"cpu-demo": 12, "gpu-production": 12, "external-stores": 24}[values]
    prefix = "parley-prod." if values == "external-stores" else ""
    layout = StackSettings().layout  # the one-partition admin topics are read by every replica alike
    scaled = {s["metadata"]["name"].removeprefix("rel-parley-"): s["spec"] for s in of_kind(values, "ScaledObject")}
    for stage in (s for s in STAGES if s not in ("api", "inference")):
        wanted = {f"{prefix}{t.name}" for t in TOPICS if stage in t.consumers and layout.partitions(t) > 1}
        triggers = scaled[stage]["triggers"]
        assert {t["metadata"]["topic"] for t in triggers} == wanted, stage
        group = f"{prefix}{stage}" if prefix else f"parley.{stage}"
        assert {t["metadata"]["consumerGroup"] for t in triggers} == {group}, stage
        assert 1 <= scaled[stage]["minReplicaCount"] <= scaled[stage]["maxReplicaCount"] <= partitions
    for pool in POOLS:
        spec = scaled[f"inference-{pool}"]
        [trigger] = spec["triggers"]
        assert trigger["metadata"]["topic"] == f"{prefix}{RUN_SCHEDULED[pool].name}"
        assert trigger["metadata"]["consumerGroup"] == (
            f"{prefix}inference.{pool}" if prefix else f"parley.inference.{pool}"
        )
        assert spec["maxReplicaCount"] <= partitions
    for deployment in of_kind(values, "Deployment"):
        if deployment["metadata"]["name"].removeprefix("rel-parley-") in scaled:
            assert "replicas" not in deployment["spec"]  # KEDA owns the count


def test_the_migration_runs_before_the_processes_and_secrets_are_referenced_not_inlined():
    for values in VALUE_SETS:
        [job] = [j for j in of_kind(values, "Job") if "helm.sh/hook" in j["metadata"].get("annotations", {})]
        assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert job["spec"]["template"]["spec"]["containers"][0]["command"] == [
            "python",
            "-m",
            "storage.schema",
            "--topics",
        ]
        secrets = {s["metadata"]["name"] for s in of_kind(values, "Secret")} or {"parley-secrets"}
        for deployment in of_kind(values, "Deployment"):
            for container in deployment["spec"]["template"]["spec"]["containers"]:
                if not container["image"].startswith("ghcr.io/parley-chat/parley:"):
                    continue
                env = {e["name"]: e for e in container["env"]}
                for key in ("PARLEY_JWT_SECRET", "PARLEY_USAGE_PASSWORD", "PARLEY_INTERNAL_TOKEN"):
                    assert env[key]["valueFrom"]["secretKeyRef"]["name"] in secrets, (values, key)
                    assert "value" not in env[key]
        # the periods the migration applies to topics and tables, and every process reads (docs/privacy.md)
        env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert (env["PARLEY_RETAIN_EVENTS_DAYS"], env["PARLEY_RETAIN_SAFETY_DAYS"]) == ("30", "90"), values
        assert "PARLEY_MAX_CHAT_AGE_DAYS" not in env  # chats kept until deleted unless the values say
    assert len(of_kind("cpu-demo", "NetworkPolicy")) >= 3


HOOK = "helm.sh/hook"


def references(pod: dict) -> set[tuple[str, str]]:
    """(kind, name) of every object a pod spec needs to start: its account, Secrets, ConfigMaps and claims."""
    found = {("ServiceAccount", pod.get("serviceAccountName", "default"))}
    found |= {("Secret", s["name"]) for s in pod.get("imagePullSecrets", [])}
    for container in pod.get("initContainers", []) + pod["containers"]:
        for env in container.get("env", []):
            source = env.get("valueFrom", {})
            if "secretKeyRef" in source:
                found.add(("Secret", source["secretKeyRef"]["name"]))
            if "configMapKeyRef" in source:
                found.add(("ConfigMap", source["configMapKeyRef"]["name"]))
        for env in container.get("envFrom", []):
            if "secretRef" in env:
                found.add(("Secret", env["secretRef"]["name"]))
            if "configMapRef" in env:
                found.add(("ConfigMap", env["configMapRef"]["name"]))
    for volume in pod.get("volumes", []):
        if "secret" in volume:
            found.add(("Secret", volume["secret"]["secretName"]))
        if "configMap" in volume:
            found.add(("ConfigMap", volume["configMap"]["name"]))
        if "persistentVolumeClaim" in volume:
            found.add(("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]))
    return found


@pytest.mark.parametrize("values", VALUE_SETS)
def test_a_hook_needs_nothing_helm_creates_after_it(values):
    """Helm creates a release's objects only after its pre-install hooks have run: what a hook's pod needs is
    either a hook of the same events with a lower weight, or not made by the chart at all (an existing Secret,
    the namespace's default account)."""
    docs = rendered(values)
    made = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    hooks = [d for d in docs if HOOK in d["metadata"].get("annotations", {})]
    jobs = [h for h in hooks if h["kind"] == "Job"]
    assert jobs, values
    for job in jobs:
        events = set(job["metadata"]["annotations"][HOOK].split(","))
        weight = int(job["metadata"]["annotations"].get("helm.sh/hook-weight", "0"))
        for kind, name in sorted(references(job["spec"]["template"]["spec"])):
            needed = made.get((kind, name))
            if needed is None:
                continue  # not the chart's: exists before the release (checked by its own value set)
            annotations = needed["metadata"].get("annotations", {})
            assert HOOK in annotations, f"{values}: the hook {job['metadata']['name']} needs {kind}/{name}"
            assert events <= set(annotations[HOOK].split(",")), (values, kind, name)
            assert int(annotations.get("helm.sh/hook-weight", "0")) < weight, (values, kind, name)
            policy = annotations.get("helm.sh/hook-delete-policy", "")
            if kind == "Secret":  # a hook's copy of credentials does not outlive the hooks
                assert {"hook-succeeded", "hook-failed"} <= set(policy.split(",")), (values, name)


def pods(values: str) -> list[dict]:
    return [d["spec"]["template"]["spec"] for d in rendered(values) if d["kind"] in ("Deployment", "Job")]


def test_the_operator_options_reach_every_pod_and_route_streams_unbuffered():
    for pod in pods("gpu-production"):  # a private registry: every pod, the engines' and the hook's too
        assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
        for container in pod["containers"]:
            if container["image"].startswith("ghcr.io/parley-chat/parley:"):
                assert container["env"][-1] == {"name": "PARLEY_ADMISSION_TIMEOUT_S", "value": "15"}
            elif container["name"] == "engine":
                assert container["args"][-2:] == ["--log-level", "warning"]
                assert pod["runtimeClassName"] == "nvidia"
    [route] = of_kind("gpu-production", "HTTPRoute")
    [rule] = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"name": "rel-parley-api", "port": 80}]
    assert rule["timeouts"] == {"request": "3600s", "backendRequest": "3600s"}

    for pod in pods("external-stores"):
        assert pod["runtimeClassName"] == "gvisor" and "imagePullSecrets" not in pod
    [ingress] = of_kind("external-stores", "Ingress")
    notes = ingress["metadata"]["annotations"]
    assert notes["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"  # each SSE event passed on at once
    assert notes["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "3600"
    [path] = ingress["spec"]["rules"][0]["http"]["paths"]
    assert path["backend"]["service"] == {"name": "rel-parley-api", "port": {"name": "http"}}
    # the edge serves HTTPS from its TLS Secret: mounted, named to the edge, probed and proxied over HTTPS
    assert notes["nginx.ingress.kubernetes.io/backend-protocol"] == "HTTPS"
    [api] = [d for d in of_kind("external-stores", "Deployment") if d["metadata"]["name"] == "rel-parley-api"]
    [edge] = api["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in edge["env"]}
    assert (env["PARLEY_TLS_CERT_FILE"], env["PARLEY_TLS_KEY_FILE"]) == (
        "/etc/parley/tls/tls.crt",
        "/etc/parley/tls/tls.key",
    )
    assert {"name": "tls", "mountPath": "/etc/parley/tls", "readOnly": True} in edge["volumeMounts"]
    assert {"name": "tls", "secret": {"secretName": "parley-edge-tls", "defaultMode": 0o440}} in api["spec"][
        "template"
    ]["spec"]["volumes"]
    assert edge["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    for pod in pods("cpu-demo"):  # plain HTTP behind an ingress that terminates TLS, by default
        for container in pod["containers"]:
            assert "PARLEY_TLS_CERT_FILE" not in {e["name"] for e in container.get("env", [])}

    optional = ("Ingress", "HTTPRoute", "PodMonitor", "PrometheusRule", "ConfigMap")
    assert not [d for d in rendered("cpu-demo") if d["kind"] in optional]


def test_monitoring_scrapes_every_process_and_ships_the_repositorys_alerts_and_dashboards():
    monitor, engines = of_kind("gpu-production", "PodMonitor")
    selector = monitor["spec"]["selector"]
    [excluded] = selector["matchExpressions"]
    scraped = 0
    for deployment in of_kind("gpu-production", "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        if labels["app.kubernetes.io/component"] in excluded["values"]:
            continue
        assert selector["matchLabels"].items() <= labels.items()
        [consumer, *_] = deployment["spec"]["template"]["spec"]["containers"]
        assert "http" in {p["name"] for p in consumer["ports"]}  # the port the monitor scrapes
        assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
        scraped += 1
    assert scraped == 1 + 5 + 2 + 1  # the edge, the five stages, the two pools, the guard model
    # each engine's own metrics, which its consumer serves from the engine's loopback
    [endpoint] = engines["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/engine/metrics")
    [wanted] = engines["spec"]["selector"]["matchExpressions"]
    pools = [
        d
        for d in of_kind("gpu-production", "Deployment")
        if wanted["key"] in d["spec"]["template"]["metadata"]["labels"]
    ]
    assert len(pools) == 2 and all("--enable-metrics" in engine_of(d)["args"] for d in pools)

    [rule] = of_kind("gpu-production", "PrometheusRule")
    alerts = yaml.safe_load((REPO_ROOT / "infra/prometheus/alerts.yml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    boards = {c["metadata"]["name"]: c for c in of_kind("gpu-production", "ConfigMap")}
    for path in sorted((REPO_ROOT / "infra/grafana/dashboards").glob("*.json")):
        board = boards[f"rel-parley-{path.stem}"]
        assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(board["data"][path.name]) == json.loads(path.read_text())


def engine_of(deployment: dict) -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "engine")
