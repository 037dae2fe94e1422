"""``metadata.managedFields`` for the fake, when asked for (``FakeUpstream(managed_fields=True)``).

The syncer decides ownership from ``managedFields``: a finalizer is its claim only if its own
field manager wrote it, a related copy is its own only if its field manager wrote the owner
label. Tests of those rules against the fake need the entries; other tests compare the fake's
answers with kcp's byte for byte, so the fake writes none unless told to.

A model, not structured-merge-diff: a write with ``fieldManager`` gives that manager one entry
per operation (and subresource) whose ``fieldsV1`` are the fields the request's body sets —
an apply replaces the manager's Apply entry (an applied configuration is the manager's whole
intent), an update adds its fields to the manager's Update entry. Fields are ``f:<name>`` for
object members and ``v:<json>`` for members of ``metadata.finalizers`` (a set-valued list, as
the apiserver keys it); any other list is one leaf. No conflicts, no fields taken from other
managers: the syncer's rules read only which manager wrote what.
"""

from __future__ import annotations

import json
from typing import Any

from fakekcp.store import JSON, now_rfc3339

_NOT_TRACKED = frozenset({"name", "namespace", "uid", "resourceVersion", "managedFields"})


def _fields(value: Any, *, path: tuple[str, ...] = ()) -> JSON:
    if isinstance(value, dict):
        out: JSON = {}
        for key, item in value.items():
            if path == ("metadata",) and key in _NOT_TRACKED:
                continue
            if item is None:  # a merge patch's null removes: not a field set
                continue
            out[f"f:{key}"] = _fields(item, path=(*path, key))
        return out
    if isinstance(value, list) and path == ("metadata", "finalizers"):
        return {f"v:{json.dumps(item)}": {} for item in value}
    return {}


def _merged(a: JSON, b: JSON) -> JSON:
    out = dict(a)
    for key, value in b.items():
        out[key] = _merged(out[key], value) if isinstance(out.get(key), dict) else value
    return out


def track(
    entries: Any,
    *,
    manager: str,
    body: JSON,
    apply: bool,
    subresource: str | None = None,
) -> list[JSON]:
    """``entries`` (an object's ``managedFields``) after ``manager`` wrote ``body``."""
    operation = "Apply" if apply else "Update"
    kept: list[JSON] = []
    previous: JSON = {}
    for entry in entries if isinstance(entries, list) else ():
        mine = (
            isinstance(entry, dict)
            and entry.get("manager") == manager
            and entry.get("operation") == operation
            and entry.get("subresource") == subresource
        )
        if mine:
            previous = entry.get("fieldsV1") or {}
        else:
            kept.append(entry)
    fields = _fields({k: v for k, v in body.items() if k not in ("apiVersion", "kind")})
    if not apply:
        fields = _merged(previous, fields)
    entry = {
        "manager": manager,
        "operation": operation,
        "apiVersion": str(body.get("apiVersion") or ""),
        "time": now_rfc3339(),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }
    if subresource:
        entry["subresource"] = subresource
    return [*kept, entry]
