"""Pure parts of the filtered LIST (vwserver.proxy.lists)."""

from __future__ import annotations

import pytest

from vwserver.proxy.lists import single_namespace


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
