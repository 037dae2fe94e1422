#!/usr/bin/env python3
"""Write the configuration reference of the docs site from the config Structs themselves.

The Structs are the one source of every key: its name on the wire (msgspec's ``encode_name``),
its type and its default come from ``msgspec.inspect``, its description from the field's
*attribute docstring* — the string literal right after the field, the convention Sphinx, pdoc
and griffe read (PEP 257 calls it an attribute docstring). A section's introduction is its
Struct's class docstring. So a key added to a Struct appears in the reference by running this
script, and ``--check`` (run by tests/unit/test_config_reference.py) fails when the committed
pages are not what the Structs say or when a field has no description.

    scripts/gen-config-docs.py           # (re)write docs/reference/*-config.md
    scripts/gen-config-docs.py --check   # exit 1 naming what is stale or undocumented
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vwserver.config import Config  # noqa: E402
from vwserver.syncer.config import SyncerConfig  # noqa: E402

PAGES: dict[str, tuple[type[msgspec.Struct], str, str]] = {
    "docs/reference/serve-config.md": (
        Config,
        "vwserver serve settings",
        "The file `vwserver serve --config FILE` reads (`vwserver check-config --config FILE` "
        "validates it only); `config/example.yaml` is an annotated example.",
    ),
    "docs/reference/sync-config.md": (
        SyncerConfig,
        "vwserver sync settings",
        "The file `vwserver sync --config FILE` reads (`--check` validates it only); "
        "`config/syncer.example.yaml` is an annotated example.",
    ),
}


def attribute_docstrings(cls: type) -> dict[str, str]:
    """Field name → its attribute docstring, for ``cls`` and the classes it inherits from."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__ in ("builtins", "msgspec"):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        node = ast.parse(source).body[0]
        assert isinstance(node, ast.ClassDef)
        body = node.body
        for stmt, following in zip(body, [*body[1:], None], strict=True):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                found[stmt.target.id] = following.value.value
    return found


def markdown(text: str) -> str:
    """A docstring as one Markdown table cell: reST ``literals`` as `code`, one line."""
    text = re.sub(r"``([^`]+)``", r"`\1`", inspect.cleandoc(text))
    return " ".join(text.split()).replace("|", "\\|")


def type_name(t: msgspec.inspect.Type) -> str:
    mi = msgspec.inspect
    if isinstance(t, mi.UnionType):
        parts = [type_name(x) for x in t.types if not isinstance(x, mi.NoneType)]
        return " or ".join(parts)
    if isinstance(t, mi.LiteralType):
        return " \\| ".join(f"`{v}`" for v in t.values)
    if isinstance(t, mi.ListType):
        return f"list of {type_name(t.item_type)}"
    if isinstance(t, mi.StructType):
        return "section"
    if isinstance(t, mi.DictType):
        return "mapping"
    if isinstance(t, mi.Metadata):
        return type_name(t.type)
    return {
        mi.StrType: "string",
        mi.IntType: "integer",
        mi.FloatType: "number",
        mi.BoolType: "boolean",
        mi.AnyType: "any",
    }.get(type(t), type(t).__name__)


def default_text(field: msgspec.inspect.Field) -> str:
    if field.required:
        return "required"
    value: Any = field.default
    if value is msgspec.NODEFAULT:
        value = field.default_factory()
    if isinstance(value, msgspec.Struct):
        return "see below"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{msgspec.json.encode(value).decode()}`"


def nested_struct(t: msgspec.inspect.Type) -> msgspec.inspect.StructType | None:
    """The Struct a field's type opens as a section (``x``, ``x | None``, ``list[x]``)."""
    mi = msgspec.inspect
    if isinstance(t, mi.UnionType):
        inner = [x for x in t.types if not isinstance(x, mi.NoneType)]
        return nested_struct(inner[0]) if len(inner) == 1 else None
    if isinstance(t, mi.ListType):
        return nested_struct(t.item_type)
    return t if isinstance(t, mi.StructType) else None


@dataclass
class Section:
    path: str
    struct: msgspec.inspect.StructType


def render(root: type[msgspec.Struct], title: str, intro: str) -> tuple[str, list[str]]:
    """(the page, the keys without a description)."""
    info = msgspec.inspect.type_info(root)
    assert isinstance(info, msgspec.inspect.StructType)
    undocumented: list[str] = []
    out = [
        "<!-- Generated by scripts/gen-config-docs.py from the config Structs: edit their",
        "     attribute docstrings, then run the script (tests/unit/test_config_reference.py). -->",
        f"# {title}",
        "",
        intro,
        "",
        "Keys are camelCase; an unknown key or a value of the wrong type is an error naming its",
        "path (`$.slices[0].selector`), and nothing is half-applied.",
    ]
    queue = [Section("", info)]
    while queue:
        section = queue.pop(0)
        docs = attribute_docstrings(section.struct.cls)
        out += ["", f"## `{section.path}`" if section.path else "## Top level", ""]
        if section.path and section.struct.cls.__doc__:
            out += [markdown(section.struct.cls.__doc__), ""]
        out += ["| key | type | default | meaning |", "|---|---|---|---|"]
        children: list[Section] = []
        for field in section.struct.fields:
            key = f"{section.path}.{field.encode_name}" if section.path else field.encode_name
            description = docs.get(field.name)
            if not description:
                undocumented.append(key)
            nested = nested_struct(field.type)
            shown = key
            if nested is not None:
                is_list = isinstance(field.type, msgspec.inspect.ListType)
                children.append(Section(key + ("[]" if is_list else ""), nested))
            out.append(
                f"| `{shown}` | {type_name(field.type)} | {default_text(field)} "
                f"| {markdown(description or '')} |"
            )
        queue = children + queue
    return "\n".join(out) + "\n", undocumented


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    problems: list[str] = []
    for relative, (root, title, intro) in PAGES.items():
        page, undocumented = render(root, title, intro)
        problems += [f"{root.__name__}: {key}: no attribute docstring" for key in undocumented]
        path = REPO / relative
        if args.check:
            if not path.exists() or path.read_text() != page:
                problems.append(f"{relative} is stale: run scripts/gen-config-docs.py")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(page)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
