"""Whether the engines can hold an answer to a JSON schema (pure): a `response_format` json_schema and a tool's
parameters when a call is required.

Both engines compile a schema into a grammar, and the embedded one (llama.cpp) skips what it cannot compile
without a word: a `pattern` with a look-around, `uniqueItems`, `not`... The answer would then not be held to
the schema the client believes it is. So a schema must be valid JSON Schema (jsonschema's meta-schema check)
and use only what llama.cpp's converter enforces (its grammars/README.md lists the rest); anything else is a
400 naming the keyword. SGLang's grammar backends enforce more, but a schema must hold on every pool.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

# Keywords the converter skips or mishandles (llama.cpp grammars/README.md, "known limitations").
UNENFORCED = {
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "$anchor",
    "$dynamicRef",
    "$dynamicAnchor",
    "not",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "dependentRequired",
    "patternProperties",
    "prefixItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "propertyNames",
    "multipleOf",
}
BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
FORMATS = {"date", "time", "date-time", "uuid"}
SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf")
# A regex the grammar cannot express: look-arounds and back-references.
IRREGULAR = re.compile(r"\(\?<?[=!]|\\[1-9]")
MAX_DEPTH = 10


class Unenforceable(ValueError):
    """A schema the engines could not hold an answer to; the message says where and why."""


def check(schema: Any, where: str) -> None:
    """Raise Unenforceable unless `schema` is a JSON schema every engine enforces whole."""
    if not isinstance(schema, dict):
        raise Unenforceable(f"{where} must be a JSON schema object.")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise Unenforceable(f"{where} is not a valid JSON schema: {exc.message}") from None
    for path, node in nodes(schema, where, 0):
        problem = unenforced(node)
        if problem:
            raise Unenforceable(f"{path}: {problem} cannot be enforced while decoding.")


def nodes(schema: dict[str, Any], path: str, depth: int) -> Iterator[tuple[str, dict[str, Any]]]:
    if depth > MAX_DEPTH:
        raise Unenforceable(f"{path}: a schema nested over {MAX_DEPTH} levels cannot be enforced.")
    yield path, schema
    for key in SUBSCHEMA_MAPS:
        for name, sub in (schema.get(key) or {}).items():
            if isinstance(sub, dict):
                yield from nodes(sub, f"{path}.{key}.{name}", depth + 1)
    for key in SUBSCHEMA_LISTS:
        for i, sub in enumerate(schema.get(key) or ()):
            if isinstance(sub, dict):
                yield from nodes(sub, f"{path}.{key}[{i}]", depth + 1)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from nodes(schema[key], f"{path}.{key}", depth + 1)


def unenforced(node: dict[str, Any]) -> str | None:
    """What in this one node the grammar would not hold (None: all of it)."""
    for keyword in UNENFORCED:
        if keyword in node:
            return f"'{keyword}'"
    if BOUNDS & node.keys() and node.get("type") != "integer":
        return "a numeric bound on a non-integer"
    pattern = node.get("pattern")
    if pattern is not None and (
        not pattern.startswith("^") or not pattern.endswith("$") or IRREGULAR.search(pattern)
    ):
        return f"the pattern {pattern!r} (anchored with ^ and $, no look-arounds)"
    if "format" in node and node["format"] not in FORMATS:
        return f"the format '{node['format']}'"
    ref = node.get("$ref")
    if ref is not None and not ref.startswith("#"):
        return f"the remote reference '{ref}'"
    if "properties" in node and ({"anyOf", "oneOf"} & node.keys()):
        return "'properties' beside 'anyOf' or 'oneOf'"
    return None
