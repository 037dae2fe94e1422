"""The differential harness: the same request through a slice and directly against kcp's
APIExport virtual workspace with the slice's selector added, compared after normalising what
legitimately differs.

"What kcp would show with the slice's selector" is, per verb:

* LIST and WATCH: kcp's answer to the same request with ``labelSelector`` = the slice's selector
  AND the client's;
* GET of one object: kcp's answer if the object matches the selector, else kcp's NotFound for a
  missing object (kcp has no per-object selector; a slice must not tell the two apart).

Normalised away: resourceVersions and continue tokens (the proxy's pages are other requests),
``remainingItemCount`` (the proxy never sends it: it would count objects outside the slice),
ages in Table cells, and the order of keys and of YAML formatting (YAML is compared parsed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yaml

from vwserver.selector import Selector

_AGE = re.compile(r"^(\d+(\.\d+)?[smhdy])+$|^<invalid>$")
_DROP_KEYS = frozenset({"resourceVersion", "continue", "remainingItemCount"})


@dataclass(frozen=True)
class Case:
    """One request of the table: ``path`` below ``clusters/<cluster>``."""

    id: str
    path: str
    query: Sequence[tuple[str, str]] = ()
    accept: str | None = None
    cluster: str = "*"
    """``*`` or the name of a consumer workspace (resolved to its logical cluster)."""
    single_object: bool = False
    """A GET of one object: compared with kcp's answer filtered by the selector."""
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: Any


def normalise(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items() if k not in _DROP_KEYS}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    if isinstance(value, str) and _AGE.match(value):
        return "<age>"
    return value


def without_annotations(value: Any, keys: frozenset[str]) -> Any:
    """``value`` with the annotations ``keys`` removed from every ``metadata`` in it."""
    if isinstance(value, dict):
        out = {k: without_annotations(v, keys) for k, v in value.items()}
        annotations = (out.get("metadata") or {}).get("annotations")
        if isinstance(annotations, dict):
            kept = {k: v for k, v in annotations.items() if k not in keys}
            out["metadata"] = {**out["metadata"], "annotations": kept}
        return out
    if isinstance(value, list):
        return [without_annotations(v, keys) for v in value]
    return value


def decode(raw: bytes, content_type: str) -> Any:
    if not raw:
        return None
    if "yaml" in content_type:
        return yaml.safe_load(raw)
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def combined_query(query: Sequence[tuple[str, str]], selector: Selector) -> list[tuple[str, str]]:
    """The client's query with the slice's selector ANDed into its labelSelector."""
    out = [(k, v) for k, v in query if k != "labelSelector"]
    client = [v for k, v in query if k == "labelSelector"]
    parts = [selector.render(), *client]
    out.append(("labelSelector", ",".join(p for p in parts if p)))
    return out


def matches(obj: Any, selector: Selector, *, table: bool = False) -> bool:
    """Whether a GET answer shows an object (or PartialObjectMetadata of it; with ``table``, a
    Table of it — the shape the request asked for, never guessed from ``kind``: a custom
    resource may be of kind ``Table``) that the selector matches."""
    if not isinstance(obj, dict):
        return False
    if table:
        rows = obj.get("rows") or []
        return bool(rows) and all(
            selector.matches(((r.get("object") or {}).get("metadata") or {}).get("labels"))
            for r in rows
        )
    return selector.matches((obj.get("metadata") or {}).get("labels"))


async def fetch(
    session: aiohttp.ClientSession,
    url: str,
    *,
    query: Sequence[tuple[str, str]],
    accept: str | None,
    headers: Mapping[str, str],
    token: str,
    rename: tuple[str, str] | None = None,
) -> Answer:
    """GET ``url``; ``rename`` replaces one name by another in the body (a missing object's
    NotFound made to name the foreign object it stands for)."""
    send = {"Authorization": f"Bearer {token}", **headers}
    if accept is not None:
        send["Accept"] = accept
    async with session.get(url, params=list(query), headers=send) as r:
        raw = await r.read()
        content_type = r.headers.get("Content-Type", "").split(";")[0]
    if rename is not None:
        raw = raw.replace(rename[0].encode(), rename[1].encode())
    return Answer(r.status, content_type, normalise(decode(raw, content_type)))
