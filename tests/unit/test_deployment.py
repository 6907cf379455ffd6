"""docker-compose.yml describes the same system: it validates, and runs every stage with a healthcheck."""

import shutil
import subprocess

import pytest
import yaml

from topics.pipeline import POOLS, STAGES
from topics.settings import REPO_ROOT

COMPOSE = REPO_ROOT / "docker-compose.yml"


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose (Debian package) not installed")
def test_compose_file_validates_offline():
    result = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        env={"PARLEY_JWT_SECRET": "test", "PATH": "/usr/bin:/bin"},
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
