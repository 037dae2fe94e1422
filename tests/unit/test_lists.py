"""Pure parts of the filtered LIST (vwserver.proxy.lists)."""

from __future__ import annotations

import base64
import json

import msgspec
import pytest

from vwserver.errors import BadRequest
from vwserver.proxy import cache_plan
from vwserver.proxy.filtering import Page
from vwserver.proxy.lists import (
    HELD,
    MAX_PAGE,
    PAGE_BYTES,
    SELECTED,
    Resume,
    decode_continue,
    encode_continue,
    first_page_size,
    next_page_size,
    single_namespace,
)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ("metadata.namespace=team-blue", ("team-blue", "")),
        ("metadata.namespace==team-blue", ("team-blue", "")),
        # kcp trims nothing: 400 "field label not supported:  metadata.namespace "
        (" metadata.namespace = ns1 ", None),
        ("metadata.namespace= ns1", None),  # the namespace " ns1": kcp answers it (empty)
        ("metadata.name!=x,metadata.namespace=ns1", ("ns1", "metadata.name!=x")),
        ("metadata.namespace=ns1,metadata.name=x", ("ns1", "metadata.name=x")),
        ("", None),
        ("metadata.name=x", None),
        ("metadata.namespace!=ns1", None),
        ("metadata.namespace=ns1,metadata.namespace=ns2", None),
        ("metadata.namespace=", None),
        ("metadata.namespace=Not_A_Namespace", None),
        ("metadata.namespace=" + "a" * 64, None),
        ("metadata.namespace=ns\\,1", None),
    ],
)
def test_the_one_namespace_a_field_selector_requires(
    fields: str, expected: tuple[str, str] | None
) -> None:
    assert single_namespace(fields) == expected


def test_continue_tokens_carry_kcps_token_and_the_streams_that_go_on() -> None:
    kcp_token = "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6OCwic3RhcnQiOiIvYVx1MDAwMCJ9"
    assert decode_continue(kcp_token) == Resume(kcp_token, (SELECTED, HELD))  # kcp's: both
    for streams in ((SELECTED,), (HELD,), (SELECTED, HELD)):
        ours = encode_continue(kcp_token, streams)
        assert decode_continue(ours) == Resume(kcp_token, streams)
    # not a cache token: the cache leaves it to the pass-through path
    assert cache_plan.decode_continue(encode_continue(kcp_token, (HELD,))) is None


@pytest.mark.parametrize(
    "doc",
    [
        {"v": "vwlist/1", "c": "", "s": ["held"]},
        {"v": "vwlist/1", "c": "x", "s": []},
        {"v": "vwlist/1", "c": "x", "s": ["everything"]},
        {"v": "vwlist/1", "c": "x", "s": ["held", "held"]},
        {"v": "vwlist/1", "c": 1, "s": ["held"]},
        {"v": "vwlist/1", "c": "x"},
    ],
)
def test_a_damaged_continue_token_of_ours_is_the_apiservers_400(doc: dict[str, object]) -> None:
    text = base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()
    with pytest.raises(BadRequest, match="continue key is not valid"):
        decode_continue(text)


def page_of(entries: int, *, size: int, out_of_scope: int = 0) -> Page:
    return Page(
        is_table=False,
        api_version="v1",
        kind="WidgetList",
        resource_version="1",
        continue_token="t",
        column_definitions=None,
        entries=[msgspec.Raw(b"{}")] * entries,
        metas=[None] * entries,
        out_of_scope=out_of_scope,
        size=size,
    )


@pytest.mark.parametrize(
    ("asked", "shown", "dropped", "size", "floor", "expected"),
    [
        (500, 500, 0, 500 * 400, 500, 1000),  # small objects: twice the last page
        (8000, 8000, 0, 8000 * 400, 500, MAX_PAGE),  # never more than MAX_PAGE objects
        (500, 500, 0, 500 * 100_000, 500, 500),  # large objects: the byte bound, not below floor
        (2000, 500, 0, 500 * 8192, 100, PAGE_BYTES // 8192),  # the byte bound
        (500, 0, 0, 100, 500, 1000),  # an empty page says nothing of object sizes
        (2000, 250, 250, 500 * 8192, 100, PAGE_BYTES // 8192),  # out-of-scope ones were sent too
    ],
)
def test_next_page_size(
    asked: int, shown: int, dropped: int, size: int, floor: int, expected: int
) -> None:
    page = page_of(shown, size=size, out_of_scope=dropped)
    assert next_page_size(asked, page, floor=floor) == expected


@pytest.mark.parametrize(
    ("objects", "raw_bytes", "floor", "expected"),
    [
        (0, 0, 500, 500),  # the cache holds nothing: listPageSize
        (300, 300 * 600, 500, 500),  # fewer than a page: never below the floor
        (5000, 5000 * 600, 500, 5001),  # the whole collection in one page (and its end)
        (20_000, 20_000 * 300, 500, MAX_PAGE),  # never more than MAX_PAGE objects
        (20_000, 20_000 * 634, 500, PAGE_BYTES // 634),  # nor more than PAGE_BYTES
        (100, 100 * 100_000, 500, 500),  # huge objects: the byte bound, not below the floor
    ],
)
def test_first_page_size_of_a_fallback_holds_the_cached_collection_within_the_bounds(
    objects: int, raw_bytes: int, floor: int, expected: int
) -> None:
    assert first_page_size(objects, raw_bytes, floor=floor) == expected
