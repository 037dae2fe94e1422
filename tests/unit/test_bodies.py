"""Request bodies are decoded with bounded work: deep nesting, alias bombs and huge YAML are 400s.

Each hostile body here was a 500 with a traceback, or hundreds of MB and seconds of event-loop
time, before :mod:`vwserver.proxy.bodies`; each is now a :class:`BadRequest` naming the problem,
found in a fraction of the time the attack used to cost, while ordinary bodies decode as before.
"""

from __future__ import annotations

import json
import resource
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vwserver.errors import BadRequest
from vwserver.proxy.bodies import (
    MAX_DEPTH,
    MAX_YAML_NODES,
    _json_depth,
    decode_json,
    decode_yaml,
)

# Nine anchors of nine aliases: 9^9 scalars in under 400 bytes (the "billion laughs").
BILLION_LAUGHS = (
    b"a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(
        f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]\n"
        for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
    ).encode()
)

APPLY = {
    "apiVersion": "example.io/v1alpha1",
    "kind": "Widget",
    "metadata": {"name": "w1", "namespace": "ns1", "labels": {"env": "prod"}},
    "spec": {"size": 3, "ratio": 0.5, "enabled": True, "tags": ["a", "[b]", '{"c"'], "x": None},
}


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def depth_of(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    return 0


def refused(decode: Any, raw: bytes, match: str) -> None:
    """``decode`` refuses ``raw`` with a BadRequest matching ``match``."""
    with pytest.raises(BadRequest, match=match):
        decode(raw)


# --- JSON --------------------------------------------------------------------------------------


def test_json_up_to_the_depth_bound_decodes_and_one_level_more_is_a_400() -> None:
    assert depth_of(decode_json(nested(MAX_DEPTH))) == MAX_DEPTH
    refused(decode_json, nested(MAX_DEPTH + 1), f"nested deeper than {MAX_DEPTH} levels")
    objects = b'{"a":' * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 1)
    refused(decode_json, objects, "nested deeper")


def test_ten_thousand_levels_are_a_quick_400_not_a_recursion_error() -> None:
    refused(decode_json, nested(10_000), "nested deeper")
    refused(decode_json, b"[" * 3_000_000, "nested deeper")  # unclosed, 3 MB


def test_brackets_in_strings_and_escapes_do_not_count() -> None:
    strings = ["[" * 500, "{" * 500, '\\"[[[', '"' * 300 + "[" * 300, "\\" * 7 + '"{{{{', "]]"]
    body = {"metadata": {"name": "w", "annotations": {str(i): s for i, s in enumerate(strings)}}}
    raw = json.dumps(body).encode()
    assert _json_depth(raw) == 3
    assert decode_json(raw) == body


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n'),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.text(alphabet='[]{}"\\a'), inner, max_size=4)
        ),
        max_leaves=40,
    )
)
def test_the_prescan_depth_is_the_real_depth(value: Any) -> None:
    raw = json.dumps(value).encode()
    # below the bound the scan is skipped (a body that cannot be too deep); force it here
    padded = b'{"pad":[' + b"[]," * MAX_DEPTH + b'[]],"v":' + raw + b"}"
    assert _json_depth(padded) == max(3, 1 + depth_of(value))  # the padding is 3 deep


def test_invalid_json_is_a_400_naming_json() -> None:
    refused(decode_json, b'{"a": ', "not valid JSON")
    refused(decode_json, b"[" * 50 + b"}" * 50, "not valid JSON")


def test_an_ordinary_large_body_decodes_unchanged() -> None:
    # The scan's cost is measured by the benchmarks, not here (timed assertions are flaky).
    items = [{**APPLY, "metadata": {**APPLY["metadata"], "name": f"w{i}"}} for i in range(5000)]
    raw = msgspec.json.encode({"items": items})
    assert decode_json(raw) == {"items": items}


# --- YAML --------------------------------------------------------------------------------------


def test_kubectl_server_side_apply_json_and_the_same_object_as_yaml() -> None:
    assert decode_yaml(json.dumps(APPLY).encode()) == APPLY
    assert decode_yaml(json.dumps(APPLY, indent=2).encode() + b"\n") == APPLY
    text = (
        "apiVersion: example.io/v1alpha1\nkind: Widget\nmetadata:\n  name: w1\n"
        "  namespace: ns1\n  labels: {env: prod}\nspec:\n  size: 3\n  ratio: 0.5\n"
        "  enabled: true\n  tags: [a, '[b]', '{\"c\"']\n  x: null\n"
    )
    assert decode_yaml(text.encode()) == APPLY
    assert decode_yaml(b"{kind: Widget, metadata: {name: w1}}") == {  # flow YAML, not JSON
        "kind": "Widget",
        "metadata": {"name": "w1"},
    }


def test_the_billion_laughs_are_refused_at_once_in_bounded_memory() -> None:
    assert len(BILLION_LAUGHS) < 400
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused(decode_yaml, BILLION_LAUGHS, f"more than {MAX_YAML_NODES} nodes")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50 * 1024  # KiB


def test_aliases_within_the_bound_are_expanded_into_independent_copies() -> None:
    doc = decode_yaml(b"a: &x {labels: {env: prod}}\nb: *x\nc: [*x, *x]\n")
    assert doc == {
        "a": {"labels": {"env": "prod"}},
        "b": {"labels": {"env": "prod"}},
        "c": [
            {"labels": {"env": "prod"}},
            {"labels": {"env": "prod"}},
        ],
    }
    doc["a"]["labels"]["team"] = "x"  # the proxy adds labels to what it decoded
    assert doc["b"] == {"labels": {"env": "prod"}} and doc["c"][1] == {"labels": {"env": "prod"}}
    assert decode_yaml(b"base: &b {x: 1}\nd: {<<: *b, y: 2}") == {
        "base": {"x": 1},
        "d": {"x": 1, "y": 2},
    }


def test_alias_expansion_counts_against_the_node_bound() -> None:
    block = b"[" + b", ".join([b"1"] * 99) + b"]"  # 100 nodes
    fits = MAX_YAML_NODES // 100 - 2
    ok = b"a: &a " + block + b"\nb: [" + b", ".join([b"*a"] * fits) + b"]\n"
    assert len(decode_yaml(ok)["b"]) == fits
    too_many = b"a: &a " + block + b"\nb: [" + b", ".join([b"*a"] * (fits + 3)) + b"]\n"
    refused(decode_yaml, too_many, "nodes with its aliases expanded")


def test_a_large_yaml_document_is_refused_before_it_is_built_but_json_is_fine() -> None:
    refused(decode_yaml, b"- 1\n" * 1_000_000, "send it as JSON")
    assert decode_yaml(b"[" + b"1," * 1_000_000 + b"1]") == [1] * 1_000_001


def test_yaml_cycles_and_deep_nesting_are_refused() -> None:
    refused(decode_yaml, b"a: &a [*a]", "contains its alias")
    refused(decode_yaml, b"a: &a {b: [*a]}", "contains its alias")
    refused(decode_yaml, nested(MAX_DEPTH + 1), "nested deeper")  # JSON-looking
    refused(decode_yaml, b"a: " + nested(MAX_DEPTH), "nested deeper")  # YAML: one level more
    block = b"".join(b"  " * i + b"k:\n" for i in range(MAX_DEPTH + 1)) + b"  " * 101 + b"v"
    refused(decode_yaml, block, "nested deeper")
    # an alias of a deep value, used deep down, is as deep as its expansion
    deep_alias = b"a: &a " + nested(60) + b"\nb: " + b"[" * 45 + b"*a" + b"]" * 45
    refused(decode_yaml, deep_alias, "nested deeper")
    assert depth_of(decode_yaml(b"a: " + nested(MAX_DEPTH - 1))) == MAX_DEPTH


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"a: !!python/object/apply:os.system [id]", "not valid YAML: could not determine"),
        (b"a: !custom x", "not valid YAML"),
        (b"a: .inf", "inf or .nan"),
        (b"a: !!binary aGVsbG8=", "type bytes"),
        (b"a: !!set {x, y}", "type set"),
        (b"~: 1", "map key of type NoneType"),
        (b"[a, b]: 1", "not valid YAML|map key"),
        (b"a: 1\n---\nb: 2\n", "not valid YAML: but found another document"),
        (b"a: [1, 2", "not valid YAML"),
    ],
)
def test_yaml_without_a_json_form_is_a_400(raw: bytes, match: str) -> None:
    refused(decode_yaml, raw, match)


def test_yaml_values_and_keys_become_json_like_sigs_k8s_io_yaml_makes_them() -> None:
    doc = decode_yaml(
        b"created: 2024-01-01\nexact: !!timestamp 2001-12-14t21:59:43.10-05:00\n"
        b"1: one\nyes: true-ish\nhex: 0x1f\nf: 1.5e3\ng: 1e3\nh: 1.5\n"
    )
    assert doc == {
        "created": "2024-01-01",
        "exact": "2001-12-14t21:59:43.10-05:00",
        "1": "one",
        "true": "true-ish",
        "hex": 31,
        "f": 1.5e3,  # YAML 1.1 would say "1.5e3"; go-yaml (and JSON) say 1500.0
        "g": 1e3,
        "h": 1.5,
    }
    assert decode_yaml(b"") is None and decode_yaml(b"# only a comment\n") is None


def test_a_yaml_error_names_the_place_without_quoting_the_document() -> None:
    with pytest.raises(BadRequest) as caught:
        decode_yaml(b"token: s3cr3t-value\nbad: [unclosed\n")
    assert "line" in caught.value.message and "s3cr3t" not in caught.value.message
