"""The configuration reference cannot drift from :class:`vwserver.config.Config`.

The reference pages of the docs site (``docs/reference/*-config.md``) are generated from the
config Structs by ``scripts/gen-config-docs.py`` (key names, types, defaults and the fields'
attribute docstrings): they must be current, every field must have a description, and they must
list every key the file accepts — read from the msgspec Structs, with their wire names, so a
section added to ``Config`` is picked up without touching this test. Every key must also be

* in ``config/example.yaml``, active or commented out (``# key: value`` with the ``#`` at the
  key's indentation, or a block commented out at its start: ``#   key: value``),

and the example may not mention a key that ``Config`` does not know. List items are ``[]``
(``slices[].name``). Keys below a free-form field (``slices[].selector``) are not config keys.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import pytest
import yaml

from vwserver.config import Config

REPO = Path(__file__).resolve().parents[2]


def schema_keys(t: msgspec.inspect.Type, prefix: str = "") -> tuple[set[str], set[str]]:
    """(leaf keys, section keys) of a Struct type, as wire-name paths."""
    leaves: set[str] = set()
    sections: set[str] = set()
    if isinstance(t, msgspec.inspect.UnionType):
        inner = [x for x in t.types if not isinstance(x, msgspec.inspect.NoneType)]
        nested = [
            x for x in inner if isinstance(x, msgspec.inspect.StructType | msgspec.inspect.ListType)
        ]
        t = nested[0] if len(inner) == 1 and nested else t
    if isinstance(t, msgspec.inspect.ListType) and isinstance(
        t.item_type, msgspec.inspect.StructType
    ):
        sections.add(prefix)
        sub_leaves, sub_sections = schema_keys(t.item_type, prefix + "[]")
        return sub_leaves, sections | sub_sections
    if isinstance(t, msgspec.inspect.StructType):
        if prefix:
            sections.add(prefix)
        dot = "." if prefix else ""
        for f in t.fields:
            sub_leaves, sub_sections = schema_keys(f.type, f"{prefix}{dot}{f.encode_name}")
            leaves |= sub_leaves
            sections |= sub_sections
        return leaves, sections
    return {prefix}, set()


LEAVES, SECTIONS = schema_keys(msgspec.inspect.type_info(Config))


_COMMENTED_KEY = re.compile(r"^(\s*)#(\s*)([A-Za-z][A-Za-z0-9]*:(\s.*)?)$")


def _uncomment(line: str) -> str:
    """``  # key: v`` → ``  key: v``; ``#   key: v`` → ``  key: v`` (a commented-out block)."""
    m = _COMMENTED_KEY.match(line)
    if m is None:
        return line
    return " " * (len(m[1]) + max(len(m[2]) - 1, 0)) + m[3]


def example_doc(text: str) -> Any:
    """The example with commented-out keys made active in place."""
    return yaml.safe_load("\n".join(_uncomment(line) for line in text.splitlines()))


def example_keys(value: Any, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    if not isinstance(value, dict):
        return keys
    for key, sub in value.items():
        path = f"{prefix}{key}"
        keys.add(path)
        if path in SECTIONS:
            items = sub if isinstance(sub, list) else [sub]
            nested = f"{path}[]." if isinstance(sub, list) else f"{path}."
            for item in items:
                keys |= example_keys(item, nested)
    return keys


def test_schema_walk_sees_nested_sections_and_wire_names() -> None:
    assert {"listen.port", "tls.certFile", "externalURL", "slices[].upstreamURL"} <= LEAVES
    assert {"slices[].export.cluster", "upstream.insecureSkipTlsVerify"} <= LEAVES
    assert {"listen", "tls", "upstream", "slices", "slices[].export"} <= SECTIONS
    assert "slices[].selector" in LEAVES  # free-form: its content is not a config key


GENERATOR = REPO / "scripts" / "gen-config-docs.py"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_docs", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def reference_keys(page: str) -> set[str]:
    """Keys in the first column of the generated reference's tables."""
    return {
        m[1] for m in re.finditer(r"^\| `([^`]+)` \|", page, flags=re.MULTILINE) if m[1] != "key"
    }


def test_generated_reference_is_current_and_describes_every_key() -> None:
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_reference_lists_every_key_and_only_known_keys() -> None:
    documented = reference_keys((REPO / "docs" / "reference" / "serve-config.md").read_text())
    assert not sorted(LEAVES - documented), "config keys missing from the reference"
    assert not sorted(documented - LEAVES - SECTIONS), "the reference names unknown keys"


class _Inner(msgspec.Struct, rename="camel"):
    """An inner section."""

    some_key: int = 3
    """Described."""
    other_key: str | None = None


class _Root(msgspec.Struct, rename="camel"):
    inner: _Inner = msgspec.field(default_factory=_Inner)
    """The section."""


def test_the_generator_reports_an_undocumented_field() -> None:
    page, undocumented = _generator().render(_Root, "Title", "Intro.")
    assert undocumented == ["inner.otherKey"]
    assert "| `inner.someKey` | integer | `3` | Described. |" in page
    assert reference_keys(page) == {"inner", "inner.someKey", "inner.otherKey"}


def test_example_yaml_shows_every_key_and_only_known_keys() -> None:
    text = (REPO / "config" / "example.yaml").read_text()
    # the active part is a valid config as it stands, and so is everything commented out
    msgspec.convert(yaml.safe_load(text), Config)
    doc = example_doc(text)
    msgspec.convert(doc, Config)  # unknown or misspelt (even commented-out) keys fail here
    missing = sorted(LEAVES - example_keys(doc))
    assert not missing, f"config keys missing from config/example.yaml: {missing}"


def test_the_checks_catch_drift() -> None:
    doc = example_doc("upstream:\n  # server: https://kcp\n  # tokenFlie: t\n")
    assert doc == {"upstream": {"server": "https://kcp", "tokenFlie": "t"}}
    block = "# listen:\n#   host: h   # a comment: not a key\n#   # prose: neither\n"
    assert example_doc(block) == {"listen": {"host": "h"}}
    with pytest.raises(msgspec.ValidationError, match="tokenFlie"):
        msgspec.convert(doc, Config)
    assert example_keys({"slices": [{"export": {"cluster": "c"}, "selector": {"a": 1}}]}) == {
        "slices",
        "slices[].export",
        "slices[].export.cluster",
        "slices[].selector",
    }
