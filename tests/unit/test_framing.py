"""The one watch-line framer (vwserver.k8s.framing), shared by the proxy's hot path and the
control loops' client: complete lines, keep-alives, and the bound on one event."""

from __future__ import annotations

import pytest
from aiohttp import web

from tests.support.serve import serve_app
from vwserver.errors import ApiServerError, EventTooLarge
from vwserver.k8s.client import KubeClient
from vwserver.k8s.framing import MAX_EVENT_BYTES, complete, lines
from vwserver.k8s.kubeconfig import ClientAuth


def test_complete_lines_and_their_events() -> None:
    buffer = bytearray(b'{"a":1}\n\n\r\n{"b":2}\n{"c":')
    end = complete(buffer)
    assert end == len(b'{"a":1}\n\n\r\n{"b":2}\n')  # keep-alives are consumed too
    assert [bytes(buffer[s:e]) for s, e in lines(buffer, end)] == [b'{"a":1}\n', b'{"b":2}\n']
    assert complete(bytearray(b'{"partial":')) == 0
    assert list(lines(bytearray(b"\n\n"), 2)) == []


def test_an_unfinished_line_over_the_bound_is_refused() -> None:
    ok = bytearray(b"\n" + b"x" * MAX_EVENT_BYTES)
    assert complete(ok) == 1
    with pytest.raises(EventTooLarge):
        complete(ok + b"x")
    # a complete line may be as long as the bound allows
    assert complete(bytearray(b"x" * MAX_EVENT_BYTES + b"\n")) == MAX_EVENT_BYTES + 1


async def test_the_client_refuses_an_oversized_watch_event_as_a_bad_gateway() -> None:
    async def endless_line(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        chunk = b"x" * 2**20
        for _ in range(6):
            await response.write(chunk)
        return response

    app = web.Application()
    app.router.add_get("/w", endless_line)
    async with serve_app(app) as base, KubeClient(auth=ClientAuth(server=base)) as client:
        with pytest.raises(ApiServerError) as caught:
            async for _ in client.watch("/w"):
                pass
    assert caught.value.code == 502 and "larger than" in caught.value.message
