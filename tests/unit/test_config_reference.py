"""The configuration reference cannot drift from :class:`vwserver.config.Config`.

Every key the config file accepts — read from the msgspec Structs, with their wire names, so a
section added to ``Config`` is picked up without touching this test — must be

* in the key column of the README's configuration table, and
* in ``config/example.yaml``, active or commented out (``# key: value`` with the ``#`` at the
  key's indentation, or a block commented out at its start: ``#   key: value``),

and neither may mention a key that ``Config`` does not know.

README key cells are read like a person reads them: backticked keys, ``a/b`` meaning both,
``x.{a,b}`` meaning ``x.a`` and ``x.b``, and a key without a dot meaning a sibling of the row's
first key (```upstream.server`, `caFile``` → ``upstream.caFile``). List items are ``[]``
(``slices[].name``). Keys below a free-form field (``slices[].selector``) are not config keys.
"""

from __future__ import annotations

import re
from pathlib import Path
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


def readme_keys(readme: str) -> set[str]:
    """Keys in the first column of the table under ``## Configuration``."""
    section = readme.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert rows[:2] and rows[0].replace(" ", "") == "|key|meaning|", "config table not found"
    keys: set[str] = set()
    for row in rows[2:]:
        cell = row.split("|")[1]
        tokens = [k for ticked in re.findall(r"`([^`]+)`", cell) for k in ticked.split("/")]
        assert tokens, f"README config row without a key: {row}"
        first = tokens[0]
        sibling_prefix = first.rsplit(".", 1)[0] + "." if "." in first else ""
        for token in tokens:
            token = token.strip()
            if "." not in token and "[" not in token:
                token = sibling_prefix + token
            keys |= _expand_braces(token)
    return keys


def _expand_braces(token: str) -> set[str]:
    m = re.search(r"\{([^}]*)\}", token)
    if m is None:
        return {token}
    return {
        key
        for alt in m.group(1).split(",")
        for key in _expand_braces(token[: m.start()] + alt.strip() + token[m.end() :])
    }


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


def test_readme_table_documents_every_key_and_only_known_keys() -> None:
    documented = readme_keys((REPO / "README.md").read_text())
    missing = sorted(LEAVES - documented)
    unknown = sorted(documented - LEAVES - SECTIONS)
    assert not missing, f"config keys missing from the README table: {missing}"
    assert not unknown, f"README documents keys vwserver.config.Config does not know: {unknown}"


def test_example_yaml_shows_every_key_and_only_known_keys() -> None:
    text = (REPO / "config" / "example.yaml").read_text()
    # the active part is a valid config as it stands, and so is everything commented out
    msgspec.convert(yaml.safe_load(text), Config)
    doc = example_doc(text)
    msgspec.convert(doc, Config)  # unknown or misspelt (even commented-out) keys fail here
    missing = sorted(LEAVES - example_keys(doc))
    assert not missing, f"config keys missing from config/example.yaml: {missing}"


def test_the_checks_catch_drift() -> None:
    readme = (
        "intro\n## Configuration\n\n| key | meaning |\n|---|---|\n"
        "| `upstream.server`, `caFile`, `token`/`tokenFle` | x |\n"
        "| `slices[].export.{cluster,nme}` | y |\n\n## Next\n| `ignored` | z |\n"
    )
    keys = readme_keys(readme)
    assert keys == {
        "upstream.server",
        "upstream.caFile",
        "upstream.token",
        "upstream.tokenFle",
        "slices[].export.cluster",
        "slices[].export.nme",
    }
    assert keys - LEAVES == {"upstream.tokenFle", "slices[].export.nme"}
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
