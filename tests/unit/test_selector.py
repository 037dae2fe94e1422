"""Tests for vwserver.selector: Kubernetes label-selector parsing, validation and matching.

Example tables are transcribed from k8s.io/apimachinery (cited per table) so that a deviation
from the apiserver's behaviour fails here; property tests cover the rest of the input space.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vwserver.errors import SelectorError
from vwserver.selector import (
    Operator,
    Requirement,
    Selector,
    label_key_problems,
    label_value_problems,
)

# --- strategies ---------------------------------------------------------------------------------

# A small shared pool makes selectors and label sets talk about the same keys and values, so
# matching properties see both hits and misses. "in"/"notin" are keywords of the syntax and valid
# keys/values at the same time, which the parser must disambiguate by position.
_KEY_POOL = ["a", "b", "app", "in", "notin", "example.com/tier", "x.y_z-1"]
_VALUE_POOL = ["", "a", "b", "in", "notin", "v1", "1", "42", "007"]

_ALNUM = "abcxyzABZ0189"
_NAME_INNER = _ALNUM + "-_."
_DNS_INNER = "abz019-"


def _word(first_last: str, inner: str, *, max_inner: int) -> st.SearchStrategy[str]:
    """Strings of the shape ``[first_last]([inner]*[first_last])?`` (the label-name regex)."""
    edge = st.sampled_from(first_last)
    longer = st.tuples(edge, st.text(alphabet=inner, max_size=max_inner), edge).map("".join)
    return edge | longer


_NAME = _word(_ALNUM, _NAME_INNER, max_inner=10)
_DNS_LABEL = _word("abz019", _DNS_INNER, max_inner=6)
_PREFIX = st.lists(_DNS_LABEL, min_size=1, max_size=3).map(".".join)
label_keys = st.one_of(
    st.sampled_from(_KEY_POOL),
    _NAME,
    st.tuples(_PREFIX, _NAME).map("/".join),
)
label_values = st.one_of(st.sampled_from(_VALUE_POOL), _NAME)
int_values = st.integers(min_value=0, max_value=2**63 - 1).map(str)

ALL_OPERATORS = list(Operator)
LABEL_SELECTOR_OPERATORS = [
    Operator.IN,
    Operator.NOT_IN,
    Operator.EXISTS,
    Operator.DOES_NOT_EXIST,
    Operator.EQUALS,
    Operator.DOUBLE_EQUALS,
    Operator.NOT_EQUALS,
]


@st.composite
def requirements(draw: st.DrawFn, operators: list[Operator] = ALL_OPERATORS) -> Requirement:
    key = draw(label_keys)
    op = draw(st.sampled_from(operators))
    values: list[str]
    if op in (Operator.IN, Operator.NOT_IN):
        values = draw(st.lists(label_values, min_size=1, max_size=4))
    elif op in (Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.NOT_EQUALS):
        values = [draw(label_values)]
    elif op in (Operator.GREATER_THAN, Operator.LESS_THAN):
        values = [draw(st.one_of(int_values, st.sampled_from(["0", "1", "42"])))]
    else:
        values = []
    return Requirement(key, op, tuple(values))


def selectors(operators: list[Operator] = ALL_OPERATORS) -> st.SearchStrategy[Selector]:
    return st.lists(requirements(operators), max_size=5).map(lambda rs: Selector(tuple(rs)))


label_sets = (
    st.dictionaries(label_keys, st.one_of(label_values, int_values), max_size=6) | st.none()
)


@st.composite
def label_selector_dicts(draw: st.DrawFn) -> dict[str, object]:
    """metav1.LabelSelector objects as they come out of JSON (parts may be absent or null)."""
    result: dict[str, object] = {}
    match_labels = draw(st.dictionaries(label_keys, label_values, max_size=3))
    keep_empty: bool = draw(st.booleans())
    if match_labels or keep_empty:
        result["matchLabels"] = match_labels
    expressions: list[dict[str, object]] = []
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
        expr: dict[str, object] = {"key": draw(label_keys), "operator": op}
        if op in ("In", "NotIn"):
            expr["values"] = draw(st.lists(label_values, min_size=1, max_size=3))
        elif draw(st.booleans()):
            expr["values"] = draw(st.sampled_from([[], None]))
        expressions.append(expr)
    if expressions or keep_empty:
        result["matchExpressions"] = expressions
    return result


def oracle(selector: Selector, labels: Mapping[str, str] | None) -> bool:
    """An independent, deliberately naive transcription of Requirement.Matches (selector.go)."""
    labels = labels or {}
    for r in selector.requirements:
        present = r.key in labels
        value = labels.get(r.key)
        if r.operator in (Operator.IN, Operator.EQUALS, Operator.DOUBLE_EQUALS):
            ok = present and value in r.values
        elif r.operator in (Operator.NOT_IN, Operator.NOT_EQUALS):
            ok = not present or value not in r.values
        elif r.operator is Operator.EXISTS:
            ok = present
        elif r.operator is Operator.DOES_NOT_EXIST:
            ok = not present
        else:
            is_int64 = (
                value is not None
                and re.fullmatch(r"[+-]?[0-9]+", value) is not None
                and -(2**63) <= int(value) < 2**63
            )
            if value is None or not is_int64:
                ok = False
            elif r.operator is Operator.GREATER_THAN:
                ok = int(value) > int(r.values[0])
            else:
                ok = int(value) < int(r.values[0])
        if not ok:
            return False
    return True


# --- parsing: tables from k8s.io/apimachinery pkg/labels/selector_test.go -------------------


# TestSelectorParse "testGoodStrings": each must parse, and String() equals the input with all
# spaces removed.
@pytest.mark.parametrize(
    "text",
    ["x=a,y=b,z=c", "", "x!=a,y=b", "x=", "x= ", "x=,z= ", "x= ,z= ", "!x", "x>1", "x>1,z<5"],
)
def test_k8s_good_strings_parse_and_restring(text: str) -> None:
    assert Selector.parse(text).render() == text.replace(" ", "")


# TestSelectorParse "testBadStrings" plus the invalid rows of TestSetSelectorParser, and the
# syntax errors named in the vwserver spec.
@pytest.mark.parametrize(
    "text",
    [
        "x=a||y=b",
        "x==a==b",
        "!x=a",
        "x<a",
        "x,,y",
        ",x,y",
        "x nott in (y)",
        "a in (xyz),",
        "a in (xyz)b notin ()",
        "a in (xyz abc)",
        "a notin(",
        "a (",
        "(",
        # vwserver spec: a=b=c, a in b, trailing comma, invalid keys/values
        "a=b=c",
        "a in b",
        "a=b,",
        ",",
        "a=b,,c=d",
        "!",
        "!!a",
        "a!",
        "a in (b",
        "a in (b))",
        "a in (b)(c)",
        "a notin ,",
        "a=(b)",
        "a=b)",
        "a in (=)",
        "-a=b",
        "a=-b",
        "a/b/c=d",
        "A.Example.com/b",
        "a=" + "v" * 64,
        "k" * 64,
        "a>b",
        "a>-1",  # an integer, but not a valid label value
        "a>99999999999999999999",  # a label value, but not an int64
        "a<",
        "a>1>2",
        "a in (b)c",
    ],
)
def test_bad_syntax_is_rejected(text: str) -> None:
    with pytest.raises(SelectorError):
        Selector.parse(text)


def req(key: str, op: Operator, *values: str) -> Requirement:
    return Requirement(key, op, values)


# TestSetSelectorParser: the valid rows with their expected requirement lists (order there is
# by key; our canonical order is the same here).
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("\rx", [req("x", Operator.EXISTS)]),
        (
            "this-is-a-dns.domain.com/key-with-dash",
            [req("this-is-a-dns.domain.com/key-with-dash", Operator.EXISTS)],
        ),
        (
            "this-is-another-dns.domain.com/key-with-dash in (so,what)",
            [req("this-is-another-dns.domain.com/key-with-dash", Operator.IN, "so", "what")],
        ),
        (
            "0.1.2.domain/99 notin (10.10.100.1, tick.tack.clock)",
            [req("0.1.2.domain/99", Operator.NOT_IN, "10.10.100.1", "tick.tack.clock")],
        ),
        ("foo  in\t (abc)", [req("foo", Operator.IN, "abc")]),
        ("x notin\n (abc)", [req("x", Operator.NOT_IN, "abc")]),
        ("x  notin\t\t\t(abc,def)", [req("x", Operator.NOT_IN, "abc", "def")]),
        ("x in (abc,def)", [req("x", Operator.IN, "abc", "def")]),
        ("x in (abc,)", [req("x", Operator.IN, "abc", "")]),
        ("x in (abc,abc)", [req("x", Operator.IN, "abc")]),
        ("x in ()", [req("x", Operator.IN, "")]),
        ("x in (a,,)", [req("x", Operator.IN, "a", "")]),
        ("x in (a,,,)", [req("x", Operator.IN, "a", "")]),
        ("x in (a,,,,,,)", [req("x", Operator.IN, "a", "")]),
        ("x in (a,,a,,a,,a,,)", [req("x", Operator.IN, "a", "")]),
        (
            "x notin (abc,,def),bar,z in (),w",
            [
                req("bar", Operator.EXISTS),
                req("w", Operator.EXISTS),
                req("x", Operator.NOT_IN, "abc", "", "def"),
                req("z", Operator.IN, ""),
            ],
        ),
        ("x,y in (a)", [req("x", Operator.EXISTS), req("y", Operator.IN, "a")]),
        ("x=a", [req("x", Operator.EQUALS, "a")]),
        ("x>1", [req("x", Operator.GREATER_THAN, "1")]),
        ("x<7", [req("x", Operator.LESS_THAN, "7")]),
        ("x=a,y!=b", [req("x", Operator.EQUALS, "a"), req("y", Operator.NOT_EQUALS, "b")]),
        (
            "x=a,y!=b,z in (h,i,j)",
            [
                req("x", Operator.EQUALS, "a"),
                req("y", Operator.NOT_EQUALS, "b"),
                req("z", Operator.IN, "h", "i", "j"),
            ],
        ),
        ("x notin ( )", [req("x", Operator.NOT_IN, "")]),
        ("x notin (, a)", [req("x", Operator.NOT_IN, "", "a")]),
        ("a ", [req("a", Operator.EXISTS)]),
        ("a in (x,y,notin, z,in)", [req("a", Operator.IN, "in", "notin", "x", "y", "z")]),
        # TestSelectorMatches: 'in'/'notin' are plain words as key and value of exact matches.
        ("notin=in", [req("notin", Operator.EQUALS, "in")]),
        # Additional cases following the same parser rules (parseExactValue, parseValues).
        ("x==a", [req("x", Operator.DOUBLE_EQUALS, "a")]),
        ("x==", [req("x", Operator.DOUBLE_EQUALS, "")]),
        ("x!=", [req("x", Operator.NOT_EQUALS, "")]),
        ("x=,y", [req("x", Operator.EQUALS, ""), req("y", Operator.EXISTS)]),
        ("x in (,)", [req("x", Operator.IN, "")]),
        ("in in (in)", [req("in", Operator.IN, "in")]),
        ("notin notin (notin)", [req("notin", Operator.NOT_IN, "notin")]),
        ("in", [req("in", Operator.EXISTS)]),
        ("!notin", [req("notin", Operator.DOES_NOT_EXIST)]),
        ("  !  x  ", [req("x", Operator.DOES_NOT_EXIST)]),
        ("x>0001", [req("x", Operator.GREATER_THAN, "0001")]),
        ("x\t=\ny", [req("x", Operator.EQUALS, "y")]),
    ],
)
def test_k8s_parse_table(text: str, expected: list[Requirement]) -> None:
    assert list(Selector.parse(text).requirements) == expected


# TestDeterministicParse: the order of requirements in the input does not matter.
def test_parse_is_deterministic() -> None:
    first, second = Selector.parse("x=a,a=x"), Selector.parse("a=x,x=a")
    assert first == second
    assert first.render() == second.render() == "a=x,x=a"


# TestToString (selector_test.go): rendering of each operator, values sorted within a set.
@pytest.mark.parametrize(
    ("requirements_", "rendered"),
    [
        (
            [
                req("x", Operator.IN, "def", "abc"),
                req("y", Operator.NOT_IN, "jkl"),
                req("z", Operator.EXISTS),
            ],
            "x in (abc,def),y notin (jkl),z",
        ),
        (
            [
                req("x", Operator.NOT_IN, "abc", "def"),
                req("y", Operator.NOT_EQUALS, "jkl"),
                req("z", Operator.DOES_NOT_EXIST),
            ],
            "x notin (abc,def),y!=jkl,!z",
        ),
        (
            [
                req("x", Operator.NOT_IN, "abc"),
                req("y", Operator.IN, "jkl", "mno"),
                req("z", Operator.NOT_IN, ""),
            ],
            "x notin (abc),y in (jkl,mno),z notin ()",
        ),
        (
            [
                req("x", Operator.EQUALS, "abc"),
                req("y", Operator.DOUBLE_EQUALS, "jkl"),
                req("z", Operator.NOT_EQUALS, "a"),
                req("z", Operator.EXISTS),
            ],
            "x=abc,y==jkl,z!=a,z",
        ),
        (
            [
                req("x", Operator.GREATER_THAN, "2"),
                req("y", Operator.LESS_THAN, "8"),
                req("z", Operator.EXISTS),
            ],
            "x>2,y<8,z",
        ),
    ],
)
def test_k8s_to_string_table(requirements_: list[Requirement], rendered: str) -> None:
    assert Selector(tuple(reversed(requirements_))).render() == rendered


def test_selector_go_lexer_treats_nul_as_end_of_input() -> None:
    # selector.go's Lexer.read() returns 0 both at the end of the input and for a NUL byte: a NUL
    # where a token starts ends the input, a NUL right after a token is consumed as a separator.
    assert Selector.parse("a=b\0,c=d").render() == "a=b,c=d"
    assert Selector.parse("a,\0b").render() == "a,b"
    assert Selector.parse("a=b,c \0 garbage(").render() == "a=b,c"
    assert Selector.parse("\0a=b").is_empty
    with pytest.raises(SelectorError):
        Selector.parse("a, \0b")  # ',' followed by end of input
    with pytest.raises(SelectorError):
        Selector.parse("a\0b")  # two identifiers in a row


def test_only_four_characters_are_whitespace() -> None:
    # isWhitespace in selector.go: ' ', '\t', '\r', '\n'. A vertical tab is part of an identifier
    # and therefore makes the key invalid.
    assert Selector.parse(" \t\r\na\t=\rb\n").render() == "a=b"
    with pytest.raises(SelectorError):
        Selector.parse("a\v=b")


def test_parse_errors_name_the_field_and_the_problem() -> None:
    with pytest.raises(SelectorError) as excinfo:
        Selector.parse("a b")
    assert str(excinfo.value) == (
        "labelSelector: unable to parse requirement: found 'b', "
        "expected: in, notin, =, ==, !=, gt, lt"
    )
    assert excinfo.value.code == 400
    with pytest.raises(SelectorError, match=r"^q: found ',', expected: identifier after ','$"):
        Selector.parse("a,,b", field="q")
    with pytest.raises(
        SelectorError, match=r'^labelSelector: unable to parse requirement: key: .*"A_"'
    ):
        Selector.parse("A_=b")
    with pytest.raises(SelectorError, match=r"values\[0\]: .*must be no more than 63 bytes"):
        Selector.parse("a=" + "v" * 64)
    with pytest.raises(SelectorError, match=r"the value must be an integer"):
        Selector.parse("a<b")


def test_long_values_are_not_echoed_in_full() -> None:
    with pytest.raises(SelectorError) as excinfo:
        Selector.parse("a=" + "v" * 100_000)
    assert len(str(excinfo.value)) < 1000


def test_parse_rejects_non_strings() -> None:
    with pytest.raises(SelectorError, match="must be a string"):
        Selector.parse(["a=b"])  # type: ignore[arg-type]


# --- matching: tables from selector_test.go -------------------------------------------------


# TestSelectorMatches (expectMatch / expectNoMatch).
@pytest.mark.parametrize(
    ("text", "labels", "matched"),
    [
        ("", {"x": "y"}, True),
        ("x=y", {"x": "y"}, True),
        ("x=y,z=w", {"x": "y", "z": "w"}, True),
        ("x!=y,z!=w", {"x": "z", "z": "a"}, True),
        ("notin=in", {"notin": "in"}, True),
        ("x", {"x": "z"}, True),
        ("!x", {"y": "z"}, True),
        ("x>1", {"x": "2"}, True),
        ("x<1", {"x": "0"}, True),
        ("x=z", {}, False),
        ("x=y", {"x": "z"}, False),
        ("x=y,z=w", {"x": "w", "z": "w"}, False),
        ("x!=y,z!=w", {"x": "z", "z": "w"}, False),
        ("x", {"y": "z"}, False),
        ("!x", {"x": "z"}, False),
        ("x>1", {"x": "0"}, False),
        ("x<1", {"x": "2"}, False),
        ("foo=bar", {"foo": "bar", "baz": "blah"}, True),
        ("baz=blah", {"foo": "bar", "baz": "blah"}, True),
        ("foo=bar,baz=blah", {"foo": "bar", "baz": "blah"}, True),
        ("foo=blah", {"foo": "bar", "baz": "blah"}, False),
        ("baz=bar", {"foo": "bar", "baz": "blah"}, False),
        ("foo=bar,foobar=bar,baz=blah", {"foo": "bar", "baz": "blah"}, False),
        # TestRequirementSelectorMatching, written in string form.
        ("x in (foo),y notin (alpha)", {"x": "foo", "y": "baz"}, True),
        ("x in (foo),y in (alpha)", {"x": "foo", "y": "baz"}, False),
        ("x notin (),y", {"y": ""}, True),
        ("!x,y", {"y": ""}, True),
        ("x notin (),!y", {"y": ""}, False),
        ("x in ()", {"y": "baz"}, False),
        ("z>1", {"z": "2"}, True),
        ("z>1", {"z": "v2"}, False),
        # Documented semantics (Requirement.Matches doc comment): != and notin match an absent
        # key; in and = require presence; the empty value is a value like any other.
        ("x!=a", {}, True),
        ("x notin (a,b)", {}, True),
        ("x in (a,b)", {}, False),
        ("x=", {"x": ""}, True),
        ("x=", {}, False),
        ("x!=", {"x": ""}, False),
        ("x in ()", {"x": ""}, True),
        ("x in (a,)", {"x": ""}, True),
        ("x==a", {"x": "a"}, True),
        # gt/lt compare as int64 and never match a missing or non-integer label.
        ("x>1", {}, False),
        ("x<1", {}, False),
        ("x<10", {"x": "9"}, True),
        ("x<10", {"x": "-5"}, True),
        ("x>10", {"x": "010"}, False),
        ("x>10", {"x": "011"}, True),
        ("x>1", {"x": "1_000"}, False),
        ("x>1", {"x": " 5"}, False),
        ("x<1", {"x": "-9223372036854775809"}, False),
        ("x>1", {"x": "9223372036854775807"}, True),
    ],
)
def test_k8s_matching_table(text: str, labels: dict[str, str], matched: bool) -> None:
    selector = Selector.parse(text)
    assert selector.matches(labels) is matched
    assert (not selector.violations(labels)) is matched


def test_empty_selector_matches_everything() -> None:
    # TestEverything / TestSetIsEmpty (selector_test.go).
    empty = Selector.parse("")
    assert empty.is_empty
    assert empty == Selector()
    assert empty.matches({"x": "y"})
    assert empty.matches({})
    assert empty.matches(None)
    assert empty.render() == ""
    assert not Selector.parse("x").is_empty


def test_none_labels_mean_no_labels() -> None:
    assert Selector.parse("!a,b!=c,d notin (e)").matches(None)
    assert not Selector.parse("a").matches(None)
    assert not Selector.parse("a in (b)").matches(None)
    assert [r.render() for r in Selector.parse("a,b=c,!d").violations(None)] == ["a", "b=c"]


def test_violations_name_the_failing_requirements() -> None:
    selector = Selector.parse("tenant=acme,tier in (web,db),!legacy")
    failed = selector.violations({"tenant": "other", "tier": "web", "legacy": "yes"})
    assert [r.render() for r in failed] == ["!legacy", "tenant=acme"]
    assert [r.key for r in failed] == ["legacy", "tenant"]


# --- required_labels (RequiresExactMatch in selector.go / TestRequiresExactMatch) ------------


@pytest.mark.parametrize(
    ("text", "required"),
    [
        ("key in (value)", {"key": "value"}),
        ("key in (value,value2)", {}),
        ("key in (value,value1),key2 in (value2)", {"key2": "value2"}),
        ("key=value", {"key": "value"}),
        ("key==value", {"key": "value"}),
        ("key!=value", {}),
        ("key in (value),key2 in (value2)", {"key": "value", "key2": "value2"}),
        ("key,!other,x notin (y),n>1", {}),
        ("key in ()", {"key": ""}),
        ("key=", {"key": ""}),
        ("key in (a,b),key=a", {"key": "a"}),
    ],
)
def test_required_labels(text: str, required: dict[str, str]) -> None:
    assert Selector.parse(text).required_labels() == required


# --- validation: tables from pkg/api/validate/content/kube_test.go ----------------------------

# TestIsLabelKey successCases.
GOOD_KEYS = [
    "simple",
    "now-with-dashes",
    "1-starts-with-num",
    "1234",
    "simple/simple",
    "now-with-dashes/simple",
    "now-with-dashes/now-with-dashes",
    "now.with.dots/simple",
    "now-with.dashes-and.dots/simple",
    "1-num.2-num/3-num",
    "1234/5678",
    "1.2.3.4/5678",
    "Uppercase_Is_OK_123",
    "example.com/Uppercase_Is_OK_123",
    "requests.storage-foo",
    "a" * 63,
    "a" * 253 + "/" + "b" * 63,
]
# TestIsLabelKey errorCases, with the reason checked by each row's message.
BAD_KEYS = [
    ("nospecialchars%^=@", "name part must consist of alphanumeric characters"),
    ("cantendwithadash-", "name part must consist of alphanumeric characters"),
    ("-cantstartwithadash-", "name part must consist of alphanumeric characters"),
    ("only/one/slash", "a valid label key must consist of"),
    ("Example.com/abc", "prefix part a lowercase RFC 1123 subdomain"),
    ("example_com/abc", "prefix part a lowercase RFC 1123 subdomain"),
    ("example.com/", "name part must be non-empty"),
    ("/simple", "prefix part must be non-empty"),
    ("a" * 64, "name part must be no more than 63 bytes"),
    ("a" * 254 + "/abc", "prefix part must be no more than 253 bytes"),
    # Further cases from the rules spelled out in the vwserver spec.
    ("", "name part must be non-empty"),
    ("exa mple.com/abc", "prefix part a lowercase RFC 1123 subdomain"),
    ("example..com/abc", "prefix part a lowercase RFC 1123 subdomain"),
    ("-example.com/abc", "prefix part a lowercase RFC 1123 subdomain"),
    ("example.com/" + "b" * 64, "name part must be no more than 63 bytes"),
    ("k\u00e9y", "name part must consist of alphanumeric characters"),
    ("key\n", "name part must consist of alphanumeric characters"),  # Go's $ is end of text
]
# TestIsLabelValue.
GOOD_VALUES = [
    "simple",
    "now-with-dashes",
    "1-starts-with-num",
    "end-with-num-1",
    "1234",
    "a" * 63,
    "",
]
BAD_VALUES = [
    ("nospecialchars%^=@", "a valid label must be an empty string or consist of"),
    ("Tama-nui-te-r\u0101.is.M\u0101ori.sun", "a valid label must be an empty string"),
    ("\\backslashes\\are\\bad", "a valid label must be an empty string"),
    ("-starts-with-dash", "a valid label must be an empty string"),
    ("ends-with-dash-", "a valid label must be an empty string"),
    (".starts.with.dot", "a valid label must be an empty string"),
    ("ends.with.dot.", "a valid label must be an empty string"),
    ("a" * 64, "must be no more than 63 bytes"),
    ("a/b", "a valid label must be an empty string"),
    ("v\n", "a valid label must be an empty string"),
]


@pytest.mark.parametrize("key", GOOD_KEYS)
def test_valid_label_keys(key: str) -> None:
    assert label_key_problems(key) == []
    assert Selector.parse(key).requirements == (Requirement(key, Operator.EXISTS),)
    assert Selector.from_label_selector({"matchLabels": {key: "v"}}).matches({key: "v"})


@pytest.mark.parametrize(("key", "reason"), BAD_KEYS)
def test_invalid_label_keys(key: str, reason: str) -> None:
    assert any(p.startswith(reason) for p in label_key_problems(key)), label_key_problems(key)
    with pytest.raises(SelectorError, match=re.escape(reason)):
        Requirement(key, Operator.EXISTS)
    with pytest.raises(SelectorError, match=r"^selector\.matchLabels: Invalid value: "):
        Selector.from_label_selector({"matchLabels": {key: "v"}})
    with pytest.raises(
        SelectorError, match=r"^selector\.matchExpressions\[0\]\.key: Invalid value: "
    ):
        Selector.from_label_selector({"matchExpressions": [{"key": key, "operator": "Exists"}]})


@pytest.mark.parametrize("value", GOOD_VALUES)
def test_valid_label_values(value: str) -> None:
    assert label_value_problems(value) == []
    assert Selector.parse(f"k={value}").requirements == (
        Requirement("k", Operator.EQUALS, (value,)),
    )


@pytest.mark.parametrize(("value", "reason"), BAD_VALUES)
def test_invalid_label_values(value: str, reason: str) -> None:
    assert any(p.startswith(reason) for p in label_value_problems(value))
    with pytest.raises(SelectorError, match=re.escape(reason)):
        Requirement("k", Operator.IN, ("ok", value))
    with pytest.raises(SelectorError, match=r"^selector\.matchLabels\[k\]: Invalid value: "):
        Selector.from_label_selector({"matchLabels": {"k": value}})
    with pytest.raises(
        SelectorError, match=r"^selector\.matchExpressions\[0\]\.values\[1\]: Invalid value: "
    ):
        Selector.from_label_selector(
            {"matchExpressions": [{"key": "k", "operator": "In", "values": ["ok", value]}]}
        )


def test_key_length_is_counted_in_bytes_like_go() -> None:
    # 32 two-byte characters: 32 characters but 64 bytes.
    assert "name part must be no more than 63 bytes" in label_key_problems("\u00e9" * 32)


# TestRequirementConstructor (selector_test.go): what NewRequirement rejects.
@pytest.mark.parametrize(
    ("key", "operator", "values", "reason"),
    [
        ("x1", Operator.IN, (), "values set can't be empty"),
        ("x2", Operator.NOT_IN, (), "values set can't be empty"),
        (
            "x5",
            Operator.EQUALS,
            ("foo", "bar"),
            "exact-match compatibility requires one single value",
        ),
        ("x5", Operator.NOT_EQUALS, (), "exact-match compatibility requires one single value"),
        ("x8", Operator.EXISTS, ("foo",), "values set must be empty"),
        ("x8", Operator.DOES_NOT_EXIST, ("foo",), "values set must be empty"),
        ("x13", Operator.GREATER_THAN, (), "exactly one value is required"),
        ("x14", Operator.GREATER_THAN, ("bar",), "the value must be an integer"),
        ("x15", Operator.LESS_THAN, ("bar",), "the value must be an integer"),
        ("a" * 254, Operator.EXISTS, (), "name part must be no more than 63 bytes"),
        ("x16", Operator.EQUALS, ("a" * 254,), "must be no more than 63 bytes"),
        ("x17", Operator.EQUALS, ("a b",), "a valid label must be an empty string"),
        ("x18", "unsupportedOp", (), 'operator: Unsupported value: "unsupportedOp"'),
    ],
)
def test_k8s_requirement_constructor_errors(
    key: str, operator: Operator, values: tuple[str, ...], reason: str
) -> None:
    with pytest.raises(SelectorError, match=re.escape(reason)):
        Requirement(key, operator, values)


@pytest.mark.parametrize(
    ("key", "operator", "values"),
    [
        ("x3", Operator.IN, ("foo",)),
        ("x4", Operator.NOT_IN, ("foo",)),
        ("x6", Operator.EXISTS, ()),
        ("x7", Operator.DOES_NOT_EXIST, ()),
        ("x11", Operator.GREATER_THAN, ("1",)),
        ("x12", Operator.LESS_THAN, ("6",)),
        ("x12", Operator.LESS_THAN, ("9223372036854775807",)),
    ],
)
def test_k8s_requirement_constructor_accepts(
    key: str, operator: Operator, values: tuple[str, ...]
) -> None:
    assert Requirement(key, operator, values).values == values


def test_requirement_normalises_values_and_operator() -> None:
    r = Requirement("k", "in", ["b", "a", "b"])  # type: ignore[arg-type]
    assert r.operator is Operator.IN
    assert r.values == ("a", "b")
    assert r == Requirement("k", Operator.IN, ("a", "b"))
    assert hash(r) == hash(Requirement("k", Operator.IN, ("b", "a")))
    with pytest.raises(SelectorError, match="must be a list"):
        Requirement("k", Operator.IN, "ab")  # type: ignore[arg-type]
    with pytest.raises(SelectorError, match="must be a string"):
        Requirement("k", Operator.IN, (1,))  # type: ignore[arg-type]


def test_selector_rejects_non_requirements() -> None:
    with pytest.raises(TypeError):
        Selector(("a=b",))  # type: ignore[arg-type]


# --- metav1.LabelSelector (helpers.go LabelSelectorAsSelector / helpers_test.go) -------------


@pytest.mark.parametrize(
    ("obj", "rendered"),
    [
        # TestLabelSelectorAsSelector rows.
        ({}, ""),
        ({"matchLabels": {"foo": "bar"}}, "foo=bar"),
        (
            {"matchExpressions": [{"key": "baz", "operator": "In", "values": ["qux", "norf"]}]},
            "baz in (norf,qux)",
        ),
        (
            {
                "matchLabels": {"foo": "bar"},
                "matchExpressions": [{"key": "baz", "operator": "In", "values": ["qux", "norf"]}],
            },
            "baz in (norf,qux),foo=bar",
        ),
        # JSON null / empty parts mean "nothing there" (omitempty fields).
        ({"matchLabels": None, "matchExpressions": None}, ""),
        ({"matchLabels": {}, "matchExpressions": []}, ""),
        ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": None}]}, "a"),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist", "values": []}]}, "!a"),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": [""]}]}, "a notin ()"),
        ({"matchLabels": {"a": ""}}, "a="),
    ],
)
def test_from_label_selector(obj: dict[str, object], rendered: str) -> None:
    assert Selector.from_label_selector(obj).render() == rendered


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        # helpers_test.go: Exists with values is an error.
        (
            {"matchExpressions": [{"key": "baz", "operator": "Exists", "values": ["qux", "norf"]}]},
            "selector.matchExpressions[0].values: Forbidden: may not be specified when "
            "`operator` is 'Exists' or 'DoesNotExist'",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "In"}, {"key": "b", "operator": "Foo"}]},
            "selector.matchExpressions[0].values: Required value: must be specified when "
            "`operator` is 'In' or 'NotIn'; "
            'selector.matchExpressions[1].operator: unsupported operator "Foo": '
            'supported values: "In", "NotIn", "Exists", "DoesNotExist"',
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": []}]},
            "selector.matchExpressions[0].values: Required value",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "in", "values": ["b"]}]},
            'selector.matchExpressions[0].operator: unsupported operator "in"',
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]},
            'selector.matchExpressions[0].operator: unsupported operator "Gt"',
        ),
        (
            {"matchExpressions": [{"operator": "Exists"}]},
            "selector.matchExpressions[0].key: Required value",
        ),
        (
            {"matchExpressions": [{"key": "a"}]},
            "selector.matchExpressions[0].operator: Required value",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "Exists", "value": ["x"]}]},
            'selector.matchExpressions[0]: unknown field "value"',
        ),
        ({"matchExpressions": ["a"]}, 'selector.matchExpressions[0]: Invalid value: "a"'),
        ({"matchExpressions": {"a": "b"}}, "selector.matchExpressions: Invalid value: "),
        ({"matchExpressions": "a"}, "selector.matchExpressions: Invalid value: "),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": "b"}]},
            'selector.matchExpressions[0].values: Invalid value: "b": must be a list',
        ),
        (
            {"matchExpressions": [{"key": 1, "operator": "Exists"}]},
            "selector.matchExpressions[0].key: Invalid value: 1: must be a string",
        ),
        ({"matchLabels": ["a"]}, "selector.matchLabels: Invalid value: "),
        ({"matchLabels": {"a": 1}}, "selector.matchLabels[a]: Invalid value: 1: must be a string"),
        ({"matchLabels": {"a": None}}, "selector.matchLabels[a]: Invalid value: null"),
        # Unknown top-level keys (e.g. a typo) are errors, not silently ignored.
        ({"matchLabel": {"a": "b"}}, 'selector: unknown field "matchLabel"'),
    ],
)
def test_from_label_selector_errors_name_the_field(obj: dict[str, object], message: str) -> None:
    with pytest.raises(SelectorError) as excinfo:
        Selector.from_label_selector(obj)
    assert str(excinfo.value).startswith(message), str(excinfo.value)
    assert excinfo.value.code == 400


def test_from_label_selector_uses_the_given_field_name() -> None:
    with pytest.raises(SelectorError, match=r"^spec\.slices\[2\]\.selector: unknown field"):
        Selector.from_label_selector({"x": 1}, field="spec.slices[2].selector")
    with pytest.raises(SelectorError, match=r"^sel: Invalid value: \[\]: must be an object$"):
        Selector.from_label_selector([], field="sel")  # type: ignore[arg-type]


def test_to_label_selector_forms() -> None:
    assert Selector().to_label_selector() == {}
    assert Selector.parse("a=b,c==d,e!=f,g in (h,i),!j,k").to_label_selector() == {
        "matchLabels": {"a": "b", "c": "d"},
        "matchExpressions": [
            {"key": "e", "operator": "NotIn", "values": ["f"]},
            {"key": "g", "operator": "In", "values": ["h", "i"]},
            {"key": "j", "operator": "DoesNotExist"},
            {"key": "k", "operator": "Exists"},
        ],
    }
    # matchLabels holds one value per key; a second exact match on the key must not be lost.
    conflicting = Selector.parse("a=b,a=c")
    assert conflicting.to_label_selector() == {
        "matchLabels": {"a": "b"},
        "matchExpressions": [{"key": "a", "operator": "In", "values": ["c"]}],
    }
    assert not Selector.from_label_selector(conflicting.to_label_selector()).matches({"a": "b"})


def test_gt_lt_have_no_label_selector_form() -> None:
    # ParseToLabelSelector (helpers.go): "gt"/"lt" "isn't supported in label selectors".
    with pytest.raises(SelectorError, match="isn't supported in label selectors"):
        Selector.parse("a>1").to_label_selector()


# --- AND-combination --------------------------------------------------------------------------


def test_and_combines_and_deduplicates() -> None:
    slice_selector = Selector.parse("tenant=acme")
    client = Selector.parse("tier in (web),tenant=acme")
    combined = slice_selector & client
    assert combined.render() == "tenant=acme,tier in (web)"
    assert combined & Selector() == combined
    assert Selector() & combined == combined
    assert not (Selector.parse("a=b") & Selector.parse("a=c")).matches({"a": "b"})


def test_and_with_a_non_selector_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        _ = Selector() & "a=b"


# --- properties ---------------------------------------------------------------------------------


@given(selectors())
@example(Selector.parse("x notin (,abc,def),in in (in),z in ()"))
def test_render_round_trips_through_parse(selector: Selector) -> None:
    rendered = selector.render()
    assert Selector.parse(rendered) == selector
    assert Selector.parse(rendered).render() == rendered


@st.composite
def spaced_renderings(draw: st.DrawFn) -> tuple[Selector, str]:
    """A selector and a rendering with arbitrary whitespace where the grammar allows it."""
    selector = draw(selectors())
    ws = st.text(alphabet=" \t\r\n", max_size=2)
    parts = []
    for r in selector.requirements:
        if r.operator is Operator.EXISTS:
            text = r.key
        elif r.operator is Operator.DOES_NOT_EXIST:
            text = "!" + draw(ws) + r.key
        elif r.operator in (Operator.IN, Operator.NOT_IN):
            inner = ("," + draw(ws)).join(draw(ws) + v for v in r.values)
            sep = draw(st.text(alphabet=" \t\r\n", min_size=1, max_size=2))
            text = f"{r.key}{sep}{r.operator.value}{draw(ws)}({inner}{draw(ws)})"
        else:
            symbol = {Operator.GREATER_THAN: ">", Operator.LESS_THAN: "<"}.get(
                r.operator, r.operator.value
            )
            text = f"{r.key}{draw(ws)}{symbol}{draw(ws)}{r.values[0]}"
        parts.append(draw(ws) + text + draw(ws))
    order = draw(st.permutations(parts)) if parts else []
    return selector, ",".join(order)


@given(spaced_renderings())
def test_whitespace_and_order_do_not_matter(case: tuple[Selector, str]) -> None:
    selector, text = case
    assert Selector.parse(text) == selector


@given(label_selector_dicts())
def test_label_selector_dict_round_trip(obj: dict[str, object]) -> None:
    selector = Selector.from_label_selector(obj)
    assert Selector.from_label_selector(selector.to_label_selector()) == selector


@given(selectors(LABEL_SELECTOR_OPERATORS), label_sets)
def test_to_label_selector_preserves_meaning(
    selector: Selector, labels: dict[str, str] | None
) -> None:
    # "==" and "!=" have no LabelSelector spelling, so the round trip may change operators but
    # never what is selected; and converting again is stable.
    as_dict = selector.to_label_selector()
    again = Selector.from_label_selector(as_dict)
    assert again.matches(labels) == selector.matches(labels)
    assert again.to_label_selector() == as_dict


@given(selectors(), label_sets)
def test_matches_agrees_with_reference_semantics(
    selector: Selector, labels: dict[str, str] | None
) -> None:
    expected = oracle(selector, labels)
    assert selector.matches(labels) == expected
    assert all(r.matches(labels or {}) for r in selector.requirements) == expected
    assert (selector.violations(labels) == []) == expected
    assert selector.matches(labels) == selector.matches(dict(labels or {}))


@given(selectors(), selectors(), label_sets)
def test_and_matches_iff_both_match(
    a: Selector, b: Selector, labels: dict[str, str] | None
) -> None:
    both = a & b
    assert both.matches(labels) == (a.matches(labels) and b.matches(labels))
    assert both == b & a
    assert set(both.requirements) == set(a.requirements) | set(b.requirements)


@given(selectors(), label_sets)
def test_required_labels_are_carried_by_every_match(
    selector: Selector, labels: dict[str, str] | None
) -> None:
    required = selector.required_labels()
    if selector.matches(labels):
        carried = labels or {}
        assert all(carried.get(k) == v for k, v in required.items())


@given(selectors())
def test_required_labels_come_from_exact_requirements(selector: Selector) -> None:
    required = selector.required_labels()
    for key, value in required.items():
        assert any(
            r.key == key
            and r.values == (value,)
            and r.operator in (Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.IN)
            for r in selector.requirements
        )


@given(selectors())
def test_requirements_are_canonical(selector: Selector) -> None:
    reqs = selector.requirements
    keys = [(r.key, r.operator.value, r.values) for r in reqs]
    assert keys == sorted(keys)
    assert len(set(reqs)) == len(reqs)
    for r in reqs:
        assert list(r.values) == sorted(set(r.values))
    assert Selector(tuple(reversed(reqs)) + reqs) == selector
    assert hash(Selector(tuple(reversed(reqs)))) == hash(selector)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(
    st.text(alphabet=st.sampled_from(list("ab=!(), \tinot\0/.-_A9\u00e9>")), max_size=30)
    | st.text(max_size=30)
)
def test_parse_of_arbitrary_text_either_fails_cleanly_or_round_trips(text: str) -> None:
    try:
        selector = Selector.parse(text)
    except SelectorError as e:
        message = str(e)
    else:
        assert Selector.parse(selector.render()) == selector
        return
    assert message.startswith("labelSelector: ")


@given(
    st.dictionaries(
        st.sampled_from(["matchLabels", "matchExpressions", "other"]),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.sampled_from([*_KEY_POOL, "In", "Foo"]),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.sampled_from(["key", "operator", "values", "a", "x"]), inner)
            ),
            max_leaves=8,
        ),
    )
)
def test_from_label_selector_on_arbitrary_json_fails_cleanly(obj: dict[str, object]) -> None:
    try:
        selector = Selector.from_label_selector(obj)
    except SelectorError as e:
        message = str(e)
    else:
        assert Selector.from_label_selector(selector.to_label_selector()) == selector
        return
    assert message.startswith("selector")


@pytest.mark.parametrize(
    ("this", "other", "implied"),
    [
        ("env=prod,tier=x", "env=prod", True),
        ("env=prod", "env=prod", True),
        ("env=prod", "", True),
        ("", "env=prod", False),
        ("env=prod", "env=dev", False),
        ("env in (prod)", "env=prod", False),  # implied in fact; not told by the requirements
    ],
)
def test_implies_by_requirements(this: str, other: str, implied: bool) -> None:
    assert Selector.parse(this).implies(Selector.parse(other)) is implied


@given(st.lists(st.sampled_from(["env=prod", "tier!=x", "zone", "!gone"]), max_size=4))
def test_a_selector_and_another_implies_both(terms: list[str]) -> None:
    this = Selector.parse(",".join(terms[:2]))
    other = Selector.parse(",".join(terms[2:]))
    both = this & other
    assert both.implies(this)
    assert both.implies(other)


@given(
    st.one_of(
        selectors(),
        # One or two =/in requirements: the shapes matches_each decides in a comprehension.
        selectors([Operator.EQUALS, Operator.IN]).filter(lambda s: len(s.requirements) <= 2),
    ),
    st.lists(label_sets, max_size=6),
)
def test_matches_each_is_matches_of_each(
    selector: Selector, labels: list[dict[str, str] | None]
) -> None:
    """The LIST hot loop's whole-page match decides each object as matches() (and the
    independent oracle) does."""
    assert selector.matches_each(labels) == [selector.matches(ls) for ls in labels]
    assert selector.matches_each(labels) == [oracle(selector, ls) for ls in labels]
