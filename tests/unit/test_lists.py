"""Pure parts of the filtered LIST (vwserver.proxy.lists)."""

from __future__ import annotations

import msgspec
import pytest

from vwserver.proxy.filtering import Page
from vwserver.proxy.lists import MAX_PAGE, PAGE_BYTES, next_page_size, single_namespace


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ("metadata.namespace=team-blue", ("team-blue", "")),
        ("metadata.namespace==team-blue", ("team-blue", "")),
        (" metadata.namespace = ns1 ", ("ns1", "")),
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
