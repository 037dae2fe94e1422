"""Log output of ``vwserver serve`` and ``vwserver sync`` (:func:`configure_logging`, from each
file's ``logLevel``/``logFormat``): one JSON object per line (``logFormat: json``) or text.

Why JSON: in a cluster the logs go to a collector that indexes fields, so the request line
(:data:`ACCESS_LOGGER`, written by :mod:`vwserver.proxy.handler`) carries slice, verb, user, code,
duration and request id as fields rather than as words in a sentence. Every line logged while a
request is being served carries that request's id (a context variable set by the proxy), so a
warning such as "watch ended" can be tied to its request line.

What never goes into a log: tokens and object contents. The proxy logs paths without their query
string, the authenticated user name (never a credential), and error messages that name objects at
most; the tests check a request with a token and a body against the output of both formats. Nor
does a byte of a malformed request: aiohttp's HTTP parser errors quote the line they stopped at
(once ``Authorization: Bearer …``). :mod:`vwserver.listener` answers and logs those itself, and
:class:`ParserErrorScrubber` keeps any such error that still reaches aiohttp's own loggers down
to its class name.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal

from aiohttp.http_exceptions import HttpProcessingError

LogFormat = Literal["json", "text"]

ACCESS_LOGGER = "vwserver.access"
"""The logger of the one line per slice request."""

REQUEST_ID: ContextVar[str | None] = ContextVar("vwserver_request_id", default=None)
"""The id of the request being served in this task (None outside requests)."""

FIELDS_ATTR = "vwserver_fields"
"""Attribute of a LogRecord (``extra={FIELDS_ATTR: {...}}``) with fields for the JSON output."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "msg", "worker"?, "requestId"?, <fields>..., "exc"?}`` per
    line (``worker``: the process's index among ``vwserver serve --workers``)."""

    def __init__(self, *, worker: int | None = None) -> None:
        super().__init__()
        self._worker = worker

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self._worker is not None:
            doc["worker"] = self._worker
        request_id = REQUEST_ID.get()
        if request_id is not None:
            doc["requestId"] = request_id
        fields = getattr(record, FIELDS_ATTR, None)
        if fields:
            doc.update(fields)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


class ParserErrorScrubber(logging.Filter):
    """Rewrites a record carrying an HTTP parser error to name only the error's class: its
    message and traceback quote request bytes."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            record.msg = "malformed HTTP request (%s); its bytes are not logged"
            record.args = (type(error).__name__,)
            record.exc_info = record.exc_text = None
        return True


SCRUBBER = ParserErrorScrubber()
AIOHTTP_LOGGERS = ("aiohttp.server", "aiohttp.web", "aiohttp.internal", "aiohttp.access")


def scrub_aiohttp_logs() -> None:
    """Put :data:`SCRUBBER` on aiohttp's server-side loggers (idempotent)."""
    for name in AIOHTTP_LOGGERS:
        logging.getLogger(name).addFilter(SCRUBBER)


def formatter(fmt: LogFormat, *, worker: int | None = None) -> logging.Formatter:
    """``worker``: one of several processes of ``vwserver serve``, named on every line."""
    if fmt == "json":
        return JsonFormatter(worker=worker)
    if worker is None:
        return logging.Formatter(TEXT_FORMAT)
    return logging.Formatter(TEXT_FORMAT.replace("%(name)s", f"[worker {worker}] %(name)s"))


def configure_logging(*, level: str, fmt: LogFormat, worker: int | None = None) -> None:
    """Log to stderr at ``level`` in ``fmt``, replacing any handler configured before
    (``worker``: see :func:`formatter`)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt, worker=worker))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
