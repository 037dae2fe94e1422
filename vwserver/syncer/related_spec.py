"""How the syncer finds a primary object's related objects, and names their copies — pure.

A ``resources[].related[]`` entry names the related objects of each primary object in one of
three ways, evaluated over the primary on the *origin* side (the kcp object for origin ``kcp``,
its downstream copy for origin ``downstream``):

* ``reference.path``: the names at a path of the primary, exactly as a slice's
  ``referencedBy.path`` reads them (:func:`vwserver.related.names_at`) — so the syncer and the
  slice that shows it the Secrets agree on which Secrets a MongoDB names;
* ``selector``: every object of the primary's namespace whose labels match;
* ``nameTemplate``: names built from the primary, ``{{ .metadata.name }}-{{ .spec.users[*].db
  }}-{{ .spec.users[*].name }}`` — the MongoDB operator's connection-string Secret
  ``<db>-<authdb>-<user>``, which nothing in the primary names. Placeholders are paths (the
  reference path's syntax, after a ``.``; ``.name``/``.namespace`` stand for ``metadata.name``
  and ``metadata.namespace``); every placeholder with ``[*]`` iterates the *same* list, one name
  per element, so a template can never multiply two lists into names nobody meant. A
  placeholder whose path is not there (or not a string or integer) gives no name for that
  element: not an error, the object is not written yet.

``targetName`` is a template over the related object (no ``[*]``): the copy's name, default the
related object's own.

A bad path or template is a :class:`~vwserver.errors.ConfigError` naming the field
(``$.resources[0].related[1].nameTemplate``), raised when the config is read.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from vwserver.errors import ConfigError, SelectorError
from vwserver.names import OBJECT_NAME_RE
from vwserver.related import MAX_NAMES_PER_OBJECT, Step, names_at, parse_path
from vwserver.selector import Selector

if TYPE_CHECKING:
    from vwserver.syncer.config import RelatedConfig, ResourceConfig

_PLACEHOLDER = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_SHORTHANDS = {"name": "metadata.name", "namespace": "metadata.namespace"}
_MAX_TEMPLATE = 256


@dataclass(frozen=True, slots=True)
class Placeholder:
    """One ``{{ .path }}``: ``each`` the list it iterates (the path up to its ``[*]``, None
    without), ``rest`` the path from there (from the object itself without ``[*]``)."""

    each: tuple[Step, ...] | None
    rest: tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed name template: literal text and placeholders, in order."""

    text: str
    parts: tuple[str | Placeholder, ...]
    each: tuple[Step, ...] | None
    """The one list every ``[*]`` placeholder iterates (None: one name at most)."""

    def render(self, obj: Any, *, limit: int = MAX_NAMES_PER_OBJECT) -> frozenset[str]:
        """The names this template gives for ``obj`` (decoded JSON): valid object names only,
        at most ``limit``."""
        if self.each is None:
            name = self._one(obj, None)
            return frozenset() if name is None else frozenset({name})
        found: set[str] = set()
        for element in _list_at(obj, self.each):
            name = self._one(obj, element)
            if name is not None:
                found.add(name)
                if len(found) >= limit:
                    break
        return frozenset(found)

    def _one(self, obj: Any, element: Any) -> str | None:
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            value = _scalar(element if part.each is not None else obj, part.rest)
            if value is None:
                return None
            out.append(value)
        name = "".join(out)
        return name if len(name) <= 253 and OBJECT_NAME_RE.match(name) else None


def _scalar(value: Any, path: tuple[Step, ...]) -> str | None:
    for step in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(step.name)
    if isinstance(value, bool):
        return None
    if isinstance(value, str | int):
        return str(value)
    return None


def _list_at(obj: Any, path: tuple[Step, ...]) -> list[Any]:
    value = obj
    for step in path:
        if not isinstance(value, Mapping):
            return []
        value = value.get(step.name)
    return value if isinstance(value, list) else []


def parse_template(text: str, *, field: str, lists: bool = True) -> Template:
    """Parse a name template (module docstring); ``lists``: whether ``[*]`` is allowed."""
    if not text or len(text) > _MAX_TEMPLATE:
        raise ConfigError(field, f"must be 1 to {_MAX_TEMPLATE} characters")
    parts: list[str | Placeholder] = []
    each: tuple[Step, ...] | None = None
    at = 0
    for m in _PLACEHOLDER.finditer(text):
        literal = text[at : m.start()]
        _check_literal(literal, text, field=field)
        if literal:
            parts.append(literal)
        at = m.end()
        expr = m.group(1)
        if not expr.startswith(".") or len(expr) < 2:
            raise ConfigError(
                field,
                f"{{{{ {expr} }}}} in {text!r}: a placeholder is a path starting with '.' "
                "({{ .metadata.name }}, {{ .spec.users[*].name }})",
            )
        path_text = _SHORTHANDS.get(expr[1:], expr[1:])
        steps = parse_path(path_text, field=field)
        lists_at = [i for i, s in enumerate(steps) if s.each]
        if len(lists_at) > 1:
            raise ConfigError(field, f"{{{{ {expr} }}}}: at most one [*] per placeholder")
        if lists_at and not lists:
            raise ConfigError(field, f"{{{{ {expr} }}}}: [*] is not allowed here (one name)")
        if not lists_at:
            parts.append(Placeholder(None, steps))
            continue
        i = lists_at[0]
        prefix = tuple(Step(s.name) for s in steps[: i + 1])
        if each is not None and each != prefix:
            raise ConfigError(
                field,
                f"{text!r}: every [*] placeholder must iterate the same list "
                f"(.{_render(each)}[*] and .{_render(prefix)}[*])",
            )
        each = prefix
        parts.append(Placeholder(prefix, steps[i + 1 :]))
    tail = text[at:]
    _check_literal(tail, text, field=field)
    if tail:
        parts.append(tail)
    return Template(text, tuple(parts), each)


def _check_literal(literal: str, text: str, *, field: str) -> None:
    if "{{" in literal or "}}" in literal:
        raise ConfigError(field, f"{text!r}: unbalanced '{{{{' or '}}}}'")


def _render(steps: tuple[Step, ...]) -> str:
    return ".".join(s.name for s in steps)


# --- a compiled related entry ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RelatedSpec:
    """One ``related[]`` entry, compiled: how related objects are found and copied."""

    name: str
    origin: Literal["kcp", "downstream"]
    group: str
    version: str
    resource: str
    kind: str
    path: tuple[Step, ...] | None = None
    selector: Selector | None = None
    template: Template | None = None
    target: Template | None = None
    keys: frozenset[str] = frozenset()
    label: str = ""
    """The value of the copies' ``sync.edge-connect.eu/related`` label: this entry among every
    syncer resource's (its name and a digest of the primary resource)."""

    @property
    def copies_down(self) -> bool:
        return self.origin == "kcp"

    def names(self, primary: Any) -> frozenset[str] | None:
        """The related names ``primary`` (decoded, on the origin side) gives; None for a
        selector (every matching object of the namespace)."""
        if self.path is not None:
            return names_at(primary, self.path)
        if self.template is not None:
            return self.template.render(primary)
        return None

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        return self.selector is not None and self.selector.matches(labels)

    def target_name(self, source: Any) -> str | None:
        """The copy's name for the related object ``source``; None if the template gives
        none."""
        if self.target is None:
            name = (source.get("metadata") or {}).get("name") if isinstance(source, dict) else None
            return str(name) if name else None
        names = self.target.render(source)
        return next(iter(names)) if names else None


def related_label(resource: ResourceConfig, name: str) -> str:
    digest = hashlib.sha256(f"{resource.group}/{resource.resource}".encode()).hexdigest()[:8]
    return f"{name}-{digest}"


def compile_related(
    rel: RelatedConfig, *, field: str, resource: ResourceConfig | None = None
) -> RelatedSpec:
    """Compile one entry; every error names its field below ``field``."""
    ways = [
        w
        for w, v in (
            ("reference", rel.reference),
            ("selector", rel.selector),
            ("nameTemplate", rel.name_template),
        )
        if v is not None
    ]
    if len(ways) != 1:
        raise ConfigError(
            field,
            "give exactly one of reference, selector and nameTemplate"
            + (f" (got {' and '.join(ways)})" if ways else ""),
        )
    path = selector = template = None
    if rel.reference is not None:
        path = parse_path(rel.reference.path, field=f"{field}.reference.path")
    elif rel.selector is not None:
        try:
            selector = Selector.from_label_selector(rel.selector, field=f"{field}.selector")
        except SelectorError as e:
            raise ConfigError(f"{field}.selector", e.message) from e
        if selector.is_empty:
            raise ConfigError(
                f"{field}.selector",
                "selects every object of the namespace; give matchLabels or matchExpressions",
            )
    else:
        assert rel.name_template is not None
        template = parse_template(rel.name_template, field=f"{field}.nameTemplate")
    target = None
    if rel.target_name is not None:
        target = parse_template(rel.target_name, field=f"{field}.targetName", lists=False)
    return RelatedSpec(
        name=rel.name,
        origin=rel.origin,
        group=rel.group,
        version=rel.version,
        resource=rel.resource,
        kind=rel.kind,
        path=path,
        selector=selector,
        template=template,
        target=target,
        keys=frozenset(rel.keys),
        label=related_label(resource, rel.name) if resource is not None else "",
    )


def compile_all(resource: ResourceConfig) -> tuple[RelatedSpec, ...]:
    """Every related entry of a (validated) resource."""
    return tuple(
        compile_related(rel, field=f"related[{i}]", resource=resource)
        for i, rel in enumerate(resource.related)
    )
