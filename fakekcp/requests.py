"""Request decoding for the fake upstream, and the refusals of kcp's virtual workspace.

Everything a handler needs to know before touching the store: the resolved target of a resource
request (the apiserver's RequestInfo plus kcp's cluster), the decoded and validated ListOptions
(with the exact 422s of ``ValidateListOptions``), dry-run flags, and the Status bodies kcp answers
when it refuses a request outright (wildcard writes, APIBinding writes, unbound clusters). Also
the fault-injection switches, because they are read per request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Final, Protocol

from aiohttp import web
from multidict import CIMultiDictProxy, MultiMapping

from fakekcp.status import FakeApiError, bad_request, invalid, status_error
from fakekcp.store import JSON, ResourceSpec
from vwserver.errors import SelectorError
from vwserver.selector import Selector

# The user named in 403 messages; the fake does not authenticate callers.
USER: Final = "kcp-admin"


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the fake received it (what the proxy forwarded)."""

    method: str
    path: str
    query: dict[str, str]
    headers: CIMultiDictProxy[str]
    body: bytes


@dataclass
class Faults:
    """Fault-injection switches, read on every request (and on every write of a watch)."""

    unreachable: bool = False  # close the connection without answering
    status_code: int | None = None  # answer every request with this code and a Status body
    delay: float = 0.0  # seconds to wait before answering
    garbage: bool = False  # non-JSON list bodies; a non-JSON line, then the end, in watches
    die_mid_watch_after: int | None = None  # break each watch (no last chunk) after N events
    ignore_selectors: bool = False  # an upstream that does not filter by labelSelector
    # A shard mix-up: reads of one logical cluster answered with objects of every cluster and
    # namespace (lists, watches; a GET with another object of the resource than the one named).
    ignore_scope: bool = False
    # A shard mix-up on writes: each write is carried out as asked, but answered with the object
    # moved out of the request's scope — "cluster" (another kcp.io/cluster), "namespace" or
    # "name" (another name, "foreign-" before it) ("": off); a dry run too unless
    # foreign_dry_runs is False. A DELETE answers with the object even once it is gone.
    foreign_answers: str = ""
    foreign_dry_runs: bool = True
    requests: list[RecordedRequest] = field(default_factory=list)

    def reset(self) -> None:
        """Switch every fault off and forget the recorded requests."""
        self.unreachable = self.garbage = self.ignore_selectors = self.ignore_scope = False
        self.status_code = self.die_mid_watch_after = None
        self.foreign_answers = ""
        self.foreign_dry_runs = True
        self.delay = 0.0
        self.requests.clear()


class UpstreamSettings(Protocol):
    """What the handlers read from the fake upstream that owns them (its switches and state).

    :class:`fakekcp.upstream.FakeUpstream` provides it; the handlers depend on this protocol
    instead of that class, so the modules import in one direction (upstream → http → watch).
    """

    faults: Faults
    gzip: bool
    bookmark_interval: float
    managed_fields: bool

    @property
    def base_path(self) -> str: ...

    def is_bound(self, cluster: str) -> bool: ...


@dataclass(slots=True)
class Target:
    """A resolved resource request (k8s RequestInfo, plus kcp's cluster)."""

    spec: ResourceSpec
    cluster: str | None  # None: the ``*`` wildcard
    namespace: str | None
    name: str | None
    subresource: str | None
    verb: str


@dataclass(slots=True)
class ListOptions:
    """metav1.ListOptions after decoding, validation and WatchList defaulting."""

    selector: Selector | None
    fields: list[tuple[str, bool, str]]
    limit: int
    continue_token: str
    rv: str
    rv_match: str
    timeout: float | None
    bookmarks: bool
    initial_events: bool | None

    @property
    def unfiltered(self) -> bool:
        return self.selector is None and not self.fields


def flag(query: MultiMapping[str], name: str) -> bool | None:
    """runtime.Convert_Slice_string_To_bool: absent → None, "0"/"false" → False, else True."""
    if name not in query:
        return None
    value = str(query[name])
    return not (value == "0" or value.lower() == "false")


def _integer(query: MultiMapping[str], name: str) -> int:
    try:
        return int(query.get(name) or 0)
    except ValueError:
        raise bad_request(f'{name}: invalid value "{query.get(name)}"') from None


def _parse_fields(text: str) -> list[tuple[str, bool, str]]:
    """fields.ParseSelector for the only field labels CRDs support (metadata.name/namespace)."""
    terms: list[tuple[str, bool, str]] = []
    parts: list[str] = []
    start, escaped = 0, False
    for i, char in enumerate(text):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ",":
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    for part in filter(None, parts):
        for op in ("!=", "==", "="):
            lhs, found, rhs = part.partition(op)
            if found:
                break
        else:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        if lhs not in ("metadata.name", "metadata.namespace"):
            raise bad_request(f"field label not supported: {lhs}")
        value = rhs.replace("\\,", ",").replace("\\=", "=").replace("\\\\", "\\")
        terms.append((lhs, op != "!=", value))
    return terms


def parse_list_options(query: MultiMapping[str], *, watch: bool) -> ListOptions:
    """Decode and validate ListOptions like handlers.listOpts + ValidateListOptions."""
    label_text = query.get("labelSelector", "")
    try:
        selector = Selector.parse(label_text) if label_text.strip() else None
    except SelectorError as e:
        raise bad_request(str(e)) from None
    opts = ListOptions(
        selector=selector,
        fields=_parse_fields(query.get("fieldSelector", "")),
        limit=_integer(query, "limit"),
        continue_token=query.get("continue", ""),
        rv=query.get("resourceVersion", ""),
        rv_match=query.get("resourceVersionMatch", ""),
        timeout=float(_integer(query, "timeoutSeconds")) or None,
        bookmarks=bool(flag(query, "allowWatchBookmarks")),
        initial_events=flag(query, "sendInitialEvents"),
    )
    causes: list[tuple[str, str, str]] = []
    match = opts.rv_match
    if watch:
        if opts.initial_events is not None and match != "NotOlderThan":
            causes.append(
                (
                    "FieldValueForbidden",
                    "resourceVersionMatch",
                    "Forbidden: sendInitialEvents requires setting resourceVersionMatch to "
                    "NotOlderThan",
                )
            )
        if match:
            if opts.initial_events is None:
                causes.append(
                    (
                        "FieldValueForbidden",
                        "resourceVersionMatch",
                        "Forbidden: resourceVersionMatch is forbidden for watch unless "
                        "sendInitialEvents is provided",
                    )
                )
            if match != "NotOlderThan":
                causes.append(
                    (
                        "FieldValueNotSupported",
                        "resourceVersionMatch",
                        f'Unsupported value: "{match}": supported values: "NotOlderThan"',
                    )
                )
        # SetListOptionsDefaults with WatchList on (kcp's default): a legacy watch from "" or "0"
        # becomes a watch-list that streams the current state first.
        if opts.initial_events is None and not match and opts.rv in ("", "0"):
            opts.initial_events = True
            opts.rv_match = "NotOlderThan"
    else:
        if match:
            if not opts.rv:
                causes.append(
                    (
                        "FieldValueForbidden",
                        "resourceVersionMatch",
                        "Forbidden: resourceVersionMatch is forbidden unless resourceVersion "
                        "is provided",
                    )
                )
            if opts.continue_token:
                causes.append(
                    (
                        "FieldValueForbidden",
                        "resourceVersionMatch",
                        "Forbidden: resourceVersionMatch is forbidden when continue is provided",
                    )
                )
            if match not in ("Exact", "NotOlderThan"):
                causes.append(
                    (
                        "FieldValueNotSupported",
                        "resourceVersionMatch",
                        f'Unsupported value: "{match}": '
                        'supported values: "Exact", "NotOlderThan", ""',
                    )
                )
            if match == "Exact" and opts.rv == "0":
                causes.append(
                    (
                        "FieldValueForbidden",
                        "resourceVersionMatch",
                        'Forbidden: resourceVersionMatch "exact" is forbidden for '
                        'resourceVersion "0"',
                    )
                )
        if opts.initial_events is not None:
            causes.append(
                (
                    "FieldValueForbidden",
                    "sendInitialEvents",
                    "Forbidden: sendInitialEvents is forbidden for list",
                )
            )
    if causes:
        raise invalid("meta.k8s.io", "ListOptions", "", causes)
    return opts


def parse_rv(text: str) -> int:
    """A resourceVersion query value as the store's integer revision."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise bad_request(f"invalid resource version: {text}")
    return value


def dry_run_requested(query: MultiMapping[str], options_kind: str) -> bool:
    """``dryRun=All`` (repeatable); anything else is ValidateDryRun's 422."""
    values: list[str] = list(query.getall("dryRun", []))
    if any(v != "All" for v in values):
        raise invalid(
            "meta.k8s.io",
            options_kind,
            "",
            [
                (
                    "FieldValueNotSupported",
                    "dryRun",
                    f'Unsupported value: {json.dumps(values)}: supported values: "All"',
                )
            ],
        )
    return bool(values)


def bad_request_no_reason(message: str) -> FakeApiError:
    # kcp's forwardingregistry.apiErrorBadRequest sets code and message only.
    return status_error(400, None, message)


def method_not_supported(spec: ResourceSpec, verb: str, suffix: str = "") -> FakeApiError:
    """errors.NewMethodNotSupported (kcp's wildcard guard appends a suffix)."""
    return status_error(
        405,
        "MethodNotAllowed",
        f'{verb} is not supported on resources of kind "{spec.qualified}"{suffix}',
        details={"group": spec.group, "kind": spec.plural} if spec.group else {"kind": spec.plural},
    )


def forbidden(target: Target, reason: str) -> FakeApiError:
    """responsewriters.ForbiddenStatusError for a denied resource request."""
    spec = target.spec
    resource = spec.plural + (f"/{target.subresource}" if target.subresource else "")
    scope = f'in the namespace "{target.namespace}"' if target.namespace else "at the cluster scope"
    what = f'{spec.qualified} "{target.name}"' if target.name else spec.qualified
    message = (
        f'{what} is forbidden: User "{USER}" cannot {target.verb} resource "{resource}" in API '
        f'group "{spec.group}" {scope}: {reason}'
    )
    details: JSON = {"name": target.name} if target.name else {}
    details.update({"group": spec.group, "kind": spec.plural})
    return status_error(403, "Forbidden", message, details=details)


def fault_error(code: int) -> FakeApiError:
    """The Status for :attr:`Faults.status_code`, with the reason the apiserver uses for it."""
    reasons = {
        400: "BadRequest",
        401: "Unauthorized",
        403: "Forbidden",
        404: "NotFound",
        409: "Conflict",
        410: "Expired",
        429: "TooManyRequests",
        503: "ServiceUnavailable",
        504: "Timeout",
    }
    reason = reasons.get(code, "InternalError" if code >= 500 else "BadRequest")
    retry = 1 if code in (429, 503) else None
    return status_error(
        code,
        reason,
        f"fault injected by FakeUpstream ({code})",
        details={"retryAfterSeconds": 1} if code == 429 else None,  # errors.NewTooManyRequests
        retry_after=retry,
    )


def error_response(error: FakeApiError) -> web.Response:
    response = web.Response(status=error.code, body=error.body, content_type="application/json")
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(error.retry_after)
    return response


def binds_export(binding: JSON, export_name: str) -> bool:
    """Whether an APIBinding references the export *export_name*."""
    export = ((binding.get("spec") or {}).get("reference") or {}).get("export") or {}
    return bool(export.get("name") == export_name)
