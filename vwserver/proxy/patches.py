"""Merge patches (RFC 7386) and JSON patches (RFC 6902) applied the way kcp applies them.

Why: a guarded patch must know the patched object before it is written (is it still in the
slice? does it drop a held finalizer?). Asking kcp with a ``dryRun=All`` round trip costs a
second upstream write; computing the result here costs nothing — provided the result is kcp's.
So this module reproduces kcp's patch *mechanism*, not the RFCs: where kcp deviates from them,
this module deviates the same way.

Pure: decoded JSON in (``dict``/``list``/``str``/``int``/``float``/``bool``/``None``), decoded
JSON out, no I/O. A patch kcp would refuse raises :class:`PatchError` (or a subclass) with the
code, reason and message of kcp's Status.

kcp's mechanism (kcp v0.32.3: k8s.io/apiserver ``pkg/endpoints/handlers/patch.go`` of kcp's
Kubernetes fork, ``jsonPatcher``, with ``gopkg.in/evanphx/json-patch.v4`` v4.13.0 — not v5;
verified against kcp in tests/conformance/test_patch_differential_kcp.py):

* The patch applies to kcp's JSON encoding of the stored object (``encoding/json``: keys
  sorted, ``<``, ``>``, ``&``, U+2028/U+2029 escaped as ``\\u003c`` …); the result is decoded
  into an unstructured object (integers that fit int64 stay integers, any other number becomes
  a float64, so ``1.0`` and ``1e2`` come back as ``1`` and ``100``), then pruned, defaulted and
  validated by the resource's schema — which is the upstream write's business, not this
  module's. A result that is not a JSON object is refused by that decoding (422). Its
  ``metadata`` is decoded into a typed ObjectMeta and written back: unknown members, nulls and
  empty values dropped, a ``null`` label/annotation value or finalizer read as ``""`` (so a
  label copied from a missing member exists, with value ``""``), a value of the wrong type
  refused with 422 — reproduced here, because membership is read from exactly these fields.

Merge patch (``jsonpatch.MergePatch``):

* A patch that is not a JSON object: ``null`` or a scalar → 400 ``Invalid JSON Patch``; an array
  (only with ``fieldValidation=Ignore``; the default ``Warn`` refuses any non-object with 400
  while decoding it) replaces the document, so the result is not an object → 422.
* Object members: ``null`` deletes the key (a missing key is fine); an object merged into an
  object recurses; any other value replaces — **and nulls are pruned from it, recursively, also
  from objects inside arrays**, when the document's value is missing, ``null`` or not an object
  (RFC 7386 keeps array elements untouched). When the document's value *is* an object and the
  patch's value is not (e.g. an array), the patch's value is taken as it is, nulls included.
  Array elements that are ``null`` are kept either way.

JSON patch (``jsonpatch.DecodePatch`` + ``Patch.Apply``):

* At most 10,000 operations (else 413); the copied bytes of all ``copy`` operations together at
  most 3 MiB (the apiserver's ``JSONPatchMaxCopyBytes``, measured as ``encoding/json`` output).
* Pointers: the text before the first ``/`` is ignored (the proxy refuses pointers that are not
  RFC 6901 before they get here, :func:`vwserver.proxy.writes.pointer_tokens`); ``~1`` then
  ``~0`` decoded. The root pointer ``""`` works only for ``test`` and ``replace`` (with an object
  or array value); ``add``/``remove``/``move``/``copy`` on ``""`` fail as a missing path.
* Array indices are Go's ``strconv.Atoi``: a sign and leading zeros are accepted (``+1``,
  ``01``); **negative indices count from the end** (``SupportNegativeIndices`` is left at its
  default, true): ``-1`` is the last element for get/replace/remove and, for ``add``, inserts
  before the end's position (``-1`` appends). ``-`` appends for ``add`` (and ``move``/``copy``
  targets); elsewhere it is no index.
* Traversal stops at a missing key, a ``null`` or a scalar: "doc is missing path".
* ``replace`` of a missing *object member* adds it (RFC 6902 requires it to exist); of an
  array index out of range it fails.
* ``remove`` of a missing member fails; of a member holding ``null`` it removes it.
* ``copy`` from a missing object member copies ``null`` (adds the key with ``null``); ``move``
  from one fails. ``add``/``replace`` without ``value`` write ``null``.
* ``test``: a missing member or a ``null`` passes against ``null`` (or no ``value``); scalars are
  compared by their JSON *text* (after whitespace removal), not their value: the stored side is
  kcp's encoding, the patch side is the text kcp received — the proxy re-encodes patches with
  msgspec, whose text this module assumes. So ``1`` ≠ ``1.0``, and a stored ``"a<b"`` (sent as
  ``"a\\u003cb"``) fails a test for ``"a<b"``. Objects and arrays compare member by member.
* A ``null`` inside an array that a ``test`` compares, a ``test`` of ``""`` or ``replace`` of
  ``""`` without ``value``, or writing into a ``null`` that a ``copy`` made (a nil map in Go)
  make kcp's library panic: kcp closes the connection without an answer (verified); this module
  raises :class:`PatchPanic` (500). When a comparison meets both a mismatch and such a
  ``null``, Go's random map order decides between 422 and the panic (``PatchError.also``).
* A failed operation: 422 ``Invalid`` with the message :data:`REJECTED` and empty details —
  kcp does not send the library's text (kept here as ``PatchError.cause``).
* ``op``/``path``/``from`` that are not strings, or operations that are not objects: 400 (the
  apiserver's typed decoding under the default ``fieldValidation=Warn``). With ``Strict``, an
  operation with a member other than ``op``/``path``/``from``/``value`` is refused with 422;
  ``Warn`` only warns.

Not reproduced (the caller must not rely on the local result there): server-side apply and
strategic merge patches (they need the schema and field ownership), the schema's pruning and
defaulting of the result (metadata is not pruned: only ObjectMeta's decoding, reproduced here),
and whatever admission changes after the patch — see :data:`ADMISSION`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec

from vwserver.errors import RequestError

__all__ = [
    "ADMISSION",
    "MAX_COPY_BYTES",
    "MAX_OPERATIONS",
    "BadPatch",
    "PatchError",
    "PatchPanic",
    "PatchTooLarge",
    "apply_json_patch",
    "apply_merge_patch",
]

MAX_OPERATIONS = 10_000
"""k8s.io/apiserver ``maxJSONPatchOperations``: more operations are refused with 413."""
MAX_COPY_BYTES = 3 * 1024 * 1024
"""k8s.io/apiserver ``JSONPatchMaxCopyBytes`` (json-patch's ``AccumulatedCopySizeLimit``)."""

ADMISSION = """\
Admission after the patch (kcp v0.32.3; sources pkg/admission/{mutatingwebhook,
mutatingadmissionpolicy,pathannotation}, verified against kcp where marked):

* kcp runs mutating admission on objects written through an APIExport virtual workspace, in
  the consumer's logical cluster, after the patch is applied and before the object is
  validated and stored — also for ``dryRun=All`` requests.
* Which configurations apply: for a resource bound by an APIBinding (every resource an APIExport
  VW serves), the MutatingWebhookConfigurations and the MutatingAdmissionPolicies (+ bindings)
  of the **APIExport's workspace** (the binding's ``status.apiExportClusterName``); those of the
  consumer's own workspace do not apply to bound resources. (kcp's plugins
  ``apis.kcp.io/MutatingWebhook`` and ``KCPMutatingAdmissionPolicy``, both on by default;
  MutatingAdmissionPolicy is GA, on by default, in kcp's Kubernetes 1.37 fork.)
  Verified: a MutatingAdmissionPolicy in the provider workspace added a label, an annotation
  and a finalizer to a consumer's widget patched (dry run) through the VW; the same policy in
  the consumer workspace did not (tests/conformance/test_patch_differential_kcp.py). Webhooks
  follow the same rule in the source (``getSourceClusterForGroupResource``); not run here.
* kcp's ``pathannotation`` plugin (always on): on every create and update of an object that
  carries the ``kcp.io/path`` annotation, kcp sets it to the workspace's path — a locally
  patched ``kcp.io/path`` is not what kcp stores (verified).
* Validating admission (``apis.kcp.io/ReservedMetadata``: 403 for changes of ``*.kcp.io``
  labels and annotations by non-system users; webhooks, policies) only refuses: the local
  result can be refused, never changed.

So the result computed here is what kcp stores only when the provider's workspace has no
mutating webhook or policy matching the resource: whoever relies on it for membership must still
check the object kcp answers for the write (it is the stored one, admission included) and undo
or refuse what it cannot accept; only where a write's answer cannot be checked any more (it is
already stored) must the dry run stay.
"""

REJECTED = "the server rejected our request due to an error in our request"
"""The message of kcp's 422 for a JSON patch that does not apply: the apiserver answers
``NewGenericServerResponse(422, …)``, which replaces the library's text by this sentence."""


class PatchError(RequestError):
    """A patch kcp refuses while applying it: 422 ``Invalid`` (subclasses carry kcp's other
    codes), with kcp's message; ``cause`` is json-patch's own text of the failure, which kcp
    does not send (for logs and tests)."""

    code: ClassVar[int] = 422
    reason: ClassVar[str] = "Invalid"

    def __init__(
        self,
        message: str,
        *,
        cause: str | None = None,
        also: int | None = None,
        details: dict[str, object] | None = None,
    ) -> None:
        super().__init__(message, details=details)
        self.cause = cause or message
        self.also = also
        """Another code kcp may answer instead: a JSON patch ``test`` comparing objects with a
        ``null`` array element fails (422) or panics (:class:`PatchPanic`) as Go's random map
        order falls."""


class BadPatch(PatchError):
    """400: the patch is no patch (kcp cannot decode it)."""

    code = 400
    reason = "BadRequest"


class PatchTooLarge(PatchError):
    """413: more than :data:`MAX_OPERATIONS` operations."""

    code = 413
    reason = "RequestEntityTooLarge"


class PatchPanic(PatchError):
    """kcp's patch library panics on this patch: kcp aborts the connection without any answer
    (verified). There is no Status to copy; this one is 500 ``InternalError``."""

    code = 500
    reason = "InternalError"


# --------------------------------------------------------------------------------------------
# Merge patch


def apply_merge_patch(document: Any, patch: Any, *, field_validation: str = "Warn") -> Any:
    """``document`` with the JSON merge ``patch`` applied as kcp applies it (see the module
    docstring); ``document`` is not changed. ``field_validation``: the request's
    ``fieldValidation`` (``Ignore``, ``Warn`` — the apiserver's default — or ``Strict``)."""
    if field_validation != "Ignore" and not isinstance(patch, dict) and patch is not None:
        # The strict decoding into map[string]interface{} (Warn and Strict) comes first.
        raise BadPatch(
            f"error decoding patch: json: cannot unmarshal {_go_type(patch)} into Go value of "
            "type map[string]interface {}"
        )
    if patch is None or not isinstance(patch, dict | list):
        raise BadPatch("Invalid JSON Patch")
    if isinstance(patch, list):
        raise _not_an_object(_marshal(_from_patch(_pruned(patch))))
    if not isinstance(document, dict):
        return _settled(_pruned(patch))
    merged = _merged_into(_settled(document), patch)
    return _object_meta(_settled(merged), lambda: _marshal(_from_patch(merged)))


def _merged_into(doc: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """mergeDocs: ``doc`` (a fresh copy owned here) with ``patch``'s members merged in."""
    for key, value in patch.items():
        if value is None:
            doc.pop(key, None)
            continue
        current = doc.get(key)
        if not isinstance(current, dict):  # missing, null or no object: the value, pruned
            doc[key] = _pruned(value)
        elif isinstance(value, dict):
            doc[key] = _merged_into(current, value)
        else:  # an object replaced by a non-object: taken as it is, nulls and all
            doc[key] = value
    return doc


def _pruned(value: Any) -> Any:
    """pruneNulls: null members removed from objects, recursively (also inside arrays, whose
    null elements stay)."""
    if isinstance(value, dict):
        return {k: _pruned(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [None if v is None else _pruned(v) for v in value]
    return value


# --------------------------------------------------------------------------------------------
# Settling: what kcp's decoding of the patched JSON makes of numbers


_INT64 = (-(2**63), 2**63 - 1)


def _settled(value: Any) -> Any:
    """``value`` as it reads back from kcp: an integer outside int64 becomes a float64, a float
    that ``encoding/json`` writes without fraction or exponent reads back as an integer."""
    if isinstance(value, dict):
        return {k: _settled(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_settled(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        if _INT64[0] <= value <= _INT64[1]:
            return value
        value = float(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        # Go writes it in fixed notation with its shortest digits: 4.230719716055601e16 is
        # 42307197160556010, not the float's exact value 42307197160556008.
        return int(_go_float(value))
    return value


# --------------------------------------------------------------------------------------------
# metadata as kcp keeps it: the patched object's metadata is decoded into a typed ObjectMeta
# (apiextensions-apiserver's schema-coercing decoder) and written back


_META_STRINGS = ("generateName", "name", "namespace", "resourceVersion", "selfLink", "uid")
_META_INTEGERS = ("deletionGracePeriodSeconds", "generation")
_META_MAPS = ("annotations", "labels")
_META_AS_IS = ("creationTimestamp", "deletionTimestamp", "managedFields", "ownerReferences")


def _object_meta(result: dict[str, Any], text: Callable[[], bytes]) -> dict[str, Any]:
    """``result`` with its metadata as kcp keeps it: members ObjectMeta does not know, nulls and
    empty values are dropped (``omitempty``); a ``null`` label or annotation value or finalizer
    becomes ``""`` (Go decodes null into a string as nothing). A value of the wrong type is
    kcp's 422 (the earliest one in Go's text order). ``text``: the patched JSON (its message).
    Timestamps, ownerReferences and managedFields are kept as they are (not checked)."""
    meta = result.get("metadata")
    if not isinstance(meta, dict):
        return result
    kept: dict[str, Any] = {}
    for key in sorted(meta):
        value = meta[key]
        if value is None:
            continue
        if key in _META_STRINGS:
            _expect(isinstance(value, str), value, key, "string", text)
        elif key in _META_INTEGERS:
            _expect(
                isinstance(value, int) and not isinstance(value, bool), value, key, "int64", text
            )
        elif key in _META_MAPS:
            _expect(isinstance(value, dict), value, key, "map[string]string", text)
            for member in (value[k] for k in sorted(value)):
                _expect(member is None or isinstance(member, str), member, key, "string", text)
            value = {k: "" if v is None else v for k, v in value.items()}
        elif key == "finalizers":
            _expect(isinstance(value, list), value, key, "[]string", text)
            for member in value:
                _expect(member is None or isinstance(member, str), member, key, "string", text)
            value = ["" if v is None else v for v in value]
        elif key not in _META_AS_IS:
            continue
        if value in ("", 0, {}, []) and not isinstance(value, bool):
            continue
        kept[key] = value
    return {**result, "metadata": kept}


def _expect(ok: bool, value: Any, key: str, go_type: str, text: Callable[[], bytes]) -> None:
    if ok:
        return
    problem = (
        f"json: cannot unmarshal {_go_type(value)} into Go struct field ObjectMeta.{key} of "
        f"type {go_type}"
    )
    invalid = f"Invalid value: {_go_quoted(text().decode())}: {problem}"
    raise PatchError(
        f' "" is invalid: patch: {invalid}',
        details={"causes": [{"reason": "FieldValueInvalid", "message": invalid, "field": "patch"}]},
    )


# --------------------------------------------------------------------------------------------
# JSON text as kcp sees it: encoding/json for the stored object, msgspec for the patch


_GO_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_GO_ESCAPED = re.compile('["\\\\\x00-\x1f<>&\u2028\u2029]')


def _go_string(s: str) -> bytes:
    """``encoding/json``'s text of a string (HTML escaping on, as the apiserver's encoder)."""
    body = _GO_ESCAPED.sub(lambda m: _GO_ESCAPES.get(m[0]) or f"\\u{ord(m[0]):04x}", s)
    return b'"' + body.encode("utf-8", "surrogatepass") + b'"'


def _go_float(f: float) -> bytes:
    """``encoding/json``'s text of a float64: the shortest digits, fixed notation unless the
    magnitude is below 1e-6 or at least 1e21, exponents without a leading zero (``1e-7``)."""
    if f == 0:
        return b"-0" if math.copysign(1.0, f) < 0 else b"0"
    digits, exponent = _shortest(f)
    sign = "-" if f < 0 else ""
    if abs(f) < 1e-6 or abs(f) >= 1e21:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        e = exponent - 1
        return f"{sign}{mantissa}e{'-' if e < 0 else '+'}{abs(e):02d}".replace("e-0", "e-").encode()
    if exponent <= 0:
        text = "0." + "0" * -exponent + digits
    elif exponent >= len(digits):
        text = digits + "0" * (exponent - len(digits))
    else:
        text = digits[:exponent] + "." + digits[exponent:]
    return (sign + text).encode()


def _shortest(f: float) -> tuple[str, int]:
    """The shortest round-tripping decimal digits ``d`` of ``|f|`` (Python's ``repr`` and Go's
    ``strconv`` agree on them) and the exponent ``e`` with ``|f| = 0.d * 10**e``."""
    mantissa, _, exp = repr(abs(f)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    scale = (int(exp) if exp else 0) - len(fraction)  # |f| = int(digits) * 10**scale
    stripped = digits.rstrip("0")
    scale += len(digits) - len(stripped)
    return stripped, scale + len(stripped)


def _go_raw(value: Any) -> bytes:
    """``encoding/json``'s text of a scalar of the stored object."""
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, str):
        return _go_string(value)
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, float):
        return _go_float(value)
    raise TypeError(f"not a JSON scalar: {value!r}")


_encoder = msgspec.json.Encoder()
_ESCAPED_IN_RAW = (
    (b"<", b"\\u003c"),
    (b">", b"\\u003e"),
    (b"&", b"\\u0026"),
    ("\u2028".encode(), b"\\u2028"),
    ("\u2029".encode(), b"\\u2029"),
)


def _html_escaped(raw: bytes) -> bytes:
    """``json.Marshal`` of a ``json.RawMessage``: its text compacted with HTML escaping."""
    for old, new in _ESCAPED_IN_RAW:
        raw = raw.replace(old, new)
    return raw


# --------------------------------------------------------------------------------------------
# JSON patch
#
# The document is held as json-patch's tree: objects are dicts and arrays lists of nodes, where
# ``None`` is Go's nil node (a null of the stored object or of an object inside a patch value);
# every scalar is a _Leaf carrying its JSON text, because ``test`` compares texts.


@dataclass(slots=True)
class _Leaf:
    value: Any
    raw: bytes | None
    """The JSON text; None for the node of an operation's ``"value": null`` (a lazyNode with no
    text), ``b"null"`` for a copy of one (a node that reads as a nil map)."""


_RAW_NULL = b"null"


class _NilMap:
    """A copied ``null`` walked into: Go's nil map (reading finds nothing; writing panics)."""


_Container = dict[str, Any] | list[Any] | _NilMap


class _Failed(Exception):
    """One operation failed with this message (json-patch's error text)."""


class _Panicked(Exception):
    """kcp's library dereferences nil here."""


class _Undecided(Exception):
    """A ``test`` that kcp's library fails or panics on, as Go's map iteration order falls."""


_MISSING = "missing value"
_BAD_INDEX = "invalid index referenced"
_OP_MEMBERS = ("op", "path", "from", "value")


def apply_json_patch(
    document: Any, operations: list[Any], *, field_validation: str = "Warn"
) -> Any:
    """``document`` with the JSON patch ``operations`` applied as kcp applies it (see the module
    docstring); ``document`` is not changed. ``field_validation``: the request's
    ``fieldValidation`` (``Ignore``, ``Warn`` — the apiserver's default — or ``Strict``, which
    refuses operations with members other than ``op``/``path``/``from``/``value``)."""
    if not isinstance(operations, list):
        raise BadPatch(
            f"error decoding patch: json: cannot unmarshal {_go_type(operations)} into Go value "
            "of type []handlers.jsonPatchOp"
        )
    for each in operations:
        _check_decodable(each, typed=field_validation != "Ignore")
    if len(operations) > MAX_OPERATIONS:
        raise PatchTooLarge(
            f"The allowed maximum operations in a JSON patch is {MAX_OPERATIONS}, "
            f"got {len(operations)}"
        )
    root: Any = _from_doc(document)
    copied = [0]
    op: Any = {}
    try:
        for op in operations:
            root = _apply(root, op or {}, copied)
    except _Failed as e:
        raise PatchError(REJECTED, cause=str(e), details={}) from None
    except _Undecided:
        cause = f"testing value {op['path']} failed: test failed"
        raise PatchError(REJECTED, cause=cause, also=PatchPanic.code, details={}) from None
    except _Panicked:
        raise PatchPanic(
            "kcp's JSON patch library panics on this patch (nil pointer dereference) and kcp "
            "closes the connection without an answer"
        ) from None
    if field_validation == "Strict":
        unknown = [
            f'json patch unknown field "[{i}].{key}"'
            for i, op in enumerate(operations)
            for key in op or {}
            if key not in _OP_MEMBERS
        ]
        if unknown:
            raise PatchError(f"strict decoding error: {', '.join(unknown)}")
    if not isinstance(root, dict):
        raise _not_an_object(_marshal(root))
    return _object_meta(_settled(_to_value(root)), lambda: _marshal(root))


_NO_KIND = (
    "couldn't get version/kind; json parse error: json: cannot unmarshal array into Go value of "
    'type struct { APIVersion string "json:\\"apiVersion,omitempty\\""; Kind string '
    '"json:\\"kind,omitempty\\"" }'
)


def _not_an_object(text: bytes) -> PatchError:
    """kcp's 422 for a patched document that is an array (its decoding into an object)."""
    invalid = f"Invalid value: {_go_quoted(text.decode())}: {_NO_KIND}"
    return PatchError(
        f' "" is invalid: patch: {invalid}',
        details={"causes": [{"reason": "FieldValueInvalid", "message": invalid, "field": "patch"}]},
    )


def _go_quoted(s: str) -> str:
    """Go's ``%q`` of a string (as field.Invalid prints a string value): non-printable
    characters escaped. The quoted JSON text itself may still differ from kcp's in one way: kcp
    keeps the members of a patch value it never walked into in the patch's order, this module
    sorts them."""
    out = []
    for ch in s:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def _go_type(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "bool"
    return "number"


def _check_decodable(op: Any, *, typed: bool) -> None:
    """The apiserver's decoding of a JSON patch: each operation an object (or null); ``typed``
    (the strict decoding into ``[]jsonPatchOp`` of ``Warn`` and ``Strict``): its ``op``,
    ``path`` and ``from`` strings (or null)."""
    if op is None:
        return
    if not isinstance(op, dict):
        raise BadPatch(
            f"error decoding patch: json: cannot unmarshal {_go_type(op)} into Go value of "
            "type handlers.jsonPatchOp"
        )
    if not typed:
        return
    for name in ("op", "path", "from"):
        value = op.get(name)
        if value is not None and not isinstance(value, str):
            raise BadPatch(
                f"error decoding patch: json: cannot unmarshal {_go_type(value)} into Go "
                f"struct field jsonPatchOp.{name} of type string"
            )


def _from_doc(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: _from_doc(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_doc(v) for v in value]
    return _Leaf(value, _go_raw(value))


def _from_patch(value: Any) -> Any:
    """A node of a patch value: nested nulls are nil nodes, scalars carry msgspec's text."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: _from_patch(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_patch(v) for v in value]
    return _Leaf(value, _encoder.encode(value))


def _value_node(op: dict[str, Any]) -> Any:
    """``Operation.value()``: nil without a ``value`` member, a text-less node for ``null``."""
    if "value" not in op:
        return None
    if op["value"] is None:
        return _Leaf(None, None)
    return _from_patch(op["value"])


def _to_value(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _to_value(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_to_value(v) for v in node]
    if isinstance(node, _Leaf):
        return node.value
    return None


def _marshal(node: Any) -> bytes:
    """``json.Marshal`` of a node: keys sorted, texts HTML-escaped."""
    if isinstance(node, dict):
        members = (_go_string(k) + b":" + _marshal(node[k]) for k in sorted(node))
        return b"{" + b",".join(members) + b"}"
    if isinstance(node, list):
        return b"[" + b",".join(_marshal(v) for v in node) + b"]"
    if isinstance(node, _Leaf) and node.raw is not None:
        return _html_escaped(node.raw)
    return _RAW_NULL


def _deep_copy(node: Any) -> tuple[Any, int]:
    """``deepCopy``: the node re-read from its marshalled text, and that text's length."""
    if node is None:
        return None, 0
    text = _marshal(node)
    if isinstance(node, _Leaf):
        return _Leaf(node.value, text), len(text)
    return _reread(node), len(text)


def _reread(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _reread(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_reread(v) for v in node]
    if isinstance(node, _Leaf) and node.raw is not None:
        return _Leaf(node.value, _html_escaped(node.raw))
    return None  # a null inside marshalled text reads back as a nil node


# -- containers (partialDoc / partialArray) ---------------------------------------------------

_ATOI = re.compile(r"[+-]?[0-9]+")


def _atoi(key: str) -> int:
    """Go's ``strconv.Atoi``: an optional sign and ASCII digits, within int64."""
    if not _ATOI.fullmatch(key):
        raise _Failed(f'strconv.Atoi: parsing "{key}": invalid syntax')
    n = int(key)
    if not _INT64[0] <= n <= _INT64[1]:
        raise _Failed(f'strconv.Atoi: parsing "{key}": value out of range')
    return n


def _negative(idx: int, length: int) -> int:
    if idx < -length:
        raise _Failed(f"Unable to access invalid index: {idx}: {_BAD_INDEX}")
    return idx + length


def _get(con: _Container, key: str) -> Any:
    if isinstance(con, dict):
        return con.get(key)
    if isinstance(con, _NilMap):
        return None
    idx = _atoi(key)
    if idx < 0:
        idx = _negative(idx, len(con))
    if idx >= len(con):
        raise _Failed(f"Unable to access invalid index: {idx}: {_BAD_INDEX}")
    return con[idx]


def _set(con: _Container, key: str, node: Any) -> None:
    """``set``, only after a ``get`` of the same key succeeded (``replace``)."""
    if isinstance(con, dict):
        con[key] = node
    elif isinstance(con, _NilMap):
        raise _Panicked  # assignment to entry in nil map
    else:
        idx = _atoi(key)
        con[_negative(idx, len(con)) if idx < 0 else idx] = node


def _add(con: _Container, key: str, node: Any) -> None:
    if isinstance(con, dict):
        con[key] = node
        return
    if isinstance(con, _NilMap):
        raise _Panicked
    if key == "-":
        con.append(node)
        return
    try:
        idx = _atoi(key)
    except _Failed as e:
        raise _Failed(f"value was not a proper array index: '{key}': {e}") from None
    size = len(con) + 1
    if idx >= size:
        raise _Failed(f"Unable to access invalid index: {idx}: {_BAD_INDEX}")
    con.insert(_negative(idx, size) if idx < 0 else idx, node)


def _remove(con: _Container, key: str) -> None:
    if isinstance(con, dict):
        if key not in con:
            raise _Failed(f"Unable to remove nonexistent key: {key}: {_MISSING}")
        del con[key]
        return
    if isinstance(con, _NilMap):
        raise _Failed(f"Unable to remove nonexistent key: {key}: {_MISSING}")
    idx = _atoi(key)
    if idx >= len(con):
        raise _Failed(f"Unable to access invalid index: {idx}: {_BAD_INDEX}")
    del con[_negative(idx, len(con)) if idx < 0 else idx]


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _find(root: Any, path: str) -> tuple[_Container, str] | None:
    """``findObject``: the container holding the pointer's last token, and that token; what
    precedes the first ``/`` is ignored."""
    split = path.split("/")
    if len(split) < 2:
        return None
    con: _Container = root
    for part in split[1:-1]:
        try:
            node = _get(con, _unescape(part))
        except _Failed:
            return None
        if isinstance(node, dict | list):
            con = node
        elif isinstance(node, _Leaf) and node.raw == _RAW_NULL:
            con = _NilMap()
        else:  # missing, null, or a scalar
            return None
    return con, _unescape(split[-1])


_EQUAL = frozenset({"equal"})
_UNEQUAL = frozenset({"unequal"})
_PANIC = frozenset({"panic"})


def _equal(n: Any, o: Any) -> bool:
    """``lazyNode.equal``: ``n`` a node of the document, ``o`` one of the patch value."""
    outcomes = _outcomes(n, o)
    if outcomes == _EQUAL:
        return True
    if outcomes == _UNEQUAL:
        return False
    if outcomes == _PANIC:
        raise _Panicked
    raise _Undecided


def _outcomes(n: Any, o: Any) -> frozenset[str]:
    """What ``n.equal(o)`` can do: be true, or be false and/or panic — both when Go's random
    map iteration order decides whether a mismatch or a nil element is met first."""
    if n is None or o is None:
        return _PANIC
    if isinstance(n, _Leaf) and n.raw == _RAW_NULL:
        n = {}  # reads as a (nil) map
    if isinstance(n, _Leaf):
        return _EQUAL if isinstance(o, _Leaf) and n.raw == o.raw else _UNEQUAL
    if isinstance(n, dict):
        if not isinstance(o, dict) or len(n) != len(o):
            return _UNEQUAL
        found: set[str] = set()
        for key, value in n.items():  # in any order: every member's failure can come first
            other = o.get(key)
            if key not in o or (value is None) != (other is None):
                found.add("unequal")
            elif value is not None:
                found |= _outcomes(value, other) - _EQUAL
        return frozenset(found) or _EQUAL
    if not isinstance(o, list) or len(n) != len(o):
        return _UNEQUAL
    for value, other in zip(n, o, strict=True):  # in order: the first failure ends it
        outcomes = _outcomes(value, other)
        if outcomes != _EQUAL:
            return outcomes
    return _EQUAL


# -- operations --------------------------------------------------------------------------------


def _pointer(op: dict[str, Any], name: str, missing: str) -> str:
    value = op.get(name)
    if not isinstance(value, str):  # null, or not a string (only with fieldValidation=Ignore)
        raise _Failed(missing)
    return value


def _found(root: Any, path: str, message: str) -> tuple[_Container, str]:
    found = _find(root, path)
    if found is None:
        raise _Failed(message)
    return found


def _apply(root: Any, op: dict[str, Any], copied: list[int]) -> Any:
    """``root`` after one operation (the root itself changes only by ``replace ""``)."""
    kind = op.get("op") if isinstance(op.get("op"), str) else "unknown"
    no_path = f"operation missing path field: {_MISSING}"
    no_from = f"operation, missing from field: {_MISSING}"
    if kind == "add":
        path = _pointer(op, "path", f"add operation failed to decode path: {_MISSING}")
        con, key = _found(
            root, path, f'add operation does not apply: doc is missing path: "{path}": {_MISSING}'
        )
        try:
            _add(con, key, _value_node(op))
        except _Failed as e:
            raise _Failed(f"error in add for path: '{path}': {e}") from None
    elif kind == "remove":
        path = _pointer(op, "path", f"remove operation failed to decode path: {_MISSING}")
        con, key = _found(
            root,
            path,
            f'remove operation does not apply: doc is missing path: "{path}": {_MISSING}',
        )
        try:
            _remove(con, key)
        except _Failed as e:
            raise _Failed(f"error in remove for path: '{path}': {e}") from None
    elif kind == "replace":
        path = _pointer(op, "path", f"replace operation failed to decode path: {no_path}")
        if path == "":
            value = _value_node(op)
            if value is None:
                raise _Panicked
            if not isinstance(value, dict | list):
                raise _Failed("replace operation value must be object or array: %!w(<nil>)")
            return value
        con, key = _found(
            root, path, f"replace operation does not apply: doc is missing path: {path}: {_MISSING}"
        )
        try:
            _get(con, key)
        except _Failed:
            raise _Failed(
                f"replace operation does not apply: doc is missing key: {path}: {_MISSING}"
            ) from None
        _set(con, key, _value_node(op))
    elif kind == "move":
        source = _pointer(op, "from", f"move operation failed to decode from: {no_from}")
        con, key = _found(
            root,
            source,
            f"move operation does not apply: doc is missing from path: {source}: {_MISSING}",
        )
        try:
            node = _get(con, key)
            _remove(con, key)
        except _Failed as e:
            raise _Failed(f"error in move for path: '{key}': {e}") from None
        path = _pointer(op, "path", f"move operation failed to decode path: {no_path}")
        con, key = _found(
            root,
            path,
            f"move operation does not apply: doc is missing destination path: {path}: {_MISSING}",
        )
        try:
            _add(con, key, node)
        except _Failed as e:
            raise _Failed(f"error in move for path: '{path}': {e}") from None
    elif kind == "test":
        path = _pointer(op, "path", f"test operation failed to decode path: {no_path}")
        failed = f"testing value {path} failed: test failed"
        value = _value_node(op)
        if path == "":
            if value is None:
                raise _Panicked
            if isinstance(value, _Leaf) or not _equal(root, value):
                raise _Failed(failed)
            return root
        con, key = _found(
            root, path, f"test operation does not apply: is missing path: {path}: {_MISSING}"
        )
        try:
            node = _get(con, key)
        except _Failed as e:
            raise _Failed(f"error in test for path: '{path}': {e}") from None
        if node is None:
            if value is None or (isinstance(value, _Leaf) and value.raw is None):
                return root
            raise _Failed(failed)
        if value is None or not _equal(node, value):
            raise _Failed(failed)
    elif kind == "copy":
        source = _pointer(op, "from", f"copy operation failed to decode from: {no_from}")
        con, key = _found(
            root,
            source,
            f"copy operation does not apply: doc is missing from path: {source}: {_MISSING}",
        )
        try:
            node = _get(con, key)
        except _Failed as e:
            raise _Failed(f"error in copy for from: '{source}': {e}") from None
        path = _pointer(op, "path", f"copy operation failed to decode path: {_MISSING}")
        con, key = _found(
            root,
            path,
            f"copy operation does not apply: doc is missing destination path: {path}: {_MISSING}",
        )
        node, size = _deep_copy(node)
        copied[0] += size
        if copied[0] > MAX_COPY_BYTES:
            raise _Failed(
                "Unable to complete the copy, the accumulated size increase of copy is "
                f"{copied[0]}, exceeding the limit {MAX_COPY_BYTES}"
            )
        try:
            _add(con, key, node)
        except _Failed as e:
            raise _Failed(f"error while adding value during copy: {e}") from None
    else:
        raise _Failed(f"Unexpected kind: {kind}")
    return root
