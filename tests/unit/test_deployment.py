"""docker-compose.yml describes the same system: it validates, and runs every stage with a healthcheck."""

import shutil
import subprocess

import pytest
import yaml

from runtime.settings import REPO_ROOT
from topics.pipeline import POOLS, STAGES

COMPOSE = REPO_ROOT / "docker-compose.yml"


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose (Debian package) not installed")
def test_compose_file_validates_offline():
    result = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        env={
            "PARLEY_JWT_SECRET": "t",
            "PARLEY_INTERNAL_TOKEN": "t",
            "PARLEY_KEK": "k",
            "CLICKHOUSE_PASSWORD": "t",
            "PATH": "/usr/bin:/bin",
        },
    )
    assert result.returncode == 0, result.stderr


def test_every_stage_and_store_is_a_service_with_a_healthcheck():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    engines = [f"{kind}-{pool}" for kind in ("sglang", "llama", "inference-cpu", "inference-gpu") for pool in POOLS]
    for name in (
        "kafka",
        "cassandra",
        "clickhouse",
        "api",
        *engines,
        *[s for s in STAGES if s not in ("api", "inference")],
    ):
        assert name in services, name
        assert "healthcheck" in services[name], name
    for pool in POOLS:
        assert services[f"sglang-{pool}"]["profiles"] == ["gpu"]
        assert "--enable-cache-report" in services[f"sglang-{pool}"]["command"]
        assert services[f"inference-gpu-{pool}"]["environment"]["PARLEY_POOL"] == pool


def test_grafana_is_provisioned_with_clickhouse_and_the_usage_dashboard():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    grafana = services["grafana"]
    assert "grafana-clickhouse-datasource" in grafana["environment"]["GF_INSTALL_PLUGINS"]
    mounts = {v.split(":")[1] for v in grafana["volumes"] if v.startswith("./")}
    assert mounts == {"/etc/grafana/provisioning", "/var/lib/grafana/dashboards"}
    source = yaml.safe_load((REPO_ROOT / "infra/grafana/provisioning/datasources/clickhouse.yaml").read_text())
    [ds] = source["datasources"]
    assert ds["jsonData"]["host"] == "clickhouse" and ds["jsonData"]["port"] == 8123
    assert ds["jsonData"]["username"] == "parley" and ds["secureJsonData"]["password"] == "$CLICKHOUSE_PASSWORD"
    assert grafana["environment"]["CLICKHOUSE_PASSWORD"].startswith("${CLICKHOUSE_PASSWORD")


def test_clickhouse_has_a_real_user_and_password_that_metering_and_the_migration_use():
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    server = services["clickhouse"]["environment"]
    assert server["CLICKHOUSE_USER"] == "parley" and server["CLICKHOUSE_PASSWORD"].startswith("${CLICKHOUSE_PASSWORD:?")
    env = compose["x-parley"]["environment"]
    assert env["PARLEY_USAGE_URL"] == "http://clickhouse:8123" and "@" not in env["PARLEY_USAGE_URL"]
    assert env["PARLEY_USAGE_USER"] == "parley" and env["PARLEY_USAGE_PASSWORD"] == server["CLICKHOUSE_PASSWORD"]
    assert services["migrate"]["command"] == ["python", "-m", "storage.schema", "--topics"]
    for name in ("metering", "api", "scheduling", "persistence", "memory", "moderation"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name


def test_every_image_is_pinned_to_a_version():
    import re

    for name, spec in yaml.safe_load(COMPOSE.read_text())["services"].items():
        image = spec.get("image")
        if image:
            assert re.search(r":v?\d+\.\d+\.\d+|:server-b\d+$", image), (name, image)
