"""The `parley` command as an operator meets it in a pod: the deployment's namespace by default, its version,
and exit statuses that tell a usage error from a finding."""

from __future__ import annotations

import argparse
import importlib.metadata
from types import SimpleNamespace

import pytest

from infra import cli, log_commands


def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) of every command that runs something."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from leaves(child, (*path, name))


def test_every_command_that_takes_a_namespace_defaults_to_the_deployments(monkeypatch):
    monkeypatch.setenv("PARLEY_NAMESPACE", "parley-prod")  # as the chart sets it in every pod
    namespaced = []
    for path, parser in leaves(cli.build_parser()):
        options = {o for a in parser._actions for o in a.option_strings}
        if "--namespace" in options:
            namespaced.append(" ".join(path))
            assert parser.get_default("namespace") == "parley-prod", path
    assert {"runs show", "usage reconcile", "topics create", "replay", "status", "trace"} <= set(namespaced)
    args = cli.build_parser().parse_args(["runs", "show", "r1", "--namespace", "staging"])
    assert args.namespace == "staging"  # a flag still wins
    monkeypatch.delenv("PARLEY_NAMESPACE")
    assert cli.build_parser().parse_args(["runs", "show", "r1"]).namespace == ""


def test_version_and_a_usage_error(capsys):
    with pytest.raises(SystemExit) as shown:
        cli.main(["--version"])
    assert shown.value.code == 0
    assert capsys.readouterr().out.strip() == f"parley {importlib.metadata.version('parley')}"
    with pytest.raises(SystemExit) as wrong:
        cli.main(["runs", "shw"])
    assert wrong.value.code == 2


def test_the_version_comes_from_the_sources_where_the_package_is_not_installed(monkeypatch):
    import tomllib

    from runtime.settings import REPO_ROOT

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)  # as in the image, run from /app
    assert cli.version() == tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_usage_drift_is_a_finding_not_a_usage_error(monkeypatch, capsys):
    import processors.reconcile

    drift = SimpleNamespace(zero=False, summary=lambda: {"drift": True, "missing": 1})
    monkeypatch.setattr(log_commands, "connected", lambda args: (SimpleNamespace(kafka_bootstrap="b"), "m"))
    monkeypatch.setattr(processors.reconcile, "reconcile", lambda *a: drift)
    with pytest.raises(SystemExit) as found:
        cli.main(["usage", "reconcile", "--quiet"])
    assert found.value.code == log_commands.FINDING == 3
    assert '"missing": 1' in capsys.readouterr().out
    monkeypatch.setattr(processors.reconcile, "reconcile", lambda *a: SimpleNamespace(zero=True, summary=dict))
    cli.main(["usage", "reconcile", "--quiet"])  # no drift: exit 0
