"""Decode request bodies (JSON, and YAML apply patches) with bounded work and memory.

A request body is the one thing a client sends that the proxy must turn into Python objects, so
it is the natural place for an attacker to make a small request cost a lot. Two shapes do:

**Deep nesting.** ``[[[[…]]]]`` ten thousand levels deep is 20 KB. msgspec decodes nesting by
recursion guarded by Python's recursion limit, so it ended in ``RecursionError``, i.e. an
aiohttp text 500 with a traceback; any recursive walk over the result afterwards (encoding it
again, checking labels) has the same problem. kube-apiserver accepts 10,000 levels
(``k8s.io/apimachinery/pkg/util/json``, like Go's ``encoding/json``): Go grows goroutine stacks,
but CPython's recursion limit is 1,000 frames, shared by msgspec (``Py_EnterRecursiveCall`` per
level), the proxy's own walks and the stack the request is served on. :data:`MAX_DEPTH` = 100
keeps every walk far inside that limit, and is several times deeper than real objects get (a
CRD's ``openAPIV3Schema`` or a Helm ``values`` tree: 20 to 40 levels). Deeper bodies are a 400.

**YAML aliases** ("billion laughs"): nine anchors of nine aliases each are 289 bytes that stand
for 9⁹ scalars. PyYAML shares one object per anchor, so loading is cheap, but anything that
walks the result (encoding it for kcp, a label check) expands it: vwserver grew to 955 MB and
stalled for 1.8 s. go-yaml, which kube uses, refuses "excessive aliasing" (CVE-2019-11253): more
than 100 alias-decoded nodes making up over 99 % (down to 10 % for huge documents) of all nodes
decoded. That ratio still lets 5 KB expand to ~400,000 nodes, cheap in Go and ~100 MB of Python
objects, so vwserver bounds the document itself instead.

**Large YAML.** PyYAML builds a node object (with two position marks) per scalar: a 4 MiB list of
small numbers took 25 s of event-loop time and 850 MB. So a YAML apply patch may have at most
:data:`MAX_YAML_NODES` nodes, *counting every alias expanded*, which also bounds alias bombs. It
is checked on libyaml's event stream before any node is built: an anchor's expanded size and
height are noted when its value ends, so an alias costs a lookup whatever it stands for, and
reading stops at the first bound crossed. An alias inside its own anchor's value (a cycle) is
refused too, as go-yaml does. The bound is generous for YAML people write (a large
Deployment is a few hundred nodes) and does not apply to JSON: kubectl's server-side apply sends
JSON (which is YAML), and a body that is valid JSON is read as JSON, by msgspec, with only the
depth bound — the same meaning, at a hundredth of the cost.

The YAML result is JSON, like sigs.k8s.io/yaml's ``YAMLToJSON`` makes it for the apiserver:
the safe loader (no Python tags; an unknown tag is a 400), timestamps kept as the strings they
were written as (go-yaml does so when decoding into ``interface{}``), integer and boolean map
keys as their strings (``1`` → ``"1"``, ``true`` → ``"true"``), and every alias expanded into a
copy of its own, so that changing one place of the result (the proxy adds labels) never changes
another. Other keys (null, float, a collection), ``.inf``/``.nan``, ``!!binary`` and ``!!set``
have no JSON form: 400.

Bodies are already bounded in size by the app's ``client_max_size`` before they get here.
"""

from __future__ import annotations

import contextlib
import math
import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import msgspec
import yaml

from vwserver.errors import BadRequest

__all__ = ["MAX_DEPTH", "MAX_YAML_NODES", "decode_json", "decode_yaml"]

MAX_DEPTH = 100
"""Deepest nesting of objects/arrays (mappings/sequences) a body may have; see the docstring."""

MAX_YAML_NODES = 20_000
"""How many nodes (scalars and collections) a YAML apply patch that is not JSON may have, its
aliases expanded; see the module docstring."""

# --- JSON --------------------------------------------------------------------------------------

# All bytes but the four brackets (translate's delete argument), and the brackets as signed
# steps: an opening one +1, a closing one -1 (0xff read as a signed char).
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def decode_json(raw: bytes) -> Any:
    """A JSON body as Python objects; :class:`BadRequest` if it is not JSON or nests deeper
    than :data:`MAX_DEPTH`."""
    _check_json_depth(raw, what="the request body")
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from e


def _check_json_depth(raw: bytes, *, what: str) -> None:
    if _json_depth(raw) > MAX_DEPTH:
        raise _too_deep(what)


def _too_deep(what: str) -> BadRequest:
    return BadRequest(f"{what} is nested deeper than {MAX_DEPTH} levels")


def _json_depth(raw: bytes) -> int:
    """The deepest bracket nesting of a JSON text, brackets inside strings not counted; exact
    for valid JSON (anything else msgspec refuses after this). Runs at C speed: about as long as
    decoding the body, and bodies with fewer brackets than the bound are not scanned at all."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return 0
    if b"\\" in raw:
        # In valid JSON a backslash occurs only in strings, and escapes pair up from the left:
        # dropping every "\\" first, then every '\"', leaves exactly the unescaped quotes.
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Between the unescaped quotes, alternately: outside a string, inside one.
    outside = b"".join(raw.split(b'"')[::2])
    steps = array("b", outside.translate(_STEPS, _NOT_BRACKETS))
    return max(accumulate(steps), default=0)


# --- YAML --------------------------------------------------------------------------------------

_PATCH = "the apply patch"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_Base):  # type: ignore[valid-type,misc]
    """The safe loader (libyaml's parser when available), resolving like go-yaml where that is
    what kube sees: timestamps stay strings, ``1e3`` is a number, map keys are strings."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP]
        for first, resolvers in _Base.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[str, Any]:
        # Keys become strings as they are read, so that 1 and true (equal in Python) stay two.
        self.flatten_mapping(node)  # merge keys (<<), as SafeConstructor does
        return {
            _key(self.construct_object(k, deep=deep)): self.construct_object(v, deep=deep)
            for k, v in node.value
        }


_Loader.add_constructor(_TIMESTAMP, yaml.SafeLoader.construct_yaml_str)
# YAML 1.1 wants a dot and a signed exponent; go-yaml (YAML 1.2, JSON) reads 1e3 and 1.5e3 as
# numbers too.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def decode_yaml(raw: bytes) -> Any:
    """A YAML (or JSON) apply patch as JSON-compatible Python objects; :class:`BadRequest` if
    it is not a single YAML document, nests deeper than :data:`MAX_DEPTH`, has more than
    :data:`MAX_YAML_NODES` nodes with its aliases expanded, or holds something JSON cannot
    (see the module docstring)."""
    if raw.lstrip()[:1] in (b"{", b"["):
        # What kubectl sends. Valid JSON means the same as YAML, and msgspec reads it fast.
        _check_json_depth(raw, what=_PATCH)
        with contextlib.suppress(msgspec.DecodeError):  # e.g. flow-style YAML: read as such
            return msgspec.json.decode(raw)
    try:
        _check_events(yaml.parse(raw, Loader=_Loader))
        loader = _Loader(raw)
        try:
            value = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise BadRequest(f"the apply patch is not valid YAML: {_yaml_problem(e)}") from e
    return _jsonable(value)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """What is wrong and where, without quoting the document (the pure-Python loader's marks
    carry a snippet of it)."""
    if isinstance(e, yaml.MarkedYAMLError):
        where = e.problem_mark or e.context_mark
        problem = e.problem or e.context or "invalid"
        if where is not None:
            return f"{problem} (line {where.line + 1}, column {where.column + 1})"
        return problem
    return str(e)


@dataclass(slots=True)
class _Open:
    """A collection whose end event has not come yet."""

    anchor: str | None
    nodes_before: int
    child_height: int = 0


def _check_events(events: Iterator[yaml.Event]) -> None:
    """Refuses a YAML stream deeper than :data:`MAX_DEPTH`, larger than :data:`MAX_YAML_NODES`
    with every alias expanded, or with an alias inside its own anchor's value, from its parser
    events: no node is built, and reading stops at the first bound crossed. Each anchor's
    expanded size and height are noted when its value ends, so an alias costs a lookup."""
    nodes = 0
    anchors: dict[str, tuple[int, int]] = {}  # anchor → (nodes when expanded, height)
    stack: list[_Open] = []
    for event in events:
        if isinstance(event, yaml.CollectionStartEvent):
            if len(stack) >= MAX_DEPTH:
                raise _too_deep(_PATCH)
            stack.append(_Open(event.anchor, nodes))
            nodes += 1
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            done = stack.pop()
            size, height = nodes - done.nodes_before, done.child_height + 1
            if done.anchor is not None:
                anchors[done.anchor] = (size, height)
        elif isinstance(event, yaml.ScalarEvent):
            size, height = 1, 0  # height: levels of collections
            nodes += 1
            if event.anchor is not None:
                anchors[event.anchor] = (size, height)
        elif isinstance(event, yaml.AliasEvent):
            if any(o.anchor == event.anchor for o in stack):
                raise BadRequest("the apply patch has an anchor whose value contains its alias")
            if event.anchor not in anchors:
                continue  # undefined: the composer says so
            size, height = anchors[event.anchor]
            if len(stack) + height > MAX_DEPTH:
                raise _too_deep(_PATCH)
            nodes += size
        else:
            continue  # stream and document events
        if nodes > MAX_YAML_NODES:
            raise BadRequest(
                f"the apply patch has more than {MAX_YAML_NODES} nodes with its aliases "
                "expanded; send it as JSON"
            )
        if stack:
            stack[-1].child_height = max(stack[-1].child_height, height)


def _jsonable(value: Any) -> Any:
    """``value`` as a JSON tree of fresh containers (an alias becomes a copy of its own); the
    events were checked first, so depth and size are bounded."""
    if isinstance(value, dict):  # keys are strings already (_Loader.construct_mapping)
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise BadRequest("the apply patch holds .inf or .nan, which JSON cannot represent")
    if value is None or isinstance(value, str | bool | int | float):
        return value
    raise BadRequest(
        f"the apply patch holds a value of type {type(value).__name__} (e.g. !!binary, !!set), "
        "which JSON cannot represent"
    )


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool):  # before int: bool is an int
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    raise BadRequest(f"the apply patch has a map key of type {type(key).__name__}, not a string")
