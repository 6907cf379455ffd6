"""The container image carries everything its entrypoints import, and installs from the same lock as `make`.

The entrypoints are the commands docker-compose.yml runs on the Parley image (and the migration job); from
each, every import statement is followed through our own modules (including imports inside functions, which
a stage makes lazily), so a module left out of the Dockerfile's COPY lines, or a package left out of
requirements.lock, fails here rather than at a container's start.
"""

from __future__ import annotations

import ast
import re
import shlex
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import yaml

from runtime.settings import REPO_ROOT
from topics.pipeline import PROCESSES

OURS = {
    "api",
    "processors",
    "inference",
    "registry",
    "topics",
    "runtime",
    "admission",
    "conversation",
    "storage",
    "safety",
    "infra",
    "replay",
}
DOCKERFILE = (REPO_ROOT / "Dockerfile").read_text()


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lock: str) -> dict[str, str]:
    text = (REPO_ROOT / lock).read_text()
    return {normalized(m[1]): m[2] for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==(\S+)", text, re.M)}


def copied() -> list[str]:
    """The repository paths the final image stage copies (COPY lines without --from)."""
    final = DOCKERFILE.rsplit("\nFROM ", 1)[1]
    out = []
    for line in final.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            *sources, _target = shlex.split(line)[1:]
            out.extend(s.rstrip("/") for s in sources)
    return out


def image_distributions() -> set[str]:
    extra = re.findall(r"--no-deps ((?:[\w.\-]+==[\w.]+ ?)+)", DOCKERFILE)
    wheels = {normalized(spec.split("==")[0]) for group in extra for spec in group.split()}
    return set(pins("requirements.lock")) | wheels


def entrypoints() -> dict[str, str]:
    """service -> the Python source its command runs (a module's __main__, or a `python -c` program)."""
    services = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["services"]
    out = {}
    for name, spec in services.items():
        command = spec.get("command") or []
        if not str(spec.get("image", "")).startswith("parley:") or not command or command[0] != "python":
            continue
        if command[1] == "-m":
            out[name] = f"import {command[2]}.__main__"
        elif command[1] == "-c":
            out[name] = command[2]
    out["migrate (python -m storage.schema)"] = "import storage.schema"
    out["the parley command (python -m infra.cli)"] = "import infra.cli"
    return out


def module_file(module: str) -> Path | None:
    base = REPO_ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def imported_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # a submodule, if one by that name
    return names


def closure(source: str) -> tuple[set[Path], set[str]]:
    """Our files reached from `source`, and the top-level names of the third-party packages they import."""
    files: set[Path] = set()
    third: set[str] = set()
    seen: set[str] = set()
    pending = imported_names(ast.parse(source), "__main__", False)
    while pending:
        name = pending.pop()
        if not name or name in seen:
            continue
        seen.add(name)
        top = name.split(".")[0]
        if top not in OURS:
            if top not in sys.stdlib_module_names and top != "__future__":
                third.add(top)
            continue
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__, a/b/__init__ too
            pending.add(".".join(parts[:depth]))
        path = module_file(name)
        if path is None or path in files:
            continue
        files.add(path)
        pending |= imported_names(ast.parse(path.read_text()), name, path.name == "__init__.py")
        if name == "processors.__main__":  # it imports the module the pipeline declares for the stage it runs
            pending |= {p.module for p in PROCESSES if p.port}
    return files, third


def test_every_module_an_entrypoint_reaches_is_copied_into_the_image():
    sources = copied()
    assert {"schemas", "safety"} <= set(sources)  # read at run time beside the packages; safety's heads
    for service, source in entrypoints().items():
        files, _ = closure(source)
        assert files, service
        for path in files:
            relative = path.relative_to(REPO_ROOT).as_posix()
            assert any(relative == s or relative.startswith(f"{s}/") for s in sources), (service, relative)


def test_every_package_an_entrypoint_imports_is_installed_in_the_image():
    installed = image_distributions()
    owners = packages_distributions()
    for service, source in entrypoints().items():
        _, third = closure(source)
        for top in third:
            dists = {normalized(d) for d in owners.get(top, [])}
            assert dists, f"{service} imports {top!r}, which no installed distribution provides"
            assert dists & installed, f"{service} imports {top!r} ({', '.join(dists)}), not in the image's lock"


def test_the_image_and_make_install_from_one_lock():
    assert "--require-hashes -r requirements.lock" in DOCKERFILE
    runtime, dev = pins("requirements.lock"), pins("requirements-dev.lock")
    assert runtime and {name: dev.get(name) for name in runtime} == runtime  # same versions, dev adds tools
    assert "--constraint=requirements.lock" in (REPO_ROOT / "requirements-dev.lock").read_text()
    assert "-r requirements-dev.lock" in (REPO_ROOT / "Makefile").read_text()


def test_the_image_runs_as_a_user_and_writes_only_to_its_volume():
    final = DOCKERFILE.rsplit("\nFROM ", 1)[1]
    assert re.search(r"^USER (?!0\b|root\b)\d+", final, re.M)
    assert "LOCAL_INFRA_STATE=/var/lib/parley" in final and 'VOLUME ["/var/lib/parley"]' in final
    assert "PARLEY_HOST=0.0.0.0" in final
    defaults = dict(re.findall(r"^ARG (\w+)=(\S+)", DOCKERFILE, re.M))  # a base may be passed as a build arg
    for line in re.findall(r"^FROM (\S+)", DOCKERFILE, re.M):
        line = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], line)
        assert re.search(r":\d+\.\d+\.\d+", line), f"base image {line} is not pinned to a version"


def test_the_closure_follows_lazy_imports_inside_functions():
    # processors/__main__ imports the stage's module by its declared name: the closure must still reach them all
    files, third = closure("import processors.__main__")
    reached = {p.relative_to(REPO_ROOT).as_posix() for p in files}
    assert {
        "processors/meter_usage.py",
        "processors/remember.py",
        "storage/clickhouse.py",
        "storage/usage.py",
    } <= reached
    assert {"faust", "cassandra", "onnxruntime"} <= third


def test_the_image_has_the_parley_command_run_from_its_sources():
    assert "COPY pyproject.toml ./" in DOCKERFILE  # --version reads it: the package is not installed
    launcher = 'exec python -m infra.cli "$@"'
    assert launcher.replace('"', '\\"') in DOCKERFILE or launcher in DOCKERFILE
    assert "> /usr/local/bin/parley && chmod 755 /usr/local/bin/parley" in DOCKERFILE


def test_the_build_context_lets_through_every_copy_source_and_nothing_of_the_checkout_s_state():
    import fnmatch

    rules = [r for r in (REPO_ROOT / ".dockerignore").read_text().splitlines() if r and not r.startswith("#")]

    def sent(path: str) -> bool:  # .dockerignore's rule: the last matching pattern decides
        keep = True
        for rule in rules:
            negate, pattern = rule.startswith("!"), rule.lstrip("!")
            if fnmatch.fnmatch(path, pattern) or path.startswith(pattern.rstrip("/") + "/"):
                keep = negate
        return keep

    sources = [src for line in re.findall(r"^COPY (?!--from)(.+)$", DOCKERFILE, re.M) for src in line.split()[:-1]]
    assert len(sources) > 20
    for src in sources:
        assert sent(src), f"{src} is copied but not in the build context"
    for state in (".venv/bin/python", ".gpu-check/x", "tests/unit/test_image.py", "api/__pycache__/app.pyc"):
        assert not sent(state), state
