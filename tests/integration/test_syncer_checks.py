"""``vwserver sync`` checks every configured resource against discovery before syncing: a typo
ends the process at once with exit code 2 and one line naming the field and suggesting the
served name — instead of a 404 retried forever. Real servers: the fake kcp VW upstream and a
fake downstream cluster (:mod:`tests.integration.syncer_support`)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from tests.integration.syncer_support import (
    downstream_fake,
    upstream_fake,
    widget,
    write_kubeconfig,
)
from tests.support.clock import FakeClock
from tests.support.serve import serve_app
from vwserver.errors import ConfigError
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.k8s.resources import ResourceType
from vwserver.syncer.checks import Wanted, check_served

TIMEOUT = 30.0
WIDGETS = {"group": "example.io", "version": "v1alpha1", "resource": "widgets", "kind": "Widget"}


@pytest.mark.parametrize(
    ("resource", "where"),
    [
        # the same type on both sides: the downstream cluster is asked first
        ({**WIDGETS, "resource": "widget"}, "the downstream cluster"),
        # only the upstream name is wrong: the endpoint's discovery (the wildcard) says so
        ({**WIDGETS, "resource": "widget", "downstream": WIDGETS}, "/clusters/*"),
    ],
    ids=["downstream", "upstream"],
)
async def test_a_typo_in_a_plural_exits_2_naming_the_field(
    tmp_path: Path, resource: dict[str, Any], where: str
) -> None:
    async with upstream_fake() as (up, vw_url), downstream_fake() as (_, _, port, prefix):
        up.create(cluster="c1", obj=widget("w1"))
        write_kubeconfig(tmp_path / "kcp.kubeconfig", vw_url.split("/services/", 1)[0])
        write_kubeconfig(tmp_path / "down.kubeconfig", f"http://127.0.0.1:{port}{prefix}")
        config = tmp_path / "syncer.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "name": "eu",
                    "upstream": {"kubeconfig": "kcp.kubeconfig", "urls": [vw_url]},
                    "downstream": {"kubeconfig": "down.kubeconfig"},
                    "resources": [resource],
                    "health": {"port": 0},
                }
            )
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vwserver.cli", "sync", "--config", str(config),
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            _, stderr = await asyncio.wait_for(proc.communicate(), TIMEOUT)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 2
    last = stderr.decode().splitlines()[-1]
    assert last.startswith(
        'vwserver sync: invalid configuration: $.resources[0].resource: "widget" is not served by '
    )
    assert where in last
    assert last.endswith('(example.io/v1alpha1); did you mean "widgets"?')


class LaggingDiscovery:
    """A server whose discovery of example.io/v1alpha1 is empty for its first ``lag`` answers
    (as kcp's is for a few seconds after the CRD was created), then lists Widgets."""

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.asked = 0

    def app(self) -> web.Application:
        async def group_version(_: web.Request) -> web.Response:
            self.asked += 1
            resources = [] if self.asked <= self.lag else [WIDGET_RESOURCE]
            return web.json_response(
                {"kind": "APIResourceList", "groupVersion": "example.io/v1alpha1",
                 "resources": resources}
            )  # fmt: skip

        app = web.Application()
        app.router.add_get("/apis/example.io/v1alpha1", group_version)
        return app


WIDGET_RESOURCE = {
    "name": "widgets",
    "singularName": "widget",
    "namespaced": True,
    "kind": "Widget",
}


@pytest.mark.parametrize(("lag", "verdict"), [(2, None), (10, "not served")])
async def test_not_served_is_a_verdict_only_once_discovery_keeps_saying_so(
    lag: int, verdict: str | None
) -> None:
    """A resource missing from discovery is asked for again after 1, 2 and 4 (fake) seconds:
    discovery that catches up meanwhile is fine; discovery that never does is a ConfigError."""
    server = LaggingDiscovery(lag)
    clock = FakeClock()
    wanted = [Wanted("$.resources[0]", ResourceType("example.io", "v1alpha1", "widgets", "Widget"))]
    async with serve_app(server.app()) as base, KubeClient(auth=ClientAuth(server=base)) as client:
        check = check_served(client, base, wanted, where=base, status=False, clock=clock)
        if verdict is None:
            await check
            assert clock.sleeps == [1.0, 2.0]
        else:
            with pytest.raises(ConfigError, match=verdict) as info:
                await check
            assert info.value.field == "$.resources[0].resource"
            assert clock.sleeps == [1.0, 2.0, 4.0]
