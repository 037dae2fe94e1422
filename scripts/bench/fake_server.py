"""The fake upstream as the benchmarks run it: ``fakekcp`` plus a count of its open watches.

A benchmark claims that a thousand watchers of a slice cost *one* upstream watch; this process
answers ``GET /bench/watches`` with the watch responses it is streaming, so the claim is checked
where it matters, at the upstream. The fake also records every request for tests' assertions; a
benchmark would only grow that record, so it is emptied every second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fakekcp.auth import FakeAuth
from fakekcp.upstream import FakeUpstream, demo_objects, start_fake_upstream


async def serve(*, port: int, objects: int, user: str) -> None:
    fake = FakeUpstream()
    for cluster, items in demo_objects(objects, clusters=4, namespaces=3).items():
        fake.bulk_load(cluster=cluster, objects=items)
    token, _, grant = user.partition("@")
    cluster, _, slice_name = grant.partition("/")
    auth = FakeAuth()
    auth.add_user(token, "bench-user")
    auth.grant(cluster=cluster, slice_name=slice_name, user="bench-user")
    auth.install(fake.app)

    async def watches(_: web.Request) -> web.Response:
        return web.json_response({"watches": fake.active_watches})

    fake.app.router.add_get("/bench/watches", watches)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with start_fake_upstream(fake, port=port):
        while not stop.is_set():
            fake.faults.requests.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--user", required=True, metavar="TOKEN@CLUSTER/SLICE")
    args = parser.parse_args()
    asyncio.run(serve(port=args.port, objects=args.objects, user=args.user))


if __name__ == "__main__":
    main()
