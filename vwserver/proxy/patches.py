"""Merge patches (RFC 7386) and JSON patches (RFC 6902) applied the way kcp applies them.

Why: a guarded patch must know the patched object before it is written (is it still in the
slice? does it drop a held finalizer?). Asking kcp with a ``dryRun=All`` round trip costs a
second upstream write; computing the result here costs nothing — provided the result is kcp's,
bit for bit where membership is concerned. So this module reproduces kcp's patch mechanism, not
the RFCs: where kcp deviates from them, this module deviates the same way.

Pure: decoded JSON in (``dict``/``list``/``str``/``int``/``float``/``bool``/``None``), decoded
JSON out, no I/O; a patch kcp would refuse raises :class:`PatchError` with the code and reason
kcp answers for it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from vwserver.errors import RequestError

__all__ = ["PatchError", "apply_json_patch", "apply_merge_patch"]


class PatchError(RequestError):
    """A patch kcp refuses before validating the result: the code and reason of kcp's Status.

    422 ``Invalid`` for a JSON patch that does not apply (missing path, bad index, failed
    ``test``); 400 ``BadRequest`` for a patch that is no patch at all; 413 for too many
    operations. The message is kcp's where it is known.
    """

    code: ClassVar[int] = 422
    reason: ClassVar[str] = "Invalid"


def apply_merge_patch(document: Any, patch: Any) -> Any:
    """``document`` with the JSON merge patch ``patch`` applied (RFC 7386 as kcp applies it)."""
    if not isinstance(patch, dict):
        return patch
    target = dict(document) if isinstance(document, dict) else {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = apply_merge_patch(target.get(key), value)
    return target


def apply_json_patch(document: Any, operations: list[Any]) -> Any:
    """``document`` with the JSON patch ``operations`` applied (RFC 6902 as kcp applies it)."""
    import copy

    doc = copy.deepcopy(document)
    for i, op in enumerate(operations):
        doc = _apply_one(doc, op, i)
    return doc


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]


def _apply_one(doc: Any, op: dict[str, Any], i: int) -> Any:
    import copy

    kind = op.get("op")
    path = _tokens(op.get("path", ""))
    if kind == "test":
        if _get(doc, path) != op.get("value"):
            raise PatchError(f"testing value {op.get('path')} failed")
        return doc
    if kind in ("add", "replace"):
        return _put(doc, path, copy.deepcopy(op.get("value")), insert=kind == "add")
    if kind == "remove":
        return _remove(doc, path)
    if kind in ("copy", "move"):
        source = _tokens(op.get("from", ""))
        value = copy.deepcopy(_get(doc, source))
        if kind == "move":
            doc = _remove(doc, source)
        return _put(doc, path, value, insert=True)
    raise PatchError(f"Unexpected kind: {kind}")


def _get(doc: Any, path: list[str]) -> Any:
    for token in path:
        if isinstance(doc, dict) and token in doc:
            doc = doc[token]
        elif isinstance(doc, list) and token.isdigit() and int(token) < len(doc):
            doc = doc[int(token)]
        else:
            raise PatchError(f"doc is missing path: {'/'.join(path)}")
    return doc


def _put(doc: Any, path: list[str], value: Any, *, insert: bool) -> Any:
    if not path:
        return value
    parent = _get(doc, path[:-1])
    key = path[-1]
    if isinstance(parent, dict):
        parent[key] = value
    elif isinstance(parent, list):
        if key == "-" and insert:
            parent.append(value)
        elif key.isdigit() and int(key) <= len(parent) - (0 if insert else 1):
            if insert:
                parent.insert(int(key), value)
            else:
                parent[int(key)] = value
        else:
            raise PatchError(f"Unable to access invalid index: {key}")
    else:
        raise PatchError(f"doc is missing path: {'/'.join(path)}")
    return doc


def _remove(doc: Any, path: list[str]) -> Any:
    if not path:
        raise PatchError("doc is missing path")
    parent = _get(doc, path[:-1])
    key = path[-1]
    if isinstance(parent, dict) and key in parent:
        del parent[key]
    elif isinstance(parent, list) and key.isdigit() and int(key) < len(parent):
        del parent[int(key)]
    else:
        raise PatchError(f"Unable to remove nonexistent key: {key}")
    return doc
