"""The alert rules pass `promtool check rules`, and `promtool test rules` shows each one firing on the series
that should raise it (and not before its `for`), with the summary an operator reads."""

import subprocess

import yaml

from runtime.settings import REPO_ROOT

RULES = REPO_ROOT / "infra" / "prometheus"


def promtool() -> str:
    found = subprocess.run(["bash", str(REPO_ROOT / "infra/local/promtool.sh")], capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    return found.stdout.strip()


def test_the_rules_are_valid():
    out = subprocess.run([promtool(), "check", "rules", str(RULES / "alerts.yml")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_each_alert_fires_when_it_should():
    out = subprocess.run([promtool(), "test", "rules", "alerts.test.yml"], capture_output=True, text=True, cwd=RULES)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_issue_s_alerts_are_all_there_and_tested():
    rules = yaml.safe_load((RULES / "alerts.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    wanted = {
        "ParleyConsumerLagHigh",  # consumer lag
        "ParleyDeadLetters",  # dead-letter rate
        "ParleyTTFTP99High",  # TTFT p99
        "ParleyRunErrorRate",  # error rate
        "ParleyEngineUnhealthy",  # engine unhealthy
        "ParleyBudgetLedgerErrors",  # budget-ledger errors
        "ParleyProcessDown",  # a process that does not answer its scrape
        "ParleyEngineSaturated",  # an engine with requests waiting all the time
        "ParleyEngineQueueGrowing",  # its queue growing
        "ParleyEngineKVCacheFull",  # its KV cache full
    }
    assert wanted <= names
    tests = yaml.safe_load((RULES / "alerts.test.yml").read_text())["tests"]
    fired = {t["alertname"] for case in tests for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert wanted <= fired


def exported_metrics() -> set[str]:
    """Every metric name Parley's code declares (prometheus_client adds _total, _bucket, _count, _sum)."""
    import re

    names = set()
    for path in REPO_ROOT.glob("[a-z]*/**/*.py"):
        if path.parts[len(REPO_ROOT.parts)] in {"tests", "bench", ".venv", "web"}:
            continue
        names |= set(re.findall(r'"(parley_[a-z_]+)"', path.read_text()))
    return names


def referenced(expr: str) -> set[str]:
    import re

    return {re.sub(r"_(bucket|count|sum)$", "", m) for m in re.findall(r"\b(parley_[a-z_]+)", expr)}


def test_the_operations_dashboard_and_the_rules_query_metrics_that_exist(tmp_path):
    import json
    import re

    board = json.loads((REPO_ROOT / "infra/grafana/dashboards/parley-operations.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    rules = yaml.safe_load((RULES / "alerts.yml").read_text())
    exprs_all = exprs + [r["expr"] for g in rules["groups"] for r in g["rules"]]
    known = exported_metrics()
    sglang = {
        line
        for line in (REPO_ROOT / "tests/unit/data/sglang/metrics-0.5.23.txt").read_text().split()
        if "sglang:" in line
    }
    dcgm = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"}  # the DCGM exporter's defaults
    for expr in exprs_all:
        missing = {m for m in referenced(expr) if m not in known and m.removesuffix("_total") not in known}
        missing |= set(re.findall(r"sglang:[a-z0-9_]+", expr)) - sglang
        missing |= set(re.findall(r"DCGM_[A-Z_]+", expr)) - dcgm
        assert not missing, (expr, missing)
    # Every panel's query is valid PromQL: promtool parses them as recording rules.
    recorded = {
        "groups": [
            {"name": "panels", "rules": [{"record": f"parley:panel_{i}", "expr": e} for i, e in enumerate(exprs)]}
        ]
    }
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump(recorded))
    out = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    titles = " ".join(p["title"].lower() for p in board["panels"])
    for subject in (
        "lag",
        "first token",
        "inter-token",
        "queue",
        "rejections",
        "dead-letter",
        "engine health",
        "kv cache",
        "gpu utilisation",
    ):
        assert subject in titles, subject
