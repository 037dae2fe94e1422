"""The shared cache's continue tokens name the shard whose cache issued them (issue #24):
resourceVersions and keys are per shard, so another shard's token is a 400, never a page."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vwserver.errors import BadRequest
from vwserver.proxy.cache_plan import Continue, decode_continue, encode_continue, list_plan
from vwserver.proxy.options import Options

KEY = ("2fcs4j9ukm9t6loe", "team-blue", "prod-eu")


def _options(token: str) -> Options:
    return Options((("limit", "1"), ("continue", token)))


@given(rv=st.integers(min_value=0, max_value=2**62), origin=st.text(max_size=12))
def test_a_token_round_trips_with_its_origin(rv: int, origin: str) -> None:
    token = Continue(rv=rv, key=KEY, origin=origin)
    assert decode_continue(encode_continue(token)) == token


def test_a_token_resumes_on_the_shard_that_issued_it() -> None:
    token = encode_continue(Continue(rv=675, key=KEY, origin="aaaa"))
    plan = list_plan(_options(token), origin="aaaa")
    assert (plan.rv, plan.after, plan.limit) == (675, KEY, 1)


@pytest.mark.parametrize(("issued", "used"), [("aaaa", "bbbb"), ("aaaa", ""), ("", "bbbb")])
def test_another_shards_token_is_a_bad_request(issued: str, used: str) -> None:
    token = encode_continue(Continue(rv=675, key=KEY, origin=issued))
    with pytest.raises(BadRequest, match="another shard"):
        list_plan(_options(token), origin=used)
