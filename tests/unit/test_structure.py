"""The house's shape, as docs/structure.md draws it: packages in layers, each importing only the layers below it,
the three deployables never importing each other, no import circle between modules, no module over 400 lines.

Imports are read from the source (every `import` and `from ... import`, those inside functions too; only those
under `if TYPE_CHECKING:` are left out, as they never run)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Lowest first. A package may import its own modules and those of any lower layer, never a higher or equal one.
LAYERS = (
    ("topics",),  # the contract: topics, their schemas' codec, the errors a record can carry
    ("runtime",),  # every process's plumbing: Kafka clients and tables, settings, traces, logs, the engine process
    ("registry", "admission"),  # the schema registry; admission's limits, placement and slots
    ("storage", "safety"),  # the stores (Cassandra, ClickHouse, the log's run histories); the safety models
    ("conversation",),  # a chat's context: tokens, assembly, gathering from the stores
    ("api", "processors", "inference"),  # the deployables: the edge, the stages, the inference consumers
    ("replay",),  # replay, evals and exports over the log
    ("infra",),  # the CLI and the local stack
)
LEVEL = {package: level for level, names in enumerate(LAYERS) for package in names}
MAX_LINES = 400


def modules() -> dict[str, Path]:
    found = {}
    for package in LEVEL:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ours a module imports at run time."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:  # `from pkg import module` names a module; `from module import name` the module
                found.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in known and m.split(".")[0] in LEVEL}


GRAPH = {name: imports(path, modules()) - {name} for name, path in modules().items()}


def test_no_package_module_is_over_400_lines():
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not over, over
    assert max(sizes.values()) <= MAX_LINES


def test_no_bench_test_or_chat_app_file_is_over_400_lines_either():
    files = [
        *ROOT.glob("bench/*.py"),
        *ROOT.glob("tests/**/*.py"),
        *ROOT.glob("web/src/*.js"),
        *ROOT.glob("web/test/*.js"),
    ]
    over = {str(f.relative_to(ROOT)): n for f in files if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert files and not over, over


@pytest.mark.parametrize("package", sorted(LEVEL))
def test_a_package_imports_only_the_layers_below_it(package):
    upward = sorted(
        f"{source} -> {target}"
        for source, targets in GRAPH.items()
        if source.split(".")[0] == package
        for target in targets
        if target.split(".")[0] != package and LEVEL[target.split(".")[0]] >= LEVEL[package]
    )
    assert not upward, upward


def test_the_deployables_never_import_each_other():
    deployables = {"api", "processors", "inference"}
    crossing = [
        f"{s} -> {t}"
        for s, ts in GRAPH.items()
        for t in ts
        if {s.split(".")[0], t.split(".")[0]} <= deployables and s.split(".")[0] != t.split(".")[0]
    ]
    assert not crossing, crossing


def test_no_import_circle_between_modules():
    """Tarjan's strongly connected components over the module graph: any of more than one module is a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in GRAPH:
        if node not in index:
            connect(node)
    assert not circles, circles


def test_the_map_names_every_package_and_module():
    """docs/structure.md is the map a reader finds each concept's owner in: every module is on it."""
    text = (ROOT / "docs" / "structure.md").read_text()
    missing = [
        f"{name.replace('.', '/')}.py"
        for name, path in modules().items()
        if path.name not in ("__init__.py", "__main__.py") and f"{name.replace('.', '/')}.py" not in text
    ]
    assert not missing, missing
