"""A LIST with ``resourceVersion=N`` and no limit, answered by kcp, is not older than N.

The apiserver's rules (k8s.io/apiserver, ``storage.ListOptions``): ``resourceVersion=N`` without
``resourceVersionMatch`` means NotOlderThan N — any state at least as new — unless the request
also has a ``limit``, when it means Exact N (the legacy paging rule); ``resourceVersionMatch=
Exact`` is exactly N. vwserver's pass-through path pages a list the client asked for whole with
its own limit (``listPageSize``), so it must say NotOlderThan itself: otherwise an informer that
relists at N after a 410 gets its old state back (and 410 again from its watch at N), or 410 for
the list too once N has left the upstream's history.

Against the fake APIExport virtual workspace (which implements the three rules) through a
vwserver without the cache (every read goes to the upstream) whose page size (2) splits the
slice's three objects over two upstream pages.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.conftest import Env

SIZE_AT_N = 1  # spec.size of every widget as the fixture creates it


def sizes(doc: dict[str, Any]) -> dict[str, int]:
    return {i["metadata"]["name"]: i["spec"]["size"] for i in doc["items"]}


def resize(env: Env, name: str, size: int) -> None:
    """Change c1's widget ``name`` in the upstream (a new resourceVersion)."""
    obj = env.fake.get(cluster="c1", namespace="ns1", name=name)
    assert obj is not None
    obj["spec"]["size"] = size
    env.fake.update(cluster="c1", obj=obj)


async def test_a_list_at_an_older_resource_version_is_answered_with_the_current_state(
    env: Env,
) -> None:
    n = env.fake.resource_version
    resize(env, "w0", 7)
    now = env.fake.resource_version
    status, doc = await env.get_json(env.widgets(ns=None), params={"resourceVersion": str(n)})
    assert status == 200, doc
    assert sizes(doc) == {"w0": 7, "w2": SIZE_AT_N, "w4": SIZE_AT_N}  # not the state at N
    assert int(doc["metadata"]["resourceVersion"]) >= now
    assert "continue" not in doc["metadata"]  # one whole list, as asked


async def test_a_list_at_a_resource_version_the_upstream_forgot_is_no_410(env: Env) -> None:
    """The informer's relist after its watch got 410 at N: N has left the history (the fake
    keeps 20 events), which only an exact read at N cares about."""
    n = env.fake.resource_version
    for size in range(2, 32):
        resize(env, "w2", size)
    status, doc = await env.get_json(env.widgets(ns=None), params={"resourceVersion": str(n)})
    assert status == 200, doc
    assert sizes(doc) == {"w0": SIZE_AT_N, "w2": 31, "w4": SIZE_AT_N}
    assert int(doc["metadata"]["resourceVersion"]) >= env.fake.resource_version


@pytest.mark.parametrize(
    "exact",
    [{"resourceVersionMatch": "Exact"}, {"limit": "10"}],
    ids=["resourceVersionMatch=Exact", "legacy-limit"],
)
async def test_an_exact_list_is_still_the_state_at_n(env: Env, exact: dict[str, str]) -> None:
    """What the client asks to be exact stays exact (the proxy adds NotOlderThan only where
    its own limit would have changed the meaning)."""
    n = env.fake.resource_version
    resize(env, "w0", 7)
    params = {"resourceVersion": str(n), **exact}
    status, doc = await env.get_json(env.widgets(ns=None), params=params)
    assert status == 200, doc
    assert sizes(doc) == {"w0": SIZE_AT_N, "w2": SIZE_AT_N, "w4": SIZE_AT_N}
    assert doc["metadata"]["resourceVersion"] == str(n)
