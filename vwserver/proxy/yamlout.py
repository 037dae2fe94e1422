"""YAML output for clients that ask for ``application/yaml`` — pure, no I/O.

The apiserver answers ``Accept: application/yaml`` with the JSON document converted to YAML
(``sigs.k8s.io/yaml``: map keys sorted, block style). The proxy reads JSON upstream — it must read
what it filters — and converts on the way out. A list is streamed like a JSON list: the keys
before its entries, then each entry as one ``- `` block, then the keys after them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
import yaml

YAML_CONTENT_TYPE = "application/yaml"


def dump(value: Any) -> bytes:
    return yaml.safe_dump(
        value, sort_keys=True, default_flow_style=False, allow_unicode=True
    ).encode()


def json_to_yaml(raw: bytes | msgspec.Raw) -> bytes:
    return dump(msgspec.json.decode(raw))


def list_parts(fields: Mapping[str, Any], *, entries_key: str) -> tuple[bytes, bytes]:
    """What comes before and after a list's entries, for a list of ``fields`` whose entries
    (under ``entries_key``) are streamed in between with :func:`entry`."""
    keys = sorted([*fields, entries_key])
    at = keys.index(entries_key)
    before = b"".join(dump({k: fields[k]}) for k in keys[:at]) + entries_key.encode() + b":\n"
    after = b"".join(dump({k: fields[k]}) for k in keys[at + 1 :])
    return before, after


def empty_list_parts(fields: Mapping[str, Any], *, entries_key: str) -> bytes:
    return dump({**fields, entries_key: []})


def entry(raw: bytes | msgspec.Raw | memoryview) -> bytes:
    """One list entry as a YAML sequence item (``- key: ...``)."""
    return dump([msgspec.json.decode(raw)])
