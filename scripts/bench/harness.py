"""Processes and requests that every benchmark shares: the fake upstream, vwserver, timing.

Upstream, proxy and the measuring clients run as separate processes, as in production: each has
its own core time, a process's RSS can be read from /proc, and a busy client cannot slow the
server it measures by sharing its event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from results import Ratio, Results, describe

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# The fake upstream (fakekcp) and the dev environment (devenv) live beside the package in the
# repository, not in it: the benchmarks and the processes they start import them from there.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("PYTHONPATH", str(REPO))

from tests.support.procfs import children  # noqa: E402 - importable once REPO is on the path

SLICE_CLUSTER = "benchslice"
EXPORT_CLUSTER = "exportid"
EXPORT_NAME = "widgets.example.io"
API = "/apis/example.io/v1alpha1/widgets"
SELECTOR = "env=prod"  # half of the fake's objects (and of the kcp objects the benchmark makes)
TOKEN = "bench-token"  # the proxy authenticates and authorizes the caller (caches warm)
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
WATCH_PARAMS = {
    "watch": "1",
    "sendInitialEvents": "true",
    "resourceVersionMatch": "NotOlderThan",
    "allowWatchBookmarks": "true",
}
#: Each fan-out watcher holds one connection from the same address.
UNLIMITED_CONNECTIONS = "connections: {maxConnectionsPerClient: 0}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_http(
    url: str, *, within: float = 60.0, ssl_context: ssl.SSLContext | None = None
) -> None:
    deadline = time.monotonic() + within
    connector = aiohttp.TCPConnector(ssl=ssl_context) if ssl_context else None
    async with aiohttp.ClientSession(connector=connector) as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as r:
                    if r.status < 500:
                        return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not come up in {within}s")
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def process(
    args: list[str], *, ready_url: str, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run *args* until the block ends (SIGTERM, then SIGKILL after 10 s)."""
    proc = await asyncio.create_subprocess_exec(*args, stdout=subprocess.DEVNULL, cwd=REPO)
    try:
        await wait_http(ready_url, ssl_context=ssl_context)
        yield proc
    finally:
        await stop(proc)


async def stop(proc: asyncio.subprocess.Process, *, grace: float = 10.0) -> None:
    if proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        proc.kill()
        await proc.wait()


@dataclass(frozen=True)
class Upstream:
    """The fake APIExport virtual workspace (``fake_server.py``), one process."""

    origin: str
    pid: int

    @property
    def vw(self) -> str:
        return f"{self.origin}/services/apiexport/{EXPORT_CLUSTER}/{EXPORT_NAME}"

    @property
    def list_url(self) -> str:
        return f"{self.vw}/clusters/*{API}"

    def namespaced_url(self, *, cluster: str = "cluster-0", namespace: str = "ns-0") -> str:
        group_version = API.removesuffix("/widgets")
        return f"{self.vw}/clusters/{cluster}{group_version}/namespaces/{namespace}/widgets"

    async def watches(self) -> int:
        """Watch responses the upstream is streaming right now."""
        async with aiohttp.ClientSession() as s, s.get(f"{self.origin}/bench/watches") as r:
            count: int = (await r.json())["watches"]
            return count


@contextlib.asynccontextmanager
async def fake_upstream(objects: int) -> AsyncIterator[Upstream]:
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    args = [sys.executable, str(HERE / "fake_server.py"), "--port", str(port)]
    args += ["--objects", str(objects), "--user", f"{TOKEN}@{SLICE_CLUSTER}/prod"]
    async with process(args, ready_url=origin + "/bench/watches") as proc:
        yield Upstream(origin, proc.pid)


@dataclass(frozen=True)
class ServingTLS:
    """vwserver's serving certificate (from a throwaway trustme CA) and that CA for clients."""

    cert_file: Path
    key_file: Path
    ca_file: Path

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))


def make_serving_tls(directory: Path) -> ServingTLS:
    import trustme  # a dev dependency, like the benchmarks

    from vwserver.files import write_private

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    tls = ServingTLS(directory / "tls.crt", directory / "tls.key", directory / "ca.crt")
    write_private(tls.key_file, cert.private_key_pem.bytes())
    cert.cert_chain_pems[0].write_to_path(str(tls.cert_file))
    ca.cert_pem.write_to_path(str(tls.ca_file))
    return tls


@dataclass(frozen=True)
class Proxy:
    """A vwserver process serving the benchmark's slice ``prod`` (``env=prod``)."""

    base: str
    pid: int
    slice_cluster: str = SLICE_CLUSTER
    workers: tuple[int, ...] = ()
    """The worker processes' pids (``workers: N`` > 1); empty: ``pid`` serves alone."""

    @property
    def server_pids(self) -> tuple[int, ...]:
        """The processes that serve (whose CPU and RSS are vwserver's)."""
        return self.workers or (self.pid,)

    @property
    def slice_base(self) -> str:
        return f"{self.base}/services/filtered-apiexport/{self.slice_cluster}/prod"

    @property
    def list_url(self) -> str:
        return f"{self.slice_base}/clusters/*{API}"


@contextlib.asynccontextmanager
async def vwserver(
    upstream_origin: str,
    *,
    page_size: int = 500,
    cache: bool = False,
    tls: ServingTLS | None = None,
    upstream_yaml: str | None = None,
    slice_yaml: str | None = None,
    slice_cluster: str = SLICE_CLUSTER,
    extra_yaml: str = "",
    workers: int = 1,
) -> AsyncIterator[Proxy]:
    """vwserver serving slice ``prod``; ``workers`` > 1: that many processes on its port
    (``vwserver serve --workers``), ready when the parent's health listener says every worker
    is."""
    port = free_port()
    if workers > 1:
        health_port = free_port()
        extra_yaml += f"\nworkers: {workers}\nhealth: {{host: 127.0.0.1, port: {health_port}}}\n"
    upstream_yaml = upstream_yaml or f'{{server: "{upstream_origin}", token: bench}}'
    slice_yaml = slice_yaml or f"export: {{cluster: {EXPORT_CLUSTER}, name: {EXPORT_NAME}}}"
    serving = (
        f"tls: {{certFile: {tls.cert_file}, keyFile: {tls.key_file}}}"
        if tls
        else "insecureServing: true"
    )
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(
            f"""
listen: {{host: 127.0.0.1, port: {port}}}
{serving}
upstream: {upstream_yaml}
listPageSize: {page_size}
cache: {{enabled: {str(cache).lower()}}}
{extra_yaml}
logLevel: error
slices:
  - cluster: {slice_cluster}
    name: prod
    {slice_yaml}
    selector: {{matchLabels: {{env: prod}}}}
"""
        )
        base = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        args = [sys.executable, "-m", "vwserver.cli", "serve", "--config", str(config)]
        ctx = tls.client_context() if tls else None
        async with process(args, ready_url=base + "/readyz", ssl_context=ctx) as proc:
            pids: tuple[int, ...] = ()
            if workers > 1:
                await wait_http(f"http://127.0.0.1:{health_port}/readyz")
                pids = tuple(children(proc.pid))
                if len(pids) != workers:
                    raise RuntimeError(f"{workers} workers asked for, {len(pids)} running")
            yield Proxy(base, proc.pid, slice_cluster, workers=pids)


async def cache_reads(proxy: Proxy, *, ssl_context: ssl.SSLContext | None = None) -> dict[str, int]:
    """vwserver's cache reads so far by outcome: ``served`` from the cache, or ``fallback``
    (the cache could not answer in time, and the upstream did)."""
    connector = aiohttp.TCPConnector(ssl=ssl_context) if ssl_context else None
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.get(f"{proxy.base}/metrics") as r,
    ):
        text = await r.text()
    reads = {"served": 0, "fallback": 0}
    for line in text.splitlines():
        if line.startswith("vwserver_cache_reads_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            reads[outcome] = reads.get(outcome, 0) + int(float(line.rsplit(" ", 1)[1]))
    return reads


def note_cache_reads(results: Results, what: str, reads: dict[str, int]) -> None:
    """Say how many of the cache's reads it answered itself: a LIST that finds the cache not
    synced waits for it, then goes to the upstream, and is timed as the cache path all the same."""
    note = (
        f"{what}: {reads['served']} reads answered by vwserver's cache, "
        f"{reads['fallback']} by the upstream after waiting for the cache"
    )
    results.notes.append(note)
    print(f"{'':<44} {note}")


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(f"/proc/{pid}/status has no {field}")


def rss_kib(pid: int) -> int:
    return _status_kib(pid, "VmRSS")


def peak_rss_kib(pid: int) -> int:
    return _status_kib(pid, "VmHWM")


def cpu_seconds(pid: int) -> float:
    """CPU time all of a process's threads have used so far, to the nanosecond: the first
    field of each thread's /proc schedstat (/proc/PID/stat counts in 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def session(
    *, headers: Mapping[str, str] = HEADERS, ssl_context: ssl.SSLContext | None = None
) -> aiohttp.ClientSession:
    """A client session that sends the benchmark's token and takes bodies uncompressed."""
    connector = aiohttp.TCPConnector(limit=0, ssl=ssl_context if ssl_context else True)
    return aiohttp.ClientSession(
        connector=connector,
        headers=dict(headers),
        skip_auto_headers=("Accept-Encoding",),
        timeout=aiohttp.ClientTimeout(total=600),
    )


async def timed_rounds(
    calls: Mapping[str, Callable[[], Awaitable[int]]], repeat: int
) -> dict[str, tuple[float, int]]:
    """Median seconds and the item count of each call, run in turn *repeat* times so that
    a slow spell of the shared machine hits every path alike."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    counts: dict[str, int] = {}
    for _ in range(repeat):
        for name, fn in calls.items():
            start = time.perf_counter()
            counts[name] = await fn()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(times[name]), counts[name]) for name in calls}


async def list_once(session: aiohttp.ClientSession, url: str, params: dict[str, str]) -> int:
    async with session.get(url, params=params) as r:
        if r.status != 200:
            raise RuntimeError(f"LIST {url}: {r.status} {await r.text()}")
        body = await r.read()
    return body.count(b'"kind":"Widget"')


async def paged(session: aiohttp.ClientSession, url: str, params: dict[str, str]) -> int:
    """A LIST paged by the client, like kubectl and client-go's pager (limit=500)."""
    count, token = 0, ""
    while True:
        query = {**params, "limit": "500", **({"continue": token} if token else {})}
        async with session.get(url, params=query) as r:
            if r.status != 200:
                raise RuntimeError(f"LIST {url}: {r.status} {await r.text()}")
            doc = await r.json()
        count += len(doc["items"])
        token = doc["metadata"].get("continue", "")
        if not token:
            return count


async def watch_once(session: aiohttp.ClientSession, url: str, params: dict[str, str]) -> int:
    """The initial events of a watch-list, up to the ``initial-events-end`` bookmark."""
    events = 0
    async with session.get(url, params=params) as r:
        if r.status != 200:
            raise RuntimeError(f"WATCH {url}: {r.status} {await r.text()}")
        buffer = b""
        async for chunk in r.content.iter_any():
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.startswith(b'{"type":"BOOKMARK"') and b"initial-events-end" in line:
                    return events
                events += 1
    return events


def widget(name: str, *, env: str = "prod", namespace: str | None = "ns-0") -> dict[str, object]:
    meta: dict[str, object] = {"name": name, "labels": {"env": env, "bench": "yes"}}
    if namespace is not None:
        meta["namespace"] = namespace
    return {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": meta,
        "spec": {"size": 1, "color": "red"},
    }


def record(results: Results, key: str, ratio: Ratio) -> None:
    """Keep *ratio* under *key* and print it."""
    results.ratios[key] = ratio
    print(describe(ratio), flush=True)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"
