"""The empty-namespace cleanup without the permission to list (vwserver.syncer.namespaces): the
chart grants the broad ``list`` only with ``namespaceCleanup.enabled`` (off by default), so a
syncer without it must keep emptied namespaces, never delete one it could not check, and say so
once — not at every resync."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest

from tests.support.clock import FakeClock
from vwserver.errors import api_error
from vwserver.k8s.client import JSON, KubeClient
from vwserver.syncer.namespaces import Janitor
from vwserver.syncer.naming import downstream_namespace, namespace_metadata

BASE = "https://downstream.example:6443"
PREFIX = "kcp-"


def namespace(cluster: str) -> JSON:
    name = downstream_namespace(cluster, "default", prefix=PREFIX)
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{cluster}",
            **namespace_metadata(cluster, "default"),
        }
    }


class Forbidding:
    """A downstream API server whose RBAC grants get on namespaces and discovery, not list."""

    def __init__(self, *namespaces: JSON) -> None:
        self.namespaces = {n["metadata"]["name"]: n for n in namespaces}
        self.calls: list[tuple[str, str]] = []
        self.allow = False

    async def get(self, url: str) -> JSON | None:
        self.calls.append(("GET", url))
        return self.namespaces.get(url.rpartition("/")[2])

    async def request(self, method: str, url: str, **_: Any) -> JSON:
        self.calls.append((method, url))
        if url == f"{BASE}/api/v1":
            return {
                "groupVersion": "v1",
                "resources": [
                    {"name": "secrets", "namespaced": True, "kind": "Secret", "verbs": ["list"]}
                ],
            }
        if url == f"{BASE}/apis":
            return {"groups": []}
        if self.allow:
            return {"items": [{"metadata": {"name": "operator-data"}}], "metadata": {}}
        raise api_error(403, {"reason": "Forbidden", "message": "secrets is forbidden"}, url=url)

    async def delete(self, url: str, *, uid: str | None = None) -> None:
        self.calls.append(("DELETE", url))


async def test_without_list_permission_namespaces_are_kept_and_it_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second = namespace("c1"), namespace("c2")
    server = Forbidding(first, second)
    janitor = Janitor(client=cast(KubeClient, server), base=BASE, prefix=PREFIX, clock=FakeClock())
    with caplog.at_level(logging.WARNING, logger="vwserver.syncer.namespaces"):
        for _ in range(3):  # resyncs
            assert await janitor.check(first["metadata"]["name"]) is False
            assert await janitor.check(second["metadata"]["name"]) is False
            assert await janitor.check("kcp-gone-abcdefghij") is True  # no listing: no reset
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "needs list on every namespaced resource and delete on namespaces" in warnings[0]
    assert set(janitor.pending) == {first["metadata"]["name"], second["metadata"]["name"]}
    assert all(method != "DELETE" for method, _ in server.calls)
    # granted, a check lists (the namespace holds something: kept); revoked, it is news again
    server.allow = True
    assert await janitor.check(first["metadata"]["name"]) is False
    assert janitor.pending[first["metadata"]["name"]] == "secrets/operator-data"
    server.allow = False
    with caplog.at_level(logging.WARNING, logger="vwserver.syncer.namespaces"):
        assert await janitor.check(first["metadata"]["name"]) is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
