"""vwserver.proxy.patches: the RFC 7386 and RFC 6902 examples (where kcp agrees with the RFCs),
kcp's deviations from them, and properties. Agreement with kcp itself, for thousands of random
patches, is tests/conformance/test_patch_differential_kcp.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vwserver.proxy.patches import (
    MAX_COPY_BYTES,
    MAX_OPERATIONS,
    REJECTED,
    BadPatch,
    PatchError,
    PatchPanic,
    PatchTooLarge,
    apply_json_patch,
    apply_merge_patch,
)

# -- RFC 7386, Appendix A (objects only: kcp's documents are objects) -------------------------

RFC7386 = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("document", "patch", "expected"), RFC7386)
def test_rfc7386_examples(document: Any, patch: Any, expected: Any) -> None:
    assert apply_merge_patch(document, patch) == expected


@pytest.mark.parametrize("patch", [["c"], None, "bar", 1])
def test_merge_patch_that_is_no_object_is_a_bad_request(patch: Any) -> None:
    # RFC 7386 makes the patch the result; kcp answers 400 (its strict decoding into a map
    # comes first; a null patch is "Invalid JSON Patch").
    with pytest.raises(BadPatch) as e:
        apply_merge_patch({"a": "foo"}, patch)
    assert e.value.code == 400


def test_merge_patch_array_with_field_validation_ignore_is_no_object() -> None:
    with pytest.raises(PatchError) as e:
        apply_merge_patch({"a": 1}, [1], field_validation="Ignore")
    assert e.value.code == 422 and 'Invalid value: "[1]"' in e.value.message


def test_merge_patch_prunes_nulls_inside_arrays_unless_it_replaces_an_object() -> None:
    # json-patch v4's pruneNulls goes into arrays (RFC 7386 leaves array values untouched)...
    assert apply_merge_patch({}, {"a": [{"b": None, "c": 1}, None]}) == {"a": [{"c": 1}, None]}
    assert apply_merge_patch({"a": "x"}, {"a": [{"b": None}]}) == {"a": [{}]}
    # ...but a non-object replacing an object is taken as it is.
    assert apply_merge_patch({"a": {"k": 1}}, {"a": [{"b": None}]}) == {"a": [{"b": None}]}


# -- RFC 6902, Appendix A -------------------------------------------------------------------

RFC6902_APPLIES = [
    ({"foo": "bar"}, [{"op": "add", "path": "/baz", "value": "qux"}], {"foo": "bar", "baz": "qux"}),
    (
        {"foo": ["bar", "baz"]},
        [{"op": "add", "path": "/foo/1", "value": "qux"}],
        {"foo": ["bar", "qux", "baz"]},
    ),
    ({"baz": "qux", "foo": "bar"}, [{"op": "remove", "path": "/baz"}], {"foo": "bar"}),
    ({"foo": ["bar", "qux", "baz"]}, [{"op": "remove", "path": "/foo/1"}], {"foo": ["bar", "baz"]}),
    (
        {"baz": "qux", "foo": "bar"},
        [{"op": "replace", "path": "/baz", "value": "boo"}],
        {"baz": "boo", "foo": "bar"},
    ),
    (
        {"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
        [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}],
        {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}},
    ),
    (
        {"foo": ["all", "grass", "cows", "eat"]},
        [{"op": "move", "from": "/foo/1", "path": "/foo/3"}],
        {"foo": ["all", "cows", "eat", "grass"]},
    ),
    (
        {"baz": "qux", "foo": ["a", 2, "c"]},
        [
            {"op": "test", "path": "/baz", "value": "qux"},
            {"op": "test", "path": "/foo/1", "value": 2},
        ],
        {"baz": "qux", "foo": ["a", 2, "c"]},
    ),
    (
        {"foo": "bar"},
        [{"op": "add", "path": "/child", "value": {"grandchild": {}}}],
        {"foo": "bar", "child": {"grandchild": {}}},
    ),
    (
        {"foo": "bar"},
        [{"op": "add", "path": "/baz", "value": "qux", "xyz": 123}],
        {"foo": "bar", "baz": "qux"},
    ),
    (
        {"/": 9, "~1": 10},
        [{"op": "test", "path": "/~01", "value": 10}],
        {"/": 9, "~1": 10},
    ),
    (
        {"foo": ["bar"]},
        [{"op": "add", "path": "/foo/-", "value": ["abc", "def"]}],
        {"foo": ["bar", ["abc", "def"]]},
    ),
]


@pytest.mark.parametrize(("document", "patch", "expected"), RFC6902_APPLIES)
def test_rfc6902_examples(document: Any, patch: list[Any], expected: Any) -> None:
    assert apply_json_patch(document, patch) == expected


RFC6902_FAILS = [
    ({"baz": "qux"}, [{"op": "test", "path": "/baz", "value": "bar"}], "testing value /baz failed"),
    (
        {"foo": "bar"},
        [{"op": "add", "path": "/baz/bat", "value": "qux"}],
        'add operation does not apply: doc is missing path: "/baz/bat"',
    ),
    ({"/": 9, "~1": 10}, [{"op": "test", "path": "/~01", "value": "10"}], "testing value /~01"),
]


@pytest.mark.parametrize(("document", "patch", "cause"), RFC6902_FAILS)
def test_rfc6902_failures_are_kcps_422(document: Any, patch: list[Any], cause: str) -> None:
    with pytest.raises(PatchError) as e:
        apply_json_patch(document, patch)
    assert (e.value.code, e.value.reason, e.value.message) == (422, "Invalid", REJECTED)
    assert e.value.cause.startswith(cause)
    assert type(e.value) is PatchError


# -- kcp's deviations from RFC 6902 (json-patch v4, verified against kcp) -----------------------

KCP_APPLIES = [
    # negative indices count from the end; Atoi accepts a sign and leading zeros
    ({"a": [1, 2, 3]}, [{"op": "remove", "path": "/a/-1"}], {"a": [1, 2]}),
    ({"a": [1, 2]}, [{"op": "add", "path": "/a/-1", "value": 9}], {"a": [1, 2, 9]}),
    ({"a": [1, 2]}, [{"op": "add", "path": "/a/-3", "value": 9}], {"a": [9, 1, 2]}),
    ({"a": [1, 2]}, [{"op": "replace", "path": "/a/01", "value": 9}], {"a": [1, 9]}),
    ({"a": [1, 2]}, [{"op": "test", "path": "/a/+1", "value": 2}], {"a": [1, 2]}),
    # replace of a missing member adds it; copy of a missing member adds null
    ({"a": 1}, [{"op": "replace", "path": "/b", "value": 2}], {"a": 1, "b": 2}),
    ({"a": 1}, [{"op": "copy", "from": "/x", "path": "/b"}], {"a": 1, "b": None}),
    # a missing member tests equal to null (or to no value)
    ({"a": 1}, [{"op": "test", "path": "/b", "value": None}], {"a": 1}),
    ({"a": 1}, [{"op": "test", "path": "/b"}], {"a": 1}),
    # add/replace without value write null
    ({"a": 1}, [{"op": "add", "path": "/b"}], {"a": 1, "b": None}),
    # the root: test and replace (with an object) only
    ({"a": 1}, [{"op": "test", "path": "", "value": {"a": 1}}], {"a": 1}),
    ({"a": 1}, [{"op": "replace", "path": "", "value": {"b": 2}}], {"b": 2}),
    # numbers read back as kcp decodes them
    ({}, [{"op": "add", "path": "/a", "value": 1.0}], {"a": 1}),
    ({}, [{"op": "add", "path": "/a", "value": 2**64}], {"a": 18446744073709552000}),
    # Go writes an integral float64 with its shortest digits, in fixed notation below 1e21
    ({}, [{"op": "add", "path": "/a", "value": 4.230719716055601e16}], {"a": 42307197160556010}),
]


@pytest.mark.parametrize(("document", "patch", "expected"), KCP_APPLIES)
def test_kcp_deviations_that_apply(document: Any, patch: list[Any], expected: Any) -> None:
    result = apply_json_patch(document, patch)
    assert result == expected
    assert [type(v) for v in result.values()] == [type(v) for v in expected.values()]


KCP_FAILS = [
    ({"a": 1}, [{"op": "add", "path": "", "value": {}}], 'doc is missing path: ""'),
    ({"a": 1}, [{"op": "remove", "path": ""}], 'doc is missing path: ""'),
    ({"a": 1}, [{"op": "move", "from": "/x", "path": "/b"}], "Unable to remove nonexistent key"),
    ({"a": [1]}, [{"op": "replace", "path": "/a/-", "value": 0}], "doc is missing key: /a/-"),
    ({"a": [1]}, [{"op": "add", "path": "/a/3", "value": 0}], "Unable to access invalid index"),
    ({"a": [1]}, [{"op": "remove", "path": "/a/-2"}], "Unable to access invalid index: -2"),
    ({"a": [1]}, [{"op": "add", "path": "/a/x", "value": 0}], "not a proper array index: 'x'"),
    # test compares JSON texts: the stored side is Go's encoding, the patch side msgspec's
    ({"a": 1}, [{"op": "test", "path": "/a", "value": 1.0}], "testing value /a failed"),
    ({"a": "a<b"}, [{"op": "test", "path": "/a", "value": "a<b"}], "testing value /a failed"),
    ({"a": 1e21}, [{"op": "test", "path": "/a", "value": 1e21}], "testing value /a failed"),
    ({"a": 1}, [{"op": "test", "path": "", "value": None}], "testing value  failed"),
    ({"a": 1}, [{"op": "replace", "path": "", "value": 1}], "value must be object or array"),
    ({"a": 1}, [{"op": "frobnicate", "path": "/a"}], "Unexpected kind: frobnicate"),
    ({"a": 1}, [{"path": "/a"}], "Unexpected kind: unknown"),
]


@pytest.mark.parametrize(("document", "patch", "cause"), KCP_FAILS)
def test_kcp_deviations_that_fail(document: Any, patch: list[Any], cause: str) -> None:
    with pytest.raises(PatchError) as e:
        apply_json_patch(document, patch)
    assert e.value.code == 422 and e.value.message == REJECTED
    assert cause in e.value.cause


def test_a_test_of_a_value_that_was_added_by_the_same_patch_compares_patch_texts() -> None:
    ops = [
        {"op": "add", "path": "/a", "value": "a<b"},
        {"op": "test", "path": "/a", "value": "a<b"},
    ]
    assert apply_json_patch({}, ops) == {"a": "a<b"}
    # a copy is re-encoded by Go (HTML-escaped): the copy no longer tests equal
    ops += [
        {"op": "copy", "from": "/a", "path": "/b"},
        {"op": "test", "path": "/b", "value": "a<b"},
    ]
    with pytest.raises(PatchError):
        apply_json_patch({}, ops)


PANICS = [
    ({"a": [None]}, [{"op": "test", "path": "/a", "value": [None]}]),
    ({"a": [1]}, [{"op": "test", "path": "/a", "value": [None]}]),
    ({"a": 1}, [{"op": "test", "path": ""}]),
    ({"a": 1}, [{"op": "replace", "path": ""}]),
    (
        {"a": 1},
        [
            {"op": "add", "path": "/n", "value": None},
            {"op": "copy", "from": "/n", "path": "/m"},
            {"op": "add", "path": "/m/x", "value": 1},
        ],
    ),
]


@pytest.mark.parametrize(("document", "patch"), PANICS)
def test_what_makes_kcps_library_panic(document: Any, patch: list[Any]) -> None:
    with pytest.raises(PatchPanic) as e:
        apply_json_patch(document, patch)
    assert e.value.code == 500


def test_map_order_decides_between_a_mismatch_and_a_panic() -> None:
    document = {"o": {"x": [None], "y": 1}}
    with pytest.raises(PatchError) as e:
        apply_json_patch(document, [{"op": "test", "path": "/o", "value": {"x": [None], "y": 2}}])
    assert (e.value.code, e.value.also) == (422, 500)


def test_limits() -> None:
    with pytest.raises(PatchTooLarge) as e:
        apply_json_patch({}, [{"op": "test", "path": "/a"}] * (MAX_OPERATIONS + 1))
    assert e.value.code == 413
    assert apply_json_patch({}, [{"op": "test", "path": "/a"}] * MAX_OPERATIONS) == {}
    big = "x" * (MAX_COPY_BYTES // 2)
    copies = [{"op": "copy", "from": "/a", "path": f"/c{i}"} for i in range(3)]
    with pytest.raises(PatchError) as refused:
        apply_json_patch({"a": big}, copies)
    assert "exceeding the limit 3145728" in refused.value.cause
    assert len(apply_json_patch({"a": big}, copies[:1])) == 2


def test_operations_kcp_cannot_decode_are_bad_requests() -> None:
    for patch in ([{"op": 1, "path": "/a"}], [{"op": "add", "path": 1}], ["add"], {"op": "add"}):
        with pytest.raises(BadPatch):
            apply_json_patch({}, patch)  # type: ignore[arg-type]


def test_field_validation_strict_refuses_unknown_members() -> None:
    ops = [{"op": "add", "path": "/a", "value": 1, "extra": 2}]
    assert apply_json_patch({}, ops) == {"a": 1}
    with pytest.raises(PatchError):
        apply_json_patch({}, ops, field_validation="Strict")


def test_metadata_reads_back_as_kcps_object_meta() -> None:
    document = {"metadata": {"name": "x", "labels": {"env": "prod"}}}
    # a null label value (here copied from a missing member) is the empty string in kcp
    copied = apply_json_patch(
        document, [{"op": "copy", "from": "/metadata/nothing", "path": "/metadata/labels/a"}]
    )
    assert copied["metadata"]["labels"] == {"env": "prod", "a": ""}
    # empty and null members, and members ObjectMeta does not know, are dropped
    merged = apply_merge_patch(document, {"metadata": {"labels": {"env": None}, "foo": 1}})
    assert merged == {"metadata": {"name": "x"}}
    merged = apply_merge_patch(document, {"metadata": {"finalizers": [None, "a/b"]}})
    assert merged["metadata"]["finalizers"] == ["", "a/b"]
    wrong: list[dict[str, Any]] = [
        {"labels": {"env": 1}},
        {"annotations": []},
        {"finalizers": [[]]},
    ]
    for patch in wrong:
        with pytest.raises(PatchError) as e:
            apply_merge_patch(document, {"metadata": patch})
        assert e.value.code == 422 and "into Go struct field ObjectMeta." in e.value.message


# -- properties -----------------------------------------------------------------------------

_KEYS = st.sampled_from(["a", "b", "~", "/", "0", "-", ""])
_SAFE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.text(st.characters(codec="ascii", exclude_characters="<>&"), max_size=4),
)
_VALUES = st.recursive(
    _SAFE,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=3)),
    max_leaves=10,
)
_DOCS = st.dictionaries(_KEYS, _VALUES, max_size=4)


def _pointers(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out = [(prefix, value)] if prefix else []
    if isinstance(value, dict):
        for key, member in value.items():
            token = key.replace("~", "~0").replace("/", "~1")
            out += _pointers(member, f"{prefix}/{token}")
    elif isinstance(value, list):
        for i, member in enumerate(value):
            out += _pointers(member, f"{prefix}/{i}")
    return out


def _has_null_in_array(value: Any) -> bool:
    if isinstance(value, list):
        return any(v is None or _has_null_in_array(v) for v in value)
    if isinstance(value, dict):
        return any(_has_null_in_array(v) for v in value.values())
    return False


@given(_DOCS, st.dictionaries(_KEYS, _VALUES, max_size=4))
def test_merge_patch_leaves_its_inputs_alone(document: Any, patch: Any) -> None:
    before, patch_before = copy.deepcopy(document), copy.deepcopy(patch)
    apply_merge_patch(document, patch)
    assert (document, patch) == (before, patch_before)


@given(_DOCS, st.dictionaries(_KEYS, _VALUES, max_size=4))
def test_merge_patch_deletes_nulls_and_sets_the_rest(document: Any, patch: Any) -> None:
    result = apply_merge_patch(document, patch)
    for key, value in patch.items():
        if value is None:
            assert key not in result
        elif not isinstance(value, dict):
            assert key in result
    assert all(key in result for key in document if key not in patch)


@given(_DOCS)
def test_testing_every_stored_value_passes(document: Any) -> None:
    # Go's encoding of these values (ASCII without <>&, int64, bool) is msgspec's text.
    ops = [
        {"op": "test", "path": path, "value": value}
        for path, value in _pointers(document)
        if not _has_null_in_array(value)
    ]
    assert apply_json_patch(document, ops) == document


@given(_DOCS, _KEYS, _VALUES)
def test_add_then_remove_is_no_change(document: Any, key: str, value: Any) -> None:
    if key in document:
        return
    token = key.replace("~", "~0").replace("/", "~1")
    ops = [
        {"op": "add", "path": f"/{token}", "value": value},
        {"op": "remove", "path": f"/{token}"},
    ]
    before = copy.deepcopy(document)
    assert apply_json_patch(document, ops) == document == before


@given(_DOCS, st.data())
def test_copy_makes_an_equal_value_and_move_keeps_it(document: Any, data: st.DataObject) -> None:
    pointers = _pointers(document)
    if not pointers:
        return
    source, value = data.draw(st.sampled_from(pointers))
    copied = apply_json_patch(document, [{"op": "copy", "from": source, "path": "/new~1"}])
    assert copied["new/"] == value
    moved = apply_json_patch(document, [{"op": "move", "from": source, "path": "/new~1"}])
    assert moved["new/"] == value
    del moved["new/"]
    assert moved == apply_json_patch(document, [{"op": "remove", "path": source}])


_LABEL_OPS = st.lists(
    st.fixed_dictionaries(
        {
            "op": st.sampled_from(["add", "replace", "remove", "copy", "move", "test"]),
            "path": st.sampled_from(
                ["/metadata/labels", "/metadata/labels/a", "/metadata/finalizers/-", "/x"]
            ),
            "from": st.sampled_from(["/metadata/labels/a", "/x", "/metadata/finalizers/0"]),
            "value": _VALUES,
        }
    ),
    max_size=3,
)


@given(
    st.fixed_dictionaries(
        {"metadata": st.fixed_dictionaries({"labels": st.dictionaries(_KEYS, st.text())})},
        optional={"x": _VALUES},
    ),
    _LABEL_OPS,
)
def test_a_result_has_string_labels_and_finalizers_or_is_refused(
    document: Any, ops: list[Any]
) -> None:
    try:
        result = apply_json_patch(document, ops)
    except PatchError:
        return
    meta = result["metadata"]
    assert all(isinstance(v, str) for v in meta.get("labels", {}).values())
    assert all(isinstance(v, str) for v in meta.get("finalizers", []))
