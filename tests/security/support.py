"""Helpers shared by the security tests (fuzzing, existence oracle, write race).

Nothing here is a test. The pieces:

* :class:`LogCapture` — every log record emitted while it is installed, to assert that no
  request produced a traceback or an ERROR record;
* :class:`UpstreamRecorder` — the status and body of every response the fake upstream sent, next
  to the requests the fake records itself, so that a test can tell a Status the proxy relayed
  from one it made up;
* :func:`status_problem` — whether an error response is a Kubernetes ``Status``;
* :func:`env_int` — sizes of the bounded tests, overridable from the environment;
* :func:`unselected_lists` — the upstream LISTs that ask kcp for more than a slice's own
  objects (neither the slice's selector nor its holder label in their ``labelSelector``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from aiohttp import web

from fakekcp.upstream import FakeUpstream
from vwserver.logs import formatter
from vwserver.selector import Selector


def env_int(name: str, default: int) -> int:
    """An integer knob from the environment (``VWSERVER_FUZZ_EXAMPLES=50000`` ...)."""
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


class LogCapture(logging.Handler):
    """Collects every record at ``level`` (default WARNING) and above from every logger while
    installed; a level below the root logger's lowers the root's meanwhile, so that records
    at that level are made at all."""

    def __init__(self, level: int = logging.WARNING) -> None:
        super().__init__(level=level)
        self.records: list[logging.LogRecord] = []
        self._root_level: int | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> LogCapture:
        root = logging.getLogger()
        root.addHandler(self)
        if root.getEffectiveLevel() > self.level:
            self._root_level = root.level
            root.setLevel(self.level)
        return self

    def __exit__(self, *exc: object) -> None:
        root = logging.getLogger()
        root.removeHandler(self)
        if self._root_level is not None:
            root.setLevel(self._root_level)
            self._root_level = None

    def rendered(self, since: int = 0) -> list[str]:
        """Each record from index ``since`` as both of vwserver's log formats write it
        (message, fields, traceback), to look for bytes that must never be logged."""
        formats = (formatter("text"), formatter("json"))
        return [f.format(record) for record in self.records[since:] for f in formats]

    def problems(self, since: int = 0) -> list[str]:
        """ERROR (or worse) records and records carrying a traceback, from index ``since``."""
        out = []
        for record in self.records[since:]:
            if record.levelno >= logging.ERROR or record.exc_info or record.stack_info:
                text = f"{record.levelname} {record.name}: {record.getMessage()}"
                if record.exc_info and record.exc_info[1] is not None:
                    error = record.exc_info[1]
                    text += f" [{type(error).__name__}: {error}]"
                out.append(text)
        return out


@dataclass(frozen=True, slots=True)
class UpstreamAnswer:
    method: str
    path: str
    status: int
    body: bytes | None
    """None for streamed responses (lists over 2000 items, watches)."""


@dataclass
class UpstreamRecorder:
    """Records every response of a :class:`FakeUpstream` (install before it starts serving)."""

    answers: list[UpstreamAnswer] = field(default_factory=list)

    def install(self, fake: FakeUpstream) -> None:
        fake.app.on_response_prepare.append(self._record)

    async def _record(self, request: web.Request, response: web.StreamResponse) -> None:
        body = response.body if isinstance(response, web.Response) else None
        self.answers.append(
            UpstreamAnswer(
                request.method,
                request.path,
                response.status,
                body if isinstance(body, bytes) else None,
            )
        )


def status_problem(*, status: int, content_type: str, body: bytes, method: str) -> str | None:
    """None if ``body`` is a well-formed failure ``Status`` for ``status`` (JSON, or YAML when
    the response is YAML, as the apiserver encodes errors in the negotiated format); HEAD
    responses carry no body. Otherwise what is wrong with it."""
    if method.upper() == "HEAD":
        return None if not body else f"HEAD response with a {len(body)}-byte body"
    media = content_type.split(";", 1)[0].strip().lower()
    doc: Any
    try:
        if media == "application/json":
            doc = json.loads(body)
        elif media == "application/yaml":
            doc = yaml.safe_load(body)
        else:
            return f"error body with Content-Type {content_type!r}: {body[:200]!r}"
    except (ValueError, yaml.YAMLError) as e:
        return f"error body is not {media}: {e}: {body[:200]!r}"
    if not isinstance(doc, dict):
        return f"error body is not an object: {body[:200]!r}"
    wanted = {"kind": "Status", "apiVersion": "v1", "status": "Failure"}
    wrong = {k: doc.get(k) for k, v in wanted.items() if doc.get(k) != v}
    if wrong:
        return f"not a failure Status ({wrong}): {body[:200]!r}"
    if doc.get("code") != status:
        return f"Status code {doc.get('code')!r} differs from the HTTP status {status}"
    if not isinstance(doc.get("message", ""), str) or not isinstance(doc.get("reason", ""), str):
        return f"Status message/reason of the wrong type: {body[:200]!r}"
    return None


HOLDS = "sync.edge-connect.eu/holds"


def lookalike(name: str, ns: str) -> dict[str, Any]:
    """Members a custom resource may have (its schema's or preserved unknown fields) that look
    like another representation's — a Table row's ``object``, a Table's ``rows``, a nested
    ``metadata`` — carrying labels every slice matches and the holds annotation's name. The
    object's own metadata is what counts; these must never make it visible."""
    fake = {
        "name": name,
        "namespace": ns,
        "labels": {"env": "prod", "region": "eu"},
        "annotations": {HOLDS: "{}", "kcp.io/cluster": "c1"},
    }
    return {
        "object": {"kind": "PartialObjectMetadata", "metadata": fake},
        "rows": [{"cells": [name], "object": {"metadata": fake}}],
        "type": "ADDED",
    }


def unselected_lists(
    queries: Iterable[Mapping[str, str]], *, slice_selector: Selector, holder: str
) -> list[Mapping[str, str]]:
    """Of the queries of upstream LISTs, those that ask kcp without naming the slice: whose
    ``labelSelector`` lacks one of the slice's selector's requirements and does not require
    the slice's holder label ``holder`` (:func:`vwserver.holds.holder_label`) either. Every
    pass-through LIST must name the slice one way or the other (issue 23): an unfiltered one
    reads the whole export."""
    own = set(slice_selector.requirements)
    held = set(Selector.parse(holder).requirements)
    out: list[Mapping[str, str]] = []
    for query in queries:
        asked = set(Selector.parse(query.get("labelSelector", "")).requirements)
        if not (own and own <= asked) and not held <= asked:
            out.append(query)
    return out
