"""Writes topics/events.py, one TypedDict per record type in schemas/: `python -m topics.events_gen`.

The .avsc files are the source of truth; tests/unit/test_events.py fails when topics/events.py is not what this
writes from them. A field with a default is NotRequired (a writer may leave it out; a reader always gets it,
filled in from the default). A timestamp-millis is an int of epoch milliseconds, as topics.codec reads and
writes it.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from topics.codec import SCHEMA_DIR

TARGET = Path(__file__).resolve().parent / "events.py"
PRIMITIVES = {
    "string": "str",
    "int": "int",
    "long": "int",
    "double": "float",
    "float": "float",
    "boolean": "bool",
}


def short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def render(directory: Path = SCHEMA_DIR) -> str:
    classes: dict[
        str, list[str]
    ] = {}  # record name -> its class's lines, each record once (first definition)
    order: list[str] = []

    def kind(node: Any) -> str:
        if isinstance(node, list):
            parts = [kind(item) for item in node if item != "null"]
            return " | ".join(parts) + (" | None" if "null" in node else "")
        if isinstance(node, str):
            return PRIMITIVES.get(node, short(node))
        if node.get("logicalType") == "timestamp-millis":
            return "int"  # epoch milliseconds
        match node["type"]:
            case "record":
                record(node)
                return short(node["name"])
            case "enum":
                return "Literal[" + ", ".join(json.dumps(s) for s in node["symbols"]) + "]"
            case "array":
                return f"Sequence[{kind(node['items'])}]"
            case "map":
                return f"Mapping[str, {kind(node['values'])}]"
            case other:
                return kind(other)

    def record(schema: dict[str, Any]) -> None:
        name = short(schema["name"])
        if name in classes:
            return
        classes[name] = []  # claimed before its fields, which may define records of their own
        lines = [f"class {name}(TypedDict):"]
        doc = schema.get("doc")
        if doc:
            lines += textwrap.wrap(
                f'"""{doc}"""', 112, initial_indent="    ", subsequent_indent="    "
            )
            lines.append("")
        for field in schema["fields"]:
            typed = kind(field["type"])
            typed = f"ReadOnly[{typed}]"
            lines.append(
                f"    {field['name']}: {f'NotRequired[{typed}]' if 'default' in field else typed}"
            )
        classes[name] = lines
        order.append(name)

    raw = {path.stem: json.loads(path.read_text()) for path in sorted(directory.glob("*.avsc"))}
    for name in (
        "Usage",
        "ChatMessage",
        "Source",
        "ToolUse",
        "PromptAccepted",
        *sorted(raw),
    ):  # referenced ones first
        record(raw[name])
    body = "\n\n\n".join("\n".join(classes[name]) for name in order)
    return (
        '"""The events, one TypedDict per record type, written by topics/events_gen.py from schemas/ (do not edit:\n'
        "run `python -m topics.events_gen`). Every field is read-only (a changed event is a new dict: `{**e, k: v}`);\n"
        "a field with a default may be left out by a writer; a timestamp is an int of epoch milliseconds. No\n"
        '`from __future__ import annotations`: TypedDict reads NotRequired from the evaluated annotations."""\n\n'
        "from collections.abc import Mapping, Sequence\nfrom typing import Literal, NotRequired\n\n"
        "from typing_extensions import ReadOnly, TypedDict\n\n\n" + body + "\n"
    )


def main() -> None:
    TARGET.write_text(render())
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
