"""Write load in a process of its own: every verb of a controller, at a fixed concurrency.

Driven over stdin/stdout by the writes arm (``writes.py``), one JSON command per line, so that
the arm can read kcp's and vwserver's counters between runs while this process keeps its
keep-alive connections (one aiohttp session per target, one connection per worker, opened
before the clock starts). Every worker writes an object of its own (a controller writes many
objects, rarely one at once), so nothing here conflicts with itself; each write carries what
the worker read last, as a controller's does (PUT needs the resourceVersion: a CRD allows no
unconditional update). Commands:

``{"prepare": W}``: create W objects per target (``<target>-w<k>``), read back.
``{"warm": T, "concurrency": C}``: open C connections to target T (one GET each).
``{"target": T, "verb": V, "concurrency": C, "ops": N, "prefix": P}``: N operations of verb V
on target T by C workers; create makes ``P-<i>``, delete removes them again. Answers
``{"latencies": [seconds...], "seconds": wall}`` or ``{"error": "..."}``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import ssl
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import aiohttp
import msgspec
import uvloop

VERBS = ("create", "get", "update", "merge_patch", "json_patch", "apply", "status_patch", "delete")
LABELS = {"env": "prod", "bench": "writes"}  # inside the slice (env=prod), the same for both
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"  # JSON is YAML
TOKEN_ENV = "BENCH_WRITE_TOKEN"
Request = tuple[str, str, dict[str, str], bytes | None, tuple[int, ...]]


def widget(name: str, *, size: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": name, "labels": dict(LABELS)},
        "spec": {"size": size, "color": "red"},
    }


class Target:
    """One collection URL and the objects its workers own there."""

    def __init__(self, name: str, url: str, session: aiohttp.ClientSession) -> None:
        self.name, self.url, self.session = name, url, session
        self.objects: list[dict[str, Any]] = []
        self.turn = 0  # a counter that makes every write change something

    def next_size(self, k: int) -> int:
        size: int = self.objects[k]["spec"].get("size", 0)
        return (size + 1) % 100

    def request(self, verb: str, k: int, i: int, prefix: str) -> Request:
        """(method, url, headers, body, accepted statuses) of operation *i* by worker *k*."""
        enc = msgspec.json.encode
        obj = self.objects[k] if k < len(self.objects) else {}
        one = f"{self.url}/{obj.get('metadata', {}).get('name', '')}"
        self.turn += 1
        if verb == "create":
            return "POST", self.url, {}, enc(widget(f"{prefix}-{i}")), (201,)
        if verb == "delete":
            return "DELETE", f"{self.url}/{prefix}-{i}", {}, None, (200,)
        if verb == "get":
            return "GET", one, {}, None, (200,)
        size = self.next_size(k)
        if verb == "update":
            replaced = copy.deepcopy(obj)
            replaced["spec"]["size"] = size
            return "PUT", one, {}, enc(replaced), (200,)
        if verb == "merge_patch":
            return "PATCH", one, {"Content-Type": MERGE}, enc({"spec": {"size": size}}), (200,)
        if verb == "json_patch":
            patch = [{"op": "replace", "path": "/spec/size", "value": size}]
            return "PATCH", one, {"Content-Type": JSON_PATCH}, enc(patch), (200,)
        if verb == "apply":
            applied = {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "metadata": {"name": obj["metadata"]["name"]},
                "spec": {"size": size},
            }
            url = f"{one}?fieldManager=bench-apply&force=true"
            return "PATCH", url, {"Content-Type": APPLY}, enc(applied), (200,)
        if verb == "status_patch":
            body = enc({"status": {"phase": f"p{self.turn}"}})
            return "PATCH", f"{one}/status", {"Content-Type": MERGE}, body, (200,)
        raise ValueError(f"unknown verb {verb}")


async def send(target: Target, req: Request) -> dict[str, Any]:
    method, url, headers, body, ok = req
    async with target.session.request(method, url, data=body, headers=headers) as r:
        raw = await r.read()
        if r.status not in ok:
            raise RuntimeError(f"{method} {url}: {r.status} {raw[:400]!r}")
    doc: dict[str, Any] = msgspec.json.decode(raw)
    return doc


async def prepare(target: Target, workers: int) -> None:
    async def one(k: int) -> dict[str, Any]:
        name = f"{target.name}-w{k}"
        method, url = "POST", target.url
        async with target.session.post(url, data=msgspec.json.encode(widget(name))) as r:
            if r.status not in (201, 409):
                raise RuntimeError(f"{method} {url}: {r.status} {await r.text()}")
        return await send(target, ("GET", f"{target.url}/{name}", {}, None, (200,)))

    target.objects = list(await asyncio.gather(*(one(k) for k in range(workers))))


async def warm(target: Target, *, concurrency: int) -> None:
    """Every worker's connection open (and the caches of whoever answers warm) before a run:
    one GET of its object each, at once. A command of its own, so that the arm counts
    nothing of it."""
    requests = [target.request("get", k, 0, "") for k in range(concurrency)]
    await asyncio.gather(*(send(target, req) for req in requests))


async def run(
    target: Target, *, verb: str, concurrency: int, ops: int, prefix: str
) -> dict[str, Any]:
    latencies: list[float] = []
    counter = iter(range(ops))

    async def worker(k: int) -> None:
        for i in counter:
            req = target.request(verb, k, i, prefix)
            start = time.perf_counter()
            doc = await send(target, req)
            latencies.append(time.perf_counter() - start)
            if verb not in ("create", "delete"):
                target.objects[k] = doc

    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(worker(k) for k in range(concurrency))), 900)
    return {"latencies": latencies, "seconds": time.perf_counter() - started}


async def serve(targets: dict[str, str], *, token: str, ca: str | None) -> None:
    context = ssl.create_default_context(cafile=ca) if ca else None
    sessions = {
        name: aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ssl=context if context else True),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            skip_auto_headers=("Accept-Encoding",),
            timeout=aiohttp.ClientTimeout(total=120),
        )
        for name in targets
    }
    by_name = {name: Target(name, url, sessions[name]) for name, url in targets.items()}
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    answer: Callable[[object], None] = lambda doc: print(  # noqa: E731
        msgspec.json.encode(doc).decode(), flush=True
    )
    try:
        while line := await reader.readline():
            command = msgspec.json.decode(line)
            try:
                if "prepare" in command:
                    for target in by_name.values():
                        await prepare(target, int(command["prepare"]))
                    answer({"ok": True})
                elif "warm" in command:
                    await warm(by_name[command["warm"]], concurrency=int(command["concurrency"]))
                    answer({"ok": True})
                else:
                    answer(
                        await run(
                            by_name[command["target"]],
                            verb=command["verb"],
                            concurrency=int(command["concurrency"]),
                            ops=int(command["ops"]),
                            prefix=command["prefix"],
                        )
                    )
            except Exception as e:
                traceback.print_exc()
                answer({"error": f"{type(e).__name__}: {e}"})
    finally:
        for session in sessions.values():
            await session.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="append", required=True, metavar="NAME=URL")
    parser.add_argument("--ca", help="CA file for https targets")
    args = parser.parse_args()
    targets = dict(t.split("=", 1) for t in args.target)
    # The bearer token comes in the environment, not on the command line (which ps shows).
    uvloop.run(serve(targets, token=os.environ[TOKEN_ENV], ca=args.ca))


if __name__ == "__main__":
    main()
