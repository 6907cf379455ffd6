"""What operators and contributors read is true to the code: docs/operations.md names every setting, metric and
alert, and no link in the README or docs/ leaves the repository or points at a file that is not there."""

import re
from pathlib import Path

import pytest
import yaml

from api.settings import ApiSettings
from inference.settings import InferenceSettings
from processors.settings import ProcessorSettings
from registry.__main__ import RegistrySettings

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("settings", [ApiSettings, ProcessorSettings, InferenceSettings, RegistrySettings])
def test_every_setting_is_in_the_operations_page(settings):
    missing = [
        f"PARLEY_{name.upper()}" for name in settings.model_fields if f"`PARLEY_{name.upper()}`" not in OPERATIONS
    ]
    assert not missing, missing


def test_every_metric_and_alert_is_in_the_operations_page():
    from prometheus_client import REGISTRY

    import api.app  # noqa: F401  (each deployable's modules define their series at import)
    import inference.worker  # noqa: F401
    import processors.meter_usage  # noqa: F401
    import processors.remember  # noqa: F401
    import processors.schedule_run  # noqa: F401

    ours = {m.name for m in REGISTRY.collect() if m.name.startswith("parley_")}
    assert len(ours) > 20
    assert not {m for m in ours if f"`{m}" not in OPERATIONS}, "metrics the page does not name"
    rules = yaml.safe_load((ROOT / "infra" / "prometheus" / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert alerts and not {a for a in alerts if f"`{a}`" not in OPERATIONS}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_in_the_repository_and_resolve(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        assert not target.startswith(("http:", "https:", "/")), f"{page.name} links outside: {target}"
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT) and path.exists(), f"{page.name}: {target} is not in the repository"
    assert "../shared" not in page.read_text()


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    assert any("make run" in line for line in lines[:30]) and any("make test" in line for line in lines[:30])
