"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902) for the fake upstream.

The fake upstream has to apply PATCH bodies itself because it *is* the apiserver in tests. These
two functions reproduce what ``k8s.io/apiserver/pkg/endpoints/handlers/patch.go`` gets from
``github.com/evanphx/json-patch``: merge patches replace non-object values wholesale and delete
keys set to ``null``; JSON patches are applied operation by operation and stop at the first one
that does not apply (including a failing ``test``). Both work on documents that the caller owns —
the fake always hands in a fresh copy of the stored object — and never touch their inputs' nested
values in place.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["PatchError", "apply_json_patch", "apply_merge_patch"]


class PatchError(Exception):
    """A patch could not be applied.

    ``malformed`` is true when the patch document itself is unusable (the apiserver answers 400),
    false when it is well-formed but does not apply to this object (422).
    """

    def __init__(self, message: str, *, malformed: bool) -> None:
        super().__init__(message)
        self.malformed = malformed


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def _pointer(path: object) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(f"invalid JSON pointer {path!r}", malformed=True)
    if not path:
        return []
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _index(container: list[Any], token: str, *, allow_end: bool) -> int:
    if allow_end and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"invalid array index {token!r}", malformed=False)
    index = int(token)
    limit = len(container) if allow_end else len(container) - 1
    if index > limit:
        raise PatchError(f"array index {index} out of bounds", malformed=False)
    return index


def _parent(doc: Any, parts: list[str]) -> Any:
    node = doc
    for token in parts[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f"doc is missing path: {token!r}", malformed=False)
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, allow_end=False)]
        else:
            raise PatchError(f"cannot traverse into a scalar at {token!r}", malformed=False)
    return node


def _get(doc: Any, parts: list[str]) -> Any:
    if not parts:
        return doc
    parent = _parent(doc, parts)
    token = parts[-1]
    if isinstance(parent, dict):
        if token not in parent:
            raise PatchError(f"doc is missing key: {token!r}", malformed=False)
        return parent[token]
    if isinstance(parent, list):
        return parent[_index(parent, token, allow_end=False)]
    raise PatchError("cannot read from a scalar", malformed=False)


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _parent(doc, parts)
    token = parts[-1]
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, allow_end=True), value)
    else:
        raise PatchError("cannot add to a scalar", malformed=False)
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        raise PatchError("cannot remove the whole document", malformed=False)
    parent = _parent(doc, parts)
    token = parts[-1]
    if isinstance(parent, dict):
        if token not in parent:
            raise PatchError(f"doc is missing key: {token!r}", malformed=False)
        return parent.pop(token)
    if isinstance(parent, list):
        return parent.pop(_index(parent, token, allow_end=False))
    raise PatchError("cannot remove from a scalar", malformed=False)


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: unlike Python's ``==``, ``true`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def apply_json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 ``add``/``remove``/``replace``/``move``/``copy``/``test``, in order."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations", malformed=True)
    for operation in operations:
        if not isinstance(operation, dict) or not isinstance(operation.get("op"), str):
            raise PatchError("each JSON patch operation needs an 'op'", malformed=True)
        op = operation["op"]
        parts = _pointer(operation.get("path"))
        if op in ("add", "replace", "test") and "value" not in operation:
            raise PatchError(f"{op} operation has no value", malformed=True)
        if op == "add":
            doc = _add(doc, parts, copy.deepcopy(operation["value"]))
        elif op == "remove":
            _remove(doc, parts)
        elif op == "replace":
            _get(doc, parts)  # replace requires the target to exist (RFC 6902 4.3)
            if parts:
                _remove(doc, parts)
            doc = _add(doc, parts, copy.deepcopy(operation["value"]))
        elif op == "move":
            source = _pointer(operation.get("from"))
            value = _remove(doc, source) if source else doc
            doc = _add(doc, parts, value)
        elif op == "copy":
            source = _pointer(operation.get("from"))
            doc = _add(doc, parts, copy.deepcopy(_get(doc, source)))
        elif op == "test":
            if not _json_equal(_get(doc, parts), operation["value"]):
                raise PatchError(f"testing value {operation['path']} failed", malformed=False)
        else:
            raise PatchError(f"unexpected kind of JSON patch operation {op!r}", malformed=True)
    return doc
