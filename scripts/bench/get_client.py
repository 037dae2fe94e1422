"""GET load in a process of its own: keep-alive connections at a fixed concurrency.

Every target (direct, vwserver, nginx) gets the same client, the same object and the same
number of requests; the rounds take the targets in a rotating order, so a slow spell of the
shared machine does not fall on one of them only. Prints one JSON line:
``{TARGET: {CONCURRENCY: [latency seconds, ...]}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rawhttp import address, get_request, read_response

WARM_UP = 3  # requests per connection before timing: connection set-up, auth caches


async def load(url: str, *, token: str, concurrency: int, requests: int) -> list[float]:
    host, port, _ = address(url)
    request = get_request(url, token=token)
    latencies: list[float] = []
    left = requests
    ready, warm = asyncio.Event(), 0

    async def one(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, into: list[float] | None
    ) -> None:
        start = time.perf_counter()
        writer.write(request)
        status, _ = await read_response(reader)
        if status != 200:
            raise RuntimeError(f"GET {url}: {status}")
        if into is not None:
            into.append(time.perf_counter() - start)

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            await requests_on(reader, writer)
        except (OSError, asyncio.IncompleteReadError) as e:
            raise RuntimeError(f"GET {url}: {type(e).__name__}: {e}") from e
        finally:
            writer.close()

    async def requests_on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal left, warm
        for _ in range(WARM_UP):
            await one(reader, writer, None)
        # Every connection is warm before the clock starts for any of them.
        warm += 1
        if warm == concurrency:
            ready.set()
        await ready.wait()
        while left > 0:
            left -= 1
            await one(reader, writer, latencies)

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), 600)
    return latencies


async def run(
    targets: dict[str, str], *, token: str, concurrency: list[int], requests: int, rounds: int
) -> dict[str, dict[int, list[float]]]:
    out: dict[str, dict[int, list[float]]] = {name: {} for name in targets}
    names = list(targets)
    for c in concurrency:
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                got = await load(targets[name], token=token, concurrency=c, requests=requests)
                out[name].setdefault(c, []).extend(got)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="append", required=True, metavar="NAME=URL")
    parser.add_argument("--token", required=True)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--requests", type=int, default=2000, help="per target, level and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    result = uvloop.run(
        run(
            dict(t.split("=", 1) for t in args.target),
            token=args.token,
            concurrency=[int(c) for c in args.concurrency.split(",")],
            requests=args.requests,
            rounds=args.rounds,
        )
    )
    # The answer is one line of every latency (hundreds of KiB at thousands of requests); a
    # stdout left non-blocking would cut it at the pipe's 64 KiB.
    os.set_blocking(sys.stdout.fileno(), True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
