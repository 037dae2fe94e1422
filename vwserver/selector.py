"""Kubernetes label selectors: parsing, validation, matching and canonical rendering.

vwserver shows a client only the objects whose labels match a selector, so this module is the
security boundary of every slice: if it disagrees with the kube-apiserver about what
``labelSelector=...`` means, a client sees (or may write) objects it should not. It therefore
reproduces the reference implementation rather than an approximation of it:

* the string syntax and its lexer quirks follow ``k8s.io/apimachinery/pkg/labels/selector.go``
  (``Parse``), including ``x in ()`` meaning "x is the empty string", empty values after ``=``,
  trailing commas *inside* a value set, and ``in``/``notin`` being ordinary words in key and value
  positions;
* the ``metav1.LabelSelector`` object form follows ``LabelSelectorAsSelector`` in
  ``pkg/apis/meta/v1/helpers.go`` plus the checks of ``ValidateLabelSelector`` in
  ``pkg/apis/meta/v1/validation``;
* keys and values are validated like ``content.IsLabelKey`` / ``IsLabelValue``
  (``pkg/util/validation``), with the same messages, so errors read like the apiserver's.

The module is pure (no I/O, no clock, no globals that change) so that it can be tested
exhaustively with property tests and called from any thread or event loop. Selectors are
immutable values: requirements are kept sorted (Kubernetes sorts them by key, too) and
deduplicated, which makes ``==``, ``hash`` and :meth:`Selector.render` canonical — two selectors
that were written differently but say the same thing requirement-for-requirement compare equal
and render to the same string, which is what caches and log lines need.

:meth:`Selector.matches` sits on the hot path (it runs once per object of a LIST that can hold
100k objects), so each selector precomputes, at construction, a flat plan of ``(kind, key,
frozenset(values), bound)`` and whether it matches an object without labels at all; matching is
then one pass with dictionary look-ups and no allocation.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from vwserver.errors import SelectorError

__all__ = ["Operator", "Requirement", "Selector", "label_key_problems", "label_value_problems"]


class Operator(enum.StrEnum):
    """A requirement's operator; the values are those of ``k8s.io/apimachinery/pkg/selection``."""

    IN = "in"
    NOT_IN = "notin"
    EQUALS = "="
    DOUBLE_EQUALS = "=="
    NOT_EQUALS = "!="
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    # Only reachable through the string syntax (``x>1``); metav1.LabelSelector cannot express
    # them (ParseToLabelSelector rejects them too).
    GREATER_THAN = "gt"
    LESS_THAN = "lt"


# --- validation (pkg/api/validate/content, formerly pkg/util/validation) ---------------------

_LABEL_KEY_FMT: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_KEY_RE: Final = re.compile(_LABEL_KEY_FMT)
_LABEL_KEY_MSG: Final = (
    "must consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
_LABEL_NAME_MAX: Final = 63
_LABEL_VALUE_FMT: Final = f"({_LABEL_KEY_FMT})?"
_LABEL_VALUE_RE: Final = re.compile(_LABEL_VALUE_FMT)
_LABEL_VALUE_MSG: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character"
)
_LABEL_VALUE_MAX: Final = 63
_DNS1123_LABEL_FMT: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT: Final = rf"{_DNS1123_LABEL_FMT}(\.{_DNS1123_LABEL_FMT})*"
_DNS1123_SUBDOMAIN_RE: Final = re.compile(_DNS1123_SUBDOMAIN_FMT)
_DNS1123_SUBDOMAIN_MSG: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character"
)
_DNS1123_SUBDOMAIN_MAX: Final = 253
# Go's strconv.ParseInt(s, 10, 64): optional sign, ASCII digits only, no underscores.
_INT64_RE: Final = re.compile("[+-]?[0-9]+")
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
# Offending values are echoed in messages; cap them so a megabyte-long selector cannot produce a
# megabyte-long Status body.
_MAX_ECHO: Final = 100


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    # Same wording as content.RegexError, so messages match the apiserver's.
    shown = " or ".join(f"'{e}'" for e in examples)
    return f"{msg} (e.g. {shown}, regex used for validation is '{fmt}')"


def _max_len_error(length: int) -> str:
    return f"must be no more than {length} bytes"


def _nbytes(text: str) -> int:
    # Go measures strings in bytes; only matters for the wording of errors on non-ASCII input.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _quote(value: object) -> str:
    """*value* as JSON (strings double-quoted, like Go's %q in field errors), capped in length."""
    if isinstance(value, tuple):
        value = list(value)
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = json.dumps(repr(value))
    return text if len(text) <= _MAX_ECHO else text[:_MAX_ECHO] + "..."


def label_key_problems(key: str) -> list[str]:
    """Why *key* is not a valid label key (``content.IsLabelKey``); empty if it is valid.

    A key is an optional DNS-1123 subdomain prefix (at most 253 bytes) and ``/``, then a name of
    at most 63 bytes matching ``([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]``.
    """
    problems: list[str] = []
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            problems.append("prefix part must be non-empty")
        else:
            if _nbytes(prefix) > _DNS1123_SUBDOMAIN_MAX:
                problems.append("prefix part " + _max_len_error(_DNS1123_SUBDOMAIN_MAX))
            if not _DNS1123_SUBDOMAIN_RE.fullmatch(prefix):
                problems.append(
                    "prefix part "
                    + _regex_error(_DNS1123_SUBDOMAIN_MSG, _DNS1123_SUBDOMAIN_FMT, "example.com")
                )
    else:
        # More than one '/': IsLabelKey reports this single message and stops.
        return [
            "a valid label key "
            + _regex_error(_LABEL_KEY_MSG, _LABEL_KEY_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        problems.append("name part must be non-empty")
    elif _nbytes(name) > _LABEL_NAME_MAX:
        problems.append("name part " + _max_len_error(_LABEL_NAME_MAX))
    if not _LABEL_KEY_RE.fullmatch(name):
        problems.append(
            "name part "
            + _regex_error(_LABEL_KEY_MSG, _LABEL_KEY_FMT, "MyName", "my.name", "123-abc")
        )
    return problems


def label_value_problems(value: str) -> list[str]:
    """Why *value* is not a valid label value (``content.IsLabelValue``); empty if it is valid."""
    problems: list[str] = []
    if _nbytes(value) > _LABEL_VALUE_MAX:
        problems.append(_max_len_error(_LABEL_VALUE_MAX))
    if not _LABEL_VALUE_RE.fullmatch(value):
        problems.append(
            _regex_error(_LABEL_VALUE_MSG, _LABEL_VALUE_FMT, "MyValue", "my_value", "12345")
        )
    return problems


def _parse_int64(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 64)``; ``None`` where Go returns an error."""
    if not _INT64_RE.fullmatch(text):
        return None
    number = int(text)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


def _join(path: str, child: str) -> str:
    return f"{path}.{child}" if path else child


def _key_problems(key: object, *, path: str) -> list[str]:
    if not isinstance(key, str):
        return [f"{path}: Invalid value: {_quote(key)}: must be a string"]
    return [f"{path}: Invalid value: {_quote(key)}: {p}" for p in label_key_problems(key)]


def _one_value_problems(value: object, *, path: str) -> list[str]:
    if not isinstance(value, str):
        return [f"{path}: Invalid value: {_quote(value)}: must be a string"]
    return [f"{path}: Invalid value: {_quote(value)}: {p}" for p in label_value_problems(value)]


def _value_problems(values: Sequence[object], *, path: str) -> list[str]:
    return [p for i, v in enumerate(values) for p in _one_value_problems(v, path=f"{path}[{i}]")]


def _requirement_problems(
    key: object, operator: object, values: Sequence[object], *, path: str
) -> list[str]:
    """Everything ``labels.NewRequirement`` rejects, as ``"<field path>: <problem>"`` strings."""
    values_path = _join(path, "values")
    problems = _key_problems(key, path=_join(path, "key"))
    count = len(values)
    if operator in (Operator.IN, Operator.NOT_IN):
        if count == 0:
            problems.append(
                f"{values_path}: Invalid value: []: "
                "for 'in', 'notin' operators, values set can't be empty"
            )
    elif operator in (Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.NOT_EQUALS):
        if count != 1:
            problems.append(
                f"{values_path}: Invalid value: {_quote(values)}: "
                "exact-match compatibility requires one single value"
            )
    elif operator in (Operator.EXISTS, Operator.DOES_NOT_EXIST):
        if count != 0:
            problems.append(
                f"{values_path}: Invalid value: {_quote(values)}: "
                "values set must be empty for exists and does not exist"
            )
    elif operator in (Operator.GREATER_THAN, Operator.LESS_THAN):
        if count != 1:
            problems.append(
                f"{values_path}: Invalid value: {_quote(values)}: "
                "for 'Gt', 'Lt' operators, exactly one value is required"
            )
        problems.extend(
            f"{values_path}[{i}]: Invalid value: {_quote(v)}: "
            "for 'Gt', 'Lt' operators, the value must be an integer"
            for i, v in enumerate(values)
            if isinstance(v, str) and _parse_int64(v) is None
        )
    else:
        supported = ", ".join(json.dumps(op.value) for op in Operator)
        problems.append(
            f"{_join(path, 'operator')}: Unsupported value: {_quote(operator)}: "
            f"supported values: {supported}"
        )
    problems.extend(_value_problems(values, path=values_path))
    return problems


# --- requirements -----------------------------------------------------------------------------

# Matching kinds, precomputed per requirement so matches() does one integer comparison instead
# of an enum dispatch. The groups follow Requirement.Matches in selector.go.
_KIND_IN: Final = 0  # in, =, ==: the key must be present with one of the values
_KIND_NOT_IN: Final = 1  # notin, !=: absent, or present with none of the values
_KIND_EXISTS: Final = 2
_KIND_NOT_EXISTS: Final = 3
_KIND_GT: Final = 4
_KIND_LT: Final = 5
_KINDS: Final[Mapping[Operator, int]] = {
    Operator.IN: _KIND_IN,
    Operator.EQUALS: _KIND_IN,
    Operator.DOUBLE_EQUALS: _KIND_IN,
    Operator.NOT_IN: _KIND_NOT_IN,
    Operator.NOT_EQUALS: _KIND_NOT_IN,
    Operator.EXISTS: _KIND_EXISTS,
    Operator.DOES_NOT_EXIST: _KIND_NOT_EXISTS,
    Operator.GREATER_THAN: _KIND_GT,
    Operator.LESS_THAN: _KIND_LT,
}
_SET_OPERATORS: Final = frozenset({Operator.IN, Operator.NOT_IN})
_EXACT_OPERATORS: Final = frozenset({Operator.EQUALS, Operator.DOUBLE_EQUALS})
_GT_LT: Final = frozenset({Operator.GREATER_THAN, Operator.LESS_THAN})
_ABSENT_OK: Final = frozenset({_KIND_NOT_IN, _KIND_NOT_EXISTS})
_NO_LABELS: Final[Mapping[str, str]] = MappingProxyType({})


def _compare_int64(label: str | None, kind: int, bound: int) -> bool:
    # gt/lt (Requirement.Matches): the label must be present and parse as an int64.
    number = None if label is None else _parse_int64(label)
    if number is None:
        return False
    return number > bound if kind == _KIND_GT else number < bound


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``key <operator> values`` term of a selector; a selector is the AND of its terms.

    Construction validates like ``labels.NewRequirement`` and raises :class:`SelectorError`.
    ``values`` is stored sorted and deduplicated: matching is set membership, and a canonical
    order makes equal requirements compare (and render) equal.
    """

    key: str
    operator: Operator
    values: tuple[str, ...] = ()
    _kind: int = dataclasses.field(init=False, repr=False, compare=False)
    _allowed: frozenset[str] = dataclasses.field(init=False, repr=False, compare=False)
    _bound: int = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        raw_values: object = self.values
        if isinstance(raw_values, str) or not isinstance(raw_values, Iterable):
            raise SelectorError(f"values: Invalid value: {_quote(raw_values)}: must be a list")
        values = tuple(raw_values)
        problems = _requirement_problems(self.key, self.operator, values, path="")
        if problems:
            raise SelectorError("; ".join(problems))
        operator = Operator(self.operator)
        values = tuple(sorted(set(values)))
        object.__setattr__(self, "operator", operator)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "_kind", _KINDS[operator])
        object.__setattr__(self, "_allowed", frozenset(values))
        bound = _parse_int64(values[0]) if operator in _GT_LT else None
        object.__setattr__(self, "_bound", 0 if bound is None else bound)

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Whether *labels* satisfy this requirement (``Requirement.Matches`` in selector.go).

        ``!=`` and ``notin`` match when the key is absent; ``=``, ``==`` and ``in`` need it.
        """
        if labels is None:
            labels = _NO_LABELS
        kind = self._kind
        if kind == _KIND_IN:
            return labels.get(self.key) in self._allowed
        if kind == _KIND_NOT_IN:
            return labels.get(self.key) not in self._allowed
        if kind == _KIND_EXISTS:
            return self.key in labels
        if kind == _KIND_NOT_EXISTS:
            return self.key not in labels
        return _compare_int64(labels.get(self.key), kind, self._bound)

    def render(self) -> str:
        """The requirement in selector syntax, as ``Requirement.String()`` writes it."""
        op = self.operator
        if op is Operator.EXISTS:
            return self.key
        if op is Operator.DOES_NOT_EXIST:
            return "!" + self.key
        if op in _SET_OPERATORS:
            # A set holding only "" renders as "()", which the parser reads back as {""}.
            return f"{self.key} {op.value} ({','.join(self.values)})"
        symbol = ">" if op is Operator.GREATER_THAN else "<" if op is Operator.LESS_THAN else op
        return f"{self.key}{symbol}{self.values[0]}"

    def __str__(self) -> str:
        return self.render()


def _sort_key(requirement: Requirement) -> tuple[str, str, tuple[str, ...]]:
    # Kubernetes sorts by key only (with an unstable sort); ordering ties by operator and values
    # as well makes the order total, hence the rendering canonical.
    return (requirement.key, requirement.operator.value, requirement.values)


# --- the string syntax (labels.Parse) -------------------------------------------------------


class _Tok(enum.Enum):
    END = enum.auto()
    CLOSE_PAREN = enum.auto()
    COMMA = enum.auto()
    NOT = enum.auto()  # "!"
    DOUBLE_EQUALS = enum.auto()
    EQUALS = enum.auto()
    GREATER = enum.auto()
    IDENT = enum.auto()
    IN = enum.auto()
    LESS = enum.auto()
    NOT_EQUALS = enum.auto()
    NOT_IN = enum.auto()
    OPEN_PAREN = enum.auto()


_SYMBOLS: Final[Mapping[str, _Tok]] = {
    ")": _Tok.CLOSE_PAREN,
    ",": _Tok.COMMA,
    "!": _Tok.NOT,
    "==": _Tok.DOUBLE_EQUALS,
    "=": _Tok.EQUALS,
    ">": _Tok.GREATER,
    "<": _Tok.LESS,
    "!=": _Tok.NOT_EQUALS,
    "(": _Tok.OPEN_PAREN,
}
_KEYWORDS: Final[Mapping[str, _Tok]] = {"in": _Tok.IN, "notin": _Tok.NOT_IN}
_SPECIAL: Final = frozenset("=!(),><")
# isWhitespace in selector.go: exactly these four; "\v", "\f" etc. are identifier characters.
_WHITESPACE: Final = frozenset(" \t\r\n")
_BINARY_OPERATORS: Final = "in, notin, =, ==, !=, gt, lt"
_Token = tuple[_Tok, str]


def _lex(text: str) -> list[_Token]:
    """Tokenise like selector.go's ``Lexer``.

    Go's lexer reads bytes and uses NUL as its end-of-input sentinel, so a NUL where a token
    starts ends the input, and a NUL right after a token is swallowed as a separator. We copy
    that, so a selector with an embedded NUL means here what it means to the apiserver.
    """
    tokens: list[_Token] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos] in _WHITESPACE:
            pos += 1
        if pos >= end or text[pos] == "\0":
            tokens.append((_Tok.END, ""))
            return tokens
        if text[pos] in _SPECIAL:
            # Longest match: "==" and "!=" are the only two-character symbols.
            literal = text[pos : pos + 2]
            if literal not in _SYMBOLS:
                literal = text[pos]
            pos += len(literal)
            tokens.append((_SYMBOLS[literal], literal))
        else:
            start = pos
            while pos < end and not (
                text[pos] in _SPECIAL or text[pos] in _WHITESPACE or text[pos] == "\0"
            ):
                pos += 1
            literal = text[start:pos]
            tokens.append((_KEYWORDS.get(literal, _Tok.IDENT), literal))
        if pos < end and text[pos] == "\0":
            pos += 1


class _ParseError(Exception):
    """A syntax error; :meth:`Selector.parse` turns it into a SelectorError naming the field."""


class _Parser:
    """Recursive descent over the token list, following selector.go's ``Parser`` step by step."""

    __slots__ = ("_pos", "_tokens")

    def __init__(self, tokens: list[_Token]) -> None:
        self._tokens = tokens
        self._pos = 0

    def _peek(self, *, values_context: bool = True) -> _Token:
        # In the "Values" context of selector.go, 'in' and 'notin' are plain identifiers; only
        # in operator position are they keywords ("in in (in)" is a valid selector).
        tok, literal = self._tokens[self._pos]
        if values_context and tok in (_Tok.IN, _Tok.NOT_IN):
            return _Tok.IDENT, literal
        return tok, literal

    def _next(self, *, values_context: bool = True) -> _Token:
        token = self._peek(values_context=values_context)
        self._pos += 1
        return token

    def parse(self) -> list[Requirement]:
        requirements: list[Requirement] = []
        tok, literal = self._peek()
        if tok is _Tok.END:
            return requirements
        while True:
            if tok not in (_Tok.IDENT, _Tok.NOT):
                raise _ParseError(f"found '{literal}', expected: !, identifier, or 'end of string'")
            requirements.append(self._requirement())
            tok, literal = self._next()
            if tok is _Tok.END:
                return requirements
            if tok is not _Tok.COMMA:
                raise _ParseError(f"found '{literal}', expected: ',' or 'end of string'")
            # A trailing or doubled comma between requirements is an error ("x,,y", "a=b,").
            tok, literal = self._peek()
            if tok not in (_Tok.IDENT, _Tok.NOT):
                raise _ParseError(f"found '{literal}', expected: identifier after ','")

    def _requirement(self) -> Requirement:
        try:
            key, operator = self._key_and_inferred_operator()
            values: list[str] = []
            if operator is None:
                operator = self._operator()
                values = self._set_values() if operator in _SET_OPERATORS else self._exact_value()
        except _ParseError as e:
            raise _ParseError(f"unable to parse requirement: {e}") from None
        try:
            return Requirement(key, operator, tuple(values))
        except SelectorError as e:
            raise _ParseError(f"unable to parse requirement: {e.message}") from None

    def _key_and_inferred_operator(self) -> tuple[str, Operator | None]:
        operator: Operator | None = None
        tok, literal = self._next()
        if tok is _Tok.NOT:
            operator = Operator.DOES_NOT_EXIST
            tok, literal = self._next()
        if tok is not _Tok.IDENT:
            raise _ParseError(f"found '{literal}', expected: identifier")
        # selector.go validates the key before looking at the rest of the requirement.
        problems = label_key_problems(literal)
        if problems:
            raise _ParseError(f"key: Invalid value: {_quote(literal)}: {'; '.join(problems)}")
        if operator is None and self._peek()[0] in (_Tok.END, _Tok.COMMA):
            operator = Operator.EXISTS
        # "!x=a" leaves "=" for parse(), which rejects it: "!" takes no operator or value.
        return literal, operator

    def _operator(self) -> Operator:
        tok, literal = self._next(values_context=False)
        operator = _OPERATOR_TOKENS.get(tok)
        if operator is None:
            raise _ParseError(f"found '{literal}', expected: {_BINARY_OPERATORS}")
        return operator

    def _set_values(self) -> list[str]:
        tok, literal = self._next()
        if tok is not _Tok.OPEN_PAREN:
            raise _ParseError(f"found '{literal}' expected: '('")
        tok, literal = self._peek()
        if tok is _Tok.CLOSE_PAREN:
            # "x in ()" is not an empty set but the set holding the empty string (parseValues).
            self._next()
            return [""]
        if tok not in (_Tok.IDENT, _Tok.COMMA):
            raise _ParseError(f"found '{literal}', expected: ',', ')' or identifier")
        values = self._identifier_list()
        self._next()  # the ")" that _identifier_list stopped at
        return values

    def _identifier_list(self) -> list[str]:
        # parseIdentifiersList: values are separated by commas, and an omitted value between,
        # before or after commas is the empty string: "(a,)", "(,a)", "(a,,b)" all hold "".
        values: list[str] = []
        while True:
            tok, literal = self._next()
            if tok is _Tok.IDENT:
                values.append(literal)
                tok, literal = self._peek()
                if tok is _Tok.CLOSE_PAREN:
                    return values
                if tok is not _Tok.COMMA:
                    raise _ParseError(f"found '{literal}', expected: ',' or ')'")
            elif tok is _Tok.COMMA:
                following = self._peek()[0]
                if not values or following in (_Tok.CLOSE_PAREN, _Tok.COMMA):
                    values.append("")
                if following is _Tok.CLOSE_PAREN:
                    return values
            else:
                raise _ParseError(f"found '{literal}', expected: ',', or identifier")

    def _exact_value(self) -> list[str]:
        # "x=" and "x=,y" are valid and mean the empty value (parseExactValue).
        if self._peek()[0] in (_Tok.END, _Tok.COMMA):
            return [""]
        tok, literal = self._next()
        if tok is not _Tok.IDENT:
            raise _ParseError(f"found '{literal}', expected: identifier")
        return [literal]


_OPERATOR_TOKENS: Final[Mapping[_Tok, Operator]] = {
    _Tok.IN: Operator.IN,
    _Tok.NOT_IN: Operator.NOT_IN,
    _Tok.EQUALS: Operator.EQUALS,
    _Tok.DOUBLE_EQUALS: Operator.DOUBLE_EQUALS,
    _Tok.NOT_EQUALS: Operator.NOT_EQUALS,
    _Tok.GREATER: Operator.GREATER_THAN,
    _Tok.LESS: Operator.LESS_THAN,
}

# --- the metav1.LabelSelector object form ------------------------------------------------------

_LABEL_SELECTOR_OPERATORS: Final[Mapping[str, Operator]] = {
    "In": Operator.IN,
    "NotIn": Operator.NOT_IN,
    "Exists": Operator.EXISTS,
    "DoesNotExist": Operator.DOES_NOT_EXIST,
}
_LABEL_SELECTOR_FIELDS: Final = frozenset({"matchLabels", "matchExpressions"})
_EXPRESSION_FIELDS: Final = frozenset({"key", "operator", "values"})


def _unknown_fields(obj: Mapping[object, object], known: frozenset[str], path: str) -> list[str]:
    return [
        f"{path}: unknown field {_quote(name)}"
        for name in sorted((k for k in obj if k not in known), key=str)
    ]


def _expression(
    expr: object, *, path: str, problems: list[str]
) -> tuple[str, Operator, tuple[str, ...]] | None:
    """One ``matchExpressions`` item → (key, operator, values); None after noting problems.

    Checks follow ``ValidateLabelSelectorRequirement`` (and its wording) plus the operator
    switch of ``LabelSelectorAsSelector``.
    """
    if not isinstance(expr, Mapping):
        problems.append(f"{path}: Invalid value: {_quote(expr)}: must be an object")
        return None
    before = len(problems)
    problems.extend(_unknown_fields(expr, _EXPRESSION_FIELDS, path))
    key, raw_operator, raw_values = expr.get("key"), expr.get("operator"), expr.get("values")
    if key is None:
        problems.append(f"{path}.key: Required value")
    values: tuple[object, ...] = ()
    if raw_values is not None:  # an absent "values" and JSON null both mean "no values"
        if isinstance(raw_values, str) or not isinstance(raw_values, Sequence):
            problems.append(f"{path}.values: Invalid value: {_quote(raw_values)}: must be a list")
        else:
            values = tuple(raw_values)
    operator: Operator | None = None
    if raw_operator is None:
        problems.append(f"{path}.operator: Required value")
    elif not isinstance(raw_operator, str) or raw_operator not in _LABEL_SELECTOR_OPERATORS:
        supported = ", ".join(json.dumps(name) for name in _LABEL_SELECTOR_OPERATORS)
        problems.append(
            f"{path}.operator: unsupported operator {_quote(raw_operator)}: "
            f"supported values: {supported}"
        )
    else:
        operator = _LABEL_SELECTOR_OPERATORS[raw_operator]
    if key is not None:
        problems.extend(_key_problems(key, path=f"{path}.key"))
    problems.extend(_value_problems(values, path=f"{path}.values"))
    if operator in _SET_OPERATORS and not values:
        problems.append(
            f"{path}.values: Required value: must be specified when `operator` is 'In' or 'NotIn'"
        )
    elif operator is not None and operator not in _SET_OPERATORS and values:
        problems.append(
            f"{path}.values: Forbidden: may not be specified when `operator` is 'Exists' or "
            "'DoesNotExist'"
        )
    if len(problems) > before or operator is None or not isinstance(key, str):
        return None
    return key, operator, tuple(v for v in values if isinstance(v, str))


# --- selectors ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Selector:
    """An AND of :class:`Requirement` s; the empty selector matches everything.

    ``requirements`` is normalised at construction — sorted by key (then operator and values) and
    deduplicated — so equality and :meth:`render` are canonical.
    """

    requirements: tuple[Requirement, ...] = ()
    # Precomputed for matches(), which runs once per object of a LIST: one flat tuple of
    # (kind, key, values, bound) is the cheapest thing to walk in CPython.
    _plan: tuple[tuple[int, str, frozenset[str], int], ...] = dataclasses.field(
        init=False, repr=False, compare=False
    )
    _matches_no_labels: bool = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        given: tuple[object, ...] = tuple(self.requirements)
        requirements = tuple(r for r in given if isinstance(r, Requirement))
        if len(requirements) != len(given):
            raise TypeError(f"Selector requirements must be Requirement objects, got {given!r}")
        requirements = tuple(sorted(set(requirements), key=_sort_key))
        object.__setattr__(self, "requirements", requirements)
        object.__setattr__(
            self, "_plan", tuple((r._kind, r.key, r._allowed, r._bound) for r in requirements)
        )
        # Only notin, != and ! are satisfied by an object without labels.
        object.__setattr__(
            self, "_matches_no_labels", all(r._kind in _ABSENT_OK for r in requirements)
        )

    @classmethod
    def parse(cls, text: str, *, field: str = "labelSelector") -> Selector:
        """Parse the string syntax of ``labels.Parse``; ``""`` is the empty selector.

        ``field`` names the source of *text* in error messages (e.g. the query parameter).
        """
        raw: object = text
        if not isinstance(raw, str):
            raise SelectorError(f"{field}: Invalid value: {_quote(raw)}: must be a string")
        try:
            requirements = _Parser(_lex(raw)).parse()
        except _ParseError as e:
            raise SelectorError(f"{field}: {e}") from None
        return cls(tuple(requirements))

    @classmethod
    def from_label_selector(cls, obj: Mapping[str, object], *, field: str = "selector") -> Selector:
        """Convert a ``metav1.LabelSelector`` dict, validating like the apiserver.

        ``matchLabels`` become ``=`` requirements; ``matchExpressions`` accept the operators
        ``In``/``NotIn`` (at least one value) and ``Exists``/``DoesNotExist`` (no values). An
        empty selector (``{}``, or both lists empty) matches everything, as in
        ``LabelSelectorAsSelector``. All problems are reported together, each prefixed with its
        field path below *field*.
        """
        raw: object = obj
        if not isinstance(raw, Mapping):
            raise SelectorError(f"{field}: Invalid value: {_quote(raw)}: must be an object")
        problems = _unknown_fields(raw, _LABEL_SELECTOR_FIELDS, field)
        collected: list[tuple[str, Operator, tuple[str, ...]]] = []

        match_labels = raw.get("matchLabels")
        labels_path = f"{field}.matchLabels"
        if isinstance(match_labels, Mapping):
            for key, value in match_labels.items():
                # ValidateLabels reports key problems against the matchLabels path itself; a bad
                # value is reported under matchLabels[key] so the message names the label.
                found = _key_problems(key, path=labels_path)
                found += _one_value_problems(value, path=f"{labels_path}[{key}]")
                problems.extend(found)
                if not found:
                    collected.append((key, Operator.EQUALS, (value,)))
        elif match_labels is not None:
            problems.append(
                f"{labels_path}: Invalid value: {_quote(match_labels)}: must be an object"
            )

        expressions = raw.get("matchExpressions")
        expressions_path = f"{field}.matchExpressions"
        if isinstance(expressions, Sequence) and not isinstance(expressions, str):
            for index, expr in enumerate(expressions):
                parsed = _expression(expr, path=f"{expressions_path}[{index}]", problems=problems)
                if parsed is not None:
                    collected.append(parsed)
        elif expressions is not None:
            problems.append(
                f"{expressions_path}: Invalid value: {_quote(expressions)}: must be a list"
            )

        if problems:
            raise SelectorError("; ".join(problems))
        return cls(tuple(Requirement(key, op, values) for key, op, values in collected))

    def matches_each(self, labels: Sequence[Mapping[str, str] | None]) -> list[bool]:
        """:meth:`matches` of each of ``labels`` (a LIST page's objects), in one comprehension
        where the selector is one or two ``=``/``in`` requirements — a slice's usual selector —
        instead of one call per object. Same semantics: a missing label (or no labels at all)
        is never one of the values."""
        plan = self._plan
        if not plan:
            return [True] * len(labels)
        if len(plan) == 1 and plan[0][0] == _KIND_IN:
            _, key, values, _ = plan[0]
            return [ls is not None and ls.get(key) in values for ls in labels]
        if len(plan) == 2 and plan[0][0] == plan[1][0] == _KIND_IN:
            (_, k1, v1, _), (_, k2, v2, _) = plan
            return [ls is not None and ls.get(k1) in v1 and ls.get(k2) in v2 for ls in labels]
        matches = self.matches
        return [matches(ls) for ls in labels]

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Whether an object with *labels* (``None``: no labels) is selected."""
        if not labels:
            return self._matches_no_labels
        get = labels.get
        # Same semantics as Requirement.matches, inlined. A missing label reads as None, which
        # is never in a set of strings: "in" fails and "notin" passes, as in selector.go.
        for kind, key, values, bound in self._plan:
            if kind == _KIND_IN:
                if get(key) not in values:
                    return False
            elif kind == _KIND_NOT_IN:
                if get(key) in values:
                    return False
            elif kind == _KIND_EXISTS:
                if key not in labels:
                    return False
            elif kind == _KIND_NOT_EXISTS:
                if key in labels:
                    return False
            elif not _compare_int64(get(key), kind, bound):
                return False
        return True

    def render(self) -> str:
        """The canonical string form (``Selector.String()``); ``parse(render(s)) == s``."""
        return ",".join(requirement.render() for requirement in self.requirements)

    def __str__(self) -> str:
        return self.render()

    def implies(self, other: Selector) -> bool:
        """Whether every label set this selector matches is matched by ``other`` too, as far
        as their requirements tell: each of ``other``'s is one of this one's (an AND of
        requirements matches only what each of them matches). False does not mean it does
        not; it is asked to skip a second, redundant match."""
        mine = set(self.requirements)
        return all(r in mine for r in other.requirements)

    def __and__(self, other: object) -> Selector:
        """Both selectors at once: the AND of all their requirements."""
        if not isinstance(other, Selector):
            return NotImplemented
        if not other.requirements:
            return self
        if not self.requirements:
            return other
        return Selector(self.requirements + other.requirements)

    @property
    def is_empty(self) -> bool:
        """True if the selector has no requirements, i.e. matches everything."""
        return not self.requirements

    def required_labels(self) -> dict[str, str]:
        """Labels an object must carry to match: from ``=``, ``==`` and single-valued ``in``.

        Mirrors ``RequiresExactMatch``. If a selector pins one key to two different values it
        matches nothing; the first value in canonical order is returned and :meth:`violations`
        reports the conflict.
        """
        required: dict[str, str] = {}
        for requirement in self.requirements:
            if requirement.operator in _EXACT_OPERATORS or (
                requirement.operator is Operator.IN and len(requirement.values) == 1
            ):
                required.setdefault(requirement.key, requirement.values[0])
        return required

    def violations(self, labels: Mapping[str, str] | None) -> list[Requirement]:
        """The requirements *labels* fail, in canonical order; empty iff :meth:`matches`."""
        if labels is None:
            labels = _NO_LABELS
        return [r for r in self.requirements if not r.matches(labels)]

    def to_label_selector(self) -> dict[str, object]:
        """A ``metav1.LabelSelector`` dict selecting the same objects.

        ``=``/``==`` become ``matchLabels`` (a second exact value for the same key, which
        ``matchLabels`` cannot hold, becomes an ``In`` expression); ``!=`` becomes ``NotIn`` with
        one value. ``gt``/``lt`` have no LabelSelector form and raise :class:`SelectorError`
        (as ``metav1.ParseToLabelSelector`` does). Empty parts are omitted, as with
        ``omitempty``; the empty selector gives ``{}``.
        """
        match_labels: dict[str, str] = {}
        expressions: list[tuple[str, str, tuple[str, ...]]] = []
        for requirement in self.requirements:
            op = requirement.operator
            if op in _GT_LT:
                raise SelectorError(
                    f"{requirement.render()}: {op.value!r} isn't supported in label selectors"
                )
            if op in _EXACT_OPERATORS:
                pinned = match_labels.setdefault(requirement.key, requirement.values[0])
                if pinned == requirement.values[0]:
                    continue  # "a=b,a==b": the same requirement spelled twice
                name = "In"
            elif op is Operator.NOT_EQUALS:
                name = "NotIn"
            else:
                name = _LABEL_SELECTOR_NAMES[op]
            expressions.append((requirement.key, name, requirement.values))
        # Deduplicated ("a=b,a==b,a in (b)" all read "a In [b]") and ordered by what the dict
        # shows rather than by our operator symbols, so that converting back and forth is stable.
        expressions = sorted(set(expressions))
        result: dict[str, object] = {}
        if match_labels:
            result["matchLabels"] = match_labels
        if expressions:
            result["matchExpressions"] = [
                {"key": key, "operator": name, "values": list(values)}
                if values
                else {"key": key, "operator": name}
                for key, name, values in expressions
            ]
        return result


_LABEL_SELECTOR_NAMES: Final[Mapping[Operator, str]] = {
    op: name for name, op in _LABEL_SELECTOR_OPERATORS.items()
}
