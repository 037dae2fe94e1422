"""Metrics and request logs of the proxy (issue #7), over real sockets with the guard on.

Each test builds its own app with its own :class:`~vwserver.metrics.ServerMetrics`, so counts
start at zero and can be compared exactly; the fake upstream also plays kcp's reviews.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from fakekcp.auth import FakeAuth
from fakekcp.upstream import FakeUpstream, start_fake_upstream
from tests.support.serve import serve_app
from vwserver.auth.access import AccessReviewer
from vwserver.auth.guard import Guard
from vwserver.auth.tokens import TokenReviewer
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.logs import FIELDS_ATTR, REQUEST_ID, JsonFormatter, formatter
from vwserver.metrics import ServerMetrics
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Routes
from vwserver.server import build_app

from .conftest import PROXY_TOKEN, SLICE_CLUSTER, routes_for, widget

WIDGETS = "/apis/example.io/v1alpha1/namespaces/ns1/widgets"
TOKEN = "alice-token-7f3a9c"
ALICE = {"Authorization": f"Bearer {TOKEN}"}
PROD = f"{SLICE_CLUSTER}/prod"
TIMEOUT = 10.0


@dataclass
class Env:
    fake: FakeUpstream
    base: str
    session: aiohttp.ClientSession
    metrics: ServerMetrics

    def url(self, slice_name: str = "prod", path: str = WIDGETS) -> str:
        return f"{self.base}/services/filtered-apiexport/{SLICE_CLUSTER}/{slice_name}/clusters/c1{path}"

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    async def list(self, slice_name: str = "prod", **headers: str) -> int:
        async with self.session.get(self.url(slice_name), headers=headers or ALICE) as r:
            await r.read()
            return r.status


@contextlib.asynccontextmanager
async def metered_env() -> AsyncIterator[Env]:
    fake = FakeUpstream(bookmark_interval=0.2)
    fake.create(cluster="c1", obj=widget("p1", env="prod"))
    fake.create(cluster="c1", obj=widget("d1", env="dev"))
    auth = FakeAuth(reviewer_token=PROXY_TOKEN)
    auth.add_user(TOKEN, "alice")
    auth.grant(cluster=SLICE_CLUSTER, slice_name="prod", user="alice")
    auth.install(fake.app)
    metrics = ServerMetrics()
    async with start_fake_upstream(fake) as (_, vw_url):
        identity = ClientAuth(server=vw_url.removesuffix(fake.base_path), token=PROXY_TOKEN)
        async with KubeClient(auth=identity, timeout=5) as reviews:
            guard = Guard(
                tokens=TokenReviewer(client=reviews), access=AccessReviewer(client=reviews)
            )
            app = build_app(
                routes=Routes(routes_for(vw_url)),
                upstream=UpstreamClient(auth=identity),
                guard=guard,
                metrics=metrics,
            )
            async with serve_app(app) as base, aiohttp.ClientSession() as session:
                yield Env(fake, base, session, metrics)


async def eventually(check: Callable[[], bool], *, timeout: float = TIMEOUT) -> None:
    async with asyncio.timeout(timeout):
        while True:  # polled: metrics have no events to wait for
            if check():
                return
            await asyncio.sleep(0.01)


async def test_requests_are_counted_by_slice_verb_and_code_and_scraped_without_auth() -> None:
    async with metered_env() as env:
        assert await env.list() == 200
        assert await env.list("eu-not-dev") == 403  # a slice alice may not use
        assert await env.list("no-such-slice") == 403  # a name anyone can invent
        assert await env.list(Authorization="Bearer wrong") == 401
        requests = "vwserver_requests_total"
        assert env.sample(requests, slice=PROD, verb="list", code="200") == 1
        assert env.sample(requests, slice=PROD, verb="list", code="401") == 1
        assert (
            env.sample(requests, slice=f"{SLICE_CLUSTER}/eu-not-dev", verb="list", code="403") == 1
        )
        # only served slices become label values
        assert env.sample(requests, slice="unknown", verb="list", code="403") == 1
        assert env.sample("vwserver_request_duration_seconds_count", verb="list") == 4
        async with env.session.get(env.base + "/metrics") as r:  # no credentials needed
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain; version=")
            text = await r.text()
        assert f'vwserver_requests_total{{code="200",slice="{PROD}",verb="list"}} 1.0' in text
        assert "no-such-slice" not in text
        assert all(not r.path.endswith("/metrics") for r in env.fake.faults.requests)


async def test_watch_events_open_watches_and_latency_until_the_headers() -> None:
    async with metered_env() as env:
        env.fake.faults.ignore_selectors = True  # the proxy's own filter decides every event
        rv = str(env.fake.resource_version)
        url = env.url() + f"?watch=true&resourceVersion={rv}"
        async with env.session.get(url, headers=ALICE) as watch:
            assert watch.status == 200
            assert env.sample("vwserver_open_watches", slice=PROD) == 1
            p2 = env.fake.create(cluster="c1", obj=widget("p2", env="prod"))  # forwarded
            d2 = env.fake.create(cluster="c1", obj=widget("d2", env="dev"))  # dropped
            d2["spec"]["size"] = 2
            env.fake.update(cluster="c1", obj=d2)  # never shown: dropped (no DELETED)
            p2["metadata"]["labels"]["env"] = "dev"
            env.fake.update(cluster="c1", obj=p2)  # shown, now outside: synthesized DELETED
            seen = []
            async with asyncio.timeout(TIMEOUT):
                while len(seen) < 2:
                    event = json.loads(await watch.content.readline())
                    seen.append((event["type"], event["object"]["metadata"]["name"]))
            assert seen == [("ADDED", "p2"), ("DELETED", "p2")]
            events = "vwserver_watch_events_total"
            assert env.sample(events, slice=PROD, outcome="forwarded") == 1
            assert env.sample(events, slice=PROD, outcome="dropped") == 2
            assert env.sample(events, slice=PROD, outcome="synthesized") == 1
            await asyncio.sleep(0.3)  # the watch stays open a while longer
        # the client hung up: the watch ends, counted with the status it had sent
        await eventually(lambda: env.sample("vwserver_open_watches", slice=PROD) == 0)
        await eventually(
            lambda: env.sample("vwserver_requests_total", slice=PROD, verb="watch", code="200") == 1
        )
        # its latency is the time to establish it, not the (≥ 0.3 s) time it was open
        assert env.sample("vwserver_request_duration_seconds_count", verb="watch") == 1
        assert env.sample("vwserver_request_duration_seconds_sum", verb="watch") < 0.3


async def test_upstream_errors_are_counted_by_kind() -> None:
    async with metered_env() as env:
        assert await env.list() == 200  # kcp's review answers are cached from here on
        faults = env.fake.faults
        errors = "vwserver_upstream_errors_total"
        faults.unreachable = True
        assert await env.list() == 503
        assert env.sample(errors, kind="unreachable") == 1
        faults.reset()
        faults.status_code = 500
        assert await env.list() == 500  # relayed
        assert env.sample(errors, kind="5xx") == 1
        faults.reset()
        faults.garbage = True
        assert await env.list() == 502
        async with env.session.get(env.url() + "?watch=true", headers=ALICE) as r:
            assert r.status == 200
            await asyncio.wait_for(r.read(), TIMEOUT)  # the broken watch ends cleanly
        assert env.sample(errors, kind="bad_gateway") == 2
        assert env.sample(errors, kind="unreachable") == 1
        # the proxy's own 503 (a slice that is not ready) is not an upstream error
        assert env.sample(errors, kind="5xx") == 1


@contextlib.contextmanager
def captured_logs() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """Everything logged, at DEBUG, in both formats."""
    root = logging.getLogger()
    outputs = io.StringIO(), io.StringIO()
    handlers = []
    for out, fmt in zip(outputs, ("json", "text"), strict=True):
        handler = logging.StreamHandler(out)
        handler.setFormatter(formatter(fmt))  # type: ignore[arg-type]
        handlers.append(handler)
        root.addHandler(handler)
    level = root.level
    root.setLevel(logging.DEBUG)
    try:
        yield outputs
    finally:
        root.setLevel(level)
        for handler in handlers:
            root.removeHandler(handler)


async def test_one_log_line_per_request_without_tokens_query_or_contents() -> None:
    body = widget("new", env="prod")
    body["spec"]["secret"] = "s3cr3t-spec-value"
    with captured_logs() as (json_out, text_out):
        async with metered_env() as env:
            url = env.url() + "?fieldManager=query-marker"
            async with env.session.post(url, json=body, headers=ALICE) as r:
                assert r.status == 201
                assert b"s3cr3t-spec-value" in await r.read()  # it was there to be logged
            env.fake.faults.garbage = True
            async with env.session.get(env.url() + "?watch=true", headers=ALICE) as r:
                await asyncio.wait_for(r.read(), TIMEOUT)
    lines = [json.loads(line) for line in json_out.getvalue().splitlines()]
    access = [line for line in lines if line["logger"] == "vwserver.access"]
    create, watch = access
    assert create["msg"].startswith("POST ")
    assert {k: create[k] for k in ("method", "code", "verb", "slice", "user")} == {
        "method": "POST",
        "code": 201,
        "verb": "create",
        "slice": PROD,
        "user": "alice",
    }
    assert create["path"].endswith(WIDGETS)
    assert create["durationMs"] >= 0 and create["level"] == "info"
    assert create["requestId"] != watch["requestId"]
    # a warning logged while the watch was served carries that request's id
    (warning,) = [line for line in lines if line["msg"].startswith("watch on widgets ended")]
    assert warning["requestId"] == watch["requestId"] and warning["level"] == "warning"
    text = text_out.getvalue()
    assert "POST /services/filtered-apiexport/slicews/prod/clusters/c1" in text
    assert "201 create slice=slicews/prod user=alice" in text
    for secret in (TOKEN, "s3cr3t-spec-value", "query-marker", "spec-of-"):
        assert secret not in json_out.getvalue()
        assert secret not in text


def test_json_lines_carry_request_id_fields_and_exceptions() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("here",), None)
    setattr(record, FIELDS_ATTR, {"slice": "a/b"})
    try:
        raise ValueError("boom")
    except ValueError:
        record.exc_info = sys.exc_info()
    token = REQUEST_ID.set("req-1")
    try:
        doc: dict[str, Any] = json.loads(JsonFormatter().format(record))
    finally:
        REQUEST_ID.reset(token)
    assert doc["msg"] == "failed here" and doc["level"] == "error" and doc["logger"] == "x"
    assert (doc["requestId"], doc["slice"]) == ("req-1", "a/b")
    assert "ValueError: boom" in doc["exc"]
    assert doc["time"].endswith("+00:00")
    outside: dict[str, Any] = json.loads(JsonFormatter().format(record))
    assert "requestId" not in outside


@pytest.fixture(autouse=True)
def _no_leaked_request_id() -> Iterator[None]:
    yield
    assert REQUEST_ID.get() is None


async def test_refusals_are_logged_and_counted_with_their_own_code_and_user() -> None:
    """A 403 names the refused user in the log (not '-'); a body over the limit is a 413
    Status, counted as 413 (not 500)."""
    with captured_logs() as (json_out, _):
        async with metered_env() as env:
            assert await env.list("eu-not-dev") == 403  # alice is granted prod only
            big = b'{"metadata":{"name":"x"},"pad":"' + b"x" * (5 * 2**20) + b'"}'
            async with env.session.post(
                env.url(),
                data=io.BytesIO(big),
                headers={**ALICE, "Content-Type": "application/json"},
            ) as r:
                doc = await r.json()
            assert r.status == 413 and doc["reason"] == "RequestEntityTooLarge", doc
            assert env.sample("vwserver_requests_total", slice=PROD, verb="create", code="413")
            assert not env.sample("vwserver_requests_total", slice=PROD, verb="create", code="500")
    lines = [json.loads(line) for line in json_out.getvalue().splitlines()]
    access = [line for line in lines if line["logger"] == "vwserver.access"]
    denied = next(line for line in access if line["code"] == 403)
    assert denied["user"] == "alice"
