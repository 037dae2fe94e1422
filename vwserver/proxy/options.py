"""The query string, parsed against an allow-list per verb — pure, no I/O.

The upstream reads every query parameter it knows, and several of them steer what it returns or
writes (``watch`` turns a list into a watch, ``dryRun`` decides whether a write happens,
``includeObject`` decides whether a Table row carries the labels the filter needs). A proxy that
forwards parameters it did not read can be made to disagree with the upstream about what a
request is. So every parameter is checked here: known for the verb, given at most once (the
apiserver reads the first of repeated ``labelSelector``/``watch`` values in some places and all of
them in others — one value is the only reading both sides share), and of the type the apiserver
decodes it to. Anything else is a 400 that never reaches the upstream; what is forwarded is the
checked list, not the client's query string.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from vwserver.errors import BadRequest
from vwserver.proxy.paths import Verb

# The apiserver reads a boolean query parameter in two ways: ``pretty`` with Go's
# ``strconv.ParseBool``, the options it decodes (``watch``, ``orphanDependents``,
# ``allowWatchBookmarks``, ...) with apimachinery's ``Convert_Slice_string_To_bool``, for which
# only "0" and (case-insensitively) "false" are false and *anything else* is true — "f" and "F"
# are false to one and true to the other. Only the values both read alike are accepted.
_BOOLS_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_BOOLS_FALSE = frozenset({"0", "FALSE", "false", "False"})
_MAX_VALUE = 4096


def parse_bool(name: str, value: str) -> bool:
    """A boolean as both of the apiserver's readings read it (see above); 400 otherwise."""
    if value in _BOOLS_TRUE:
        return True
    if value in _BOOLS_FALSE:
        return False
    raise BadRequest(f"{name}: invalid value {value!r}: must be true or false")


def _bool(name: str, value: str) -> None:
    parse_bool(name, value)


def _non_negative_int(name: str, value: str) -> None:
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise BadRequest(f"{name}: invalid value {value!r}: must be a non-negative integer")


def _int(name: str, value: str) -> None:
    _non_negative_int(name, value.removeprefix("-"))


def _one_of(*allowed: str) -> Callable[[str, str], None]:
    def check(name: str, value: str) -> None:
        if value not in allowed:
            raise BadRequest(f"{name}: unsupported value {value!r}: must be one of {allowed}")

    return check


def _pattern(regex: str, what: str) -> Callable[[str, str], None]:
    compiled = re.compile(regex)

    def check(name: str, value: str) -> None:
        if not compiled.fullmatch(value):
            raise BadRequest(f"{name}: invalid value {value!r}: {what}")

    return check


def _text(name: str, value: str) -> None:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise BadRequest(f"{name}: control characters are not allowed")


# resourceVersions are opaque strings, but etcd's (kcp's) are decimal numbers.
_resource_version = _pattern(r"[0-9A-Za-z._:-]{0,64}", "not a resourceVersion")
# Go durations as client-go writes its request timeout ("32s", "1m0s", "500ms").
_duration = _pattern(r"([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+", "not a duration")
_dry_run = _one_of("All")  # the only dryRun value the apiserver accepts

_COMMON: dict[str, Callable[[str, str], None]] = {"pretty": _bool, "timeout": _duration}
_LIST: dict[str, Callable[[str, str], None]] = {
    "labelSelector": _text,  # parsed as a selector by the request context
    "fieldSelector": _text,
    "resourceVersion": _resource_version,
    "resourceVersionMatch": _one_of("", "Exact", "NotOlderThan"),
    "limit": _non_negative_int,
    "continue": _pattern(r"[A-Za-z0-9+/=_-]{0,2048}", "not a continue token"),
    "timeoutSeconds": _non_negative_int,
    "allowWatchBookmarks": _bool,
    "sendInitialEvents": _bool,
    "watch": _bool,
    "includeObject": _one_of("None", "Metadata", "Object"),
}
LIST_QUERY: tuple[str, ...] = tuple(_LIST)
_WRITE: dict[str, Callable[[str, str], None]] = {
    "dryRun": _dry_run,
    "fieldManager": _pattern(r"[ -~]{1,128}", "must be 1-128 printable characters"),
    "fieldValidation": _one_of("Ignore", "Warn", "Strict"),
}
PROPAGATION_POLICIES: tuple[str, ...] = ("Orphan", "Background", "Foreground")
_DELETE: dict[str, Callable[[str, str], None]] = {
    "dryRun": _dry_run,
    "gracePeriodSeconds": _int,
    "propagationPolicy": _one_of(*PROPAGATION_POLICIES),
    "orphanDependents": _bool,
}
DELETE_QUERY: tuple[str, ...] = tuple(_DELETE)
"""The query parameters that are DeleteOptions (the rest of a deletecollection's query lists
what to delete)."""

# OpenAPI v3 documents are fetched as /openapi/v3/apis/<g>/<v>?hash=<etag> (immutable caching).
_DISCOVERY: dict[str, Callable[[str, str], None]] = {
    **_COMMON,
    "hash": _pattern(r"[A-Fa-f0-9]{1,256}", "not a document hash"),
}

_ALLOWED: dict[Verb, dict[str, Callable[[str, str], None]]] = {
    # A GET of one object ignores "watch" (a list option), as the apiserver does: it is checked,
    # then dropped.
    Verb.GET: {
        **_COMMON,
        "resourceVersion": _resource_version,
        "includeObject": _LIST["includeObject"],
        "watch": _bool,
    },
    Verb.LIST: {**_COMMON, **_LIST},
    Verb.WATCH: {**_COMMON, **_LIST},
    Verb.CREATE: {**_COMMON, **_WRITE},
    Verb.UPDATE: {**_COMMON, **_WRITE},
    Verb.PATCH: {**_COMMON, **_WRITE, "force": _bool},
    Verb.DELETE: {**_COMMON, **_DELETE},
    Verb.DELETECOLLECTION: {**_COMMON, **_LIST, **_DELETE},
}


@dataclass(frozen=True, slots=True)
class Options:
    """The checked query: at most one value per parameter, in the client's order."""

    items: tuple[tuple[str, str], ...] = ()

    def get(self, name: str) -> str | None:
        return next((v for k, v in self.items if k == name), None)

    def __contains__(self, name: object) -> bool:
        return any(k == name for k, _ in self.items)

    def without(self, *names: str) -> list[tuple[str, str]]:
        return [(k, v) for k, v in self.items if k not in names]

    def flag(self, name: str) -> bool:
        value = self.get(name)
        return value is not None and parse_bool(name, value)


def watch_requested(query: Iterable[tuple[str, str]]) -> bool:
    """Whether the query asks for a watch (``watch=<true>``); 400 for a value that is not a
    boolean or a repeated parameter, which the apiserver and the proxy could read differently."""
    values = [v for k, v in query if k == "watch"]
    if len(values) > 1:
        raise BadRequest("watch: given more than once")
    return bool(values) and parse_bool("watch", values[0])


def check(query: Iterable[tuple[str, str]], *, verb: Verb, discovery: bool = False) -> Options:
    """The query checked for ``verb``: 400 naming the first parameter that is unknown for the
    verb, repeated, or not of its type."""
    allowed: Mapping[str, Callable[[str, str], None]] = _DISCOVERY if discovery else _ALLOWED[verb]
    seen: set[str] = set()
    items: list[tuple[str, str]] = []
    for name, value in query:
        if name not in allowed:
            what = "discovery" if discovery else verb
            raise BadRequest(f"query parameter {name!r} is not supported for {what}")
        if name in seen:
            raise BadRequest(f"query parameter {name!r} given more than once")
        if len(value) > _MAX_VALUE:
            raise BadRequest(f"query parameter {name!r} is longer than {_MAX_VALUE} characters")
        seen.add(name)
        allowed[name](name, value)
        items.append((name, value))
    return Options(tuple(items))


def delete_options(options: Options) -> dict[str, object]:
    """The DeleteOptions the query's DeleteOptions parameters mean, typed as the apiserver's
    query decoder types them (``dryRun`` a list, ``gracePeriodSeconds`` an int64,
    ``orphanDependents`` a bool). The apiserver reads DeleteOptions from the request body when
    there is one and then ignores these parameters (handlers/delete.go): a proxy that sends its
    own body must carry them in it."""
    out: dict[str, object] = {}
    for name, value in options.items:
        if name == "dryRun":
            out[name] = [value]
        elif name == "gracePeriodSeconds":
            out[name] = int(value)
        elif name == "orphanDependents":
            out[name] = parse_bool(name, value)
        elif name == "propagationPolicy":
            out[name] = value
    return out
