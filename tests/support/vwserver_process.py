"""``vwserver serve`` as a process of its own, over TLS, for tests that watch it from outside.

A server measured through ``/proc`` (memory, descriptors) must run alone in its process, exactly
as deployed: its own event loop (uvloop), its own config file, its serving certificate from a
fresh test CA (trustme). Its log goes to a file, never to a pipe nobody reads (a full pipe
would stall the server mid-soak).

Stopping: SIGTERM, then SIGKILL after a grace period, when the ``async with`` block ends. A test
whose event loop is torn down without unwinding (a pytest-timeout) leaves that block
suspended, so :class:`Reaper` — a synchronous fixture's finalizer — kills what is still
running.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
import yaml

from devenv.demo import stop_process
from devenv.kcp import free_ports

__all__ = ["Reaper", "ServedProcess", "reaper", "vwserver_process", "wait_readyz"]


class Reaper:
    """Processes a test started; :meth:`kill_all` kills those still running (by their own
    handle: a process already reaped is never signalled, so its pid cannot be mistaken)."""

    def __init__(self) -> None:
        self._processes: list[asyncio.subprocess.Process] = []

    def add(self, process: asyncio.subprocess.Process) -> None:
        self._processes.append(process)

    def kill_all(self) -> None:
        for process in self._processes:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()


@pytest.fixture
def reaper() -> Iterator[Reaper]:
    """A :class:`Reaper` whose processes still running when the test ends are killed (import
    it into a package's conftest to use it)."""
    processes = Reaper()
    yield processes
    processes.kill_all()


@dataclass(frozen=True, slots=True)
class ServedProcess:
    base: str
    """``https://127.0.0.1:<port>``."""
    process: asyncio.subprocess.Process
    ca_file: Path
    """The CA that signed the serving certificate."""
    log_file: Path
    health_base: str
    """``http://127.0.0.1:<port>``: the health listener, with ``/debug/cache``."""

    @property
    def pid(self) -> int:
        return self.process.pid

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])


@contextlib.asynccontextmanager
async def vwserver_process(
    config: Mapping[str, Any],
    *,
    workdir: Path,
    reaper: Reaper,
    ready_within: float = 60.0,
) -> AsyncIterator[ServedProcess]:
    """``vwserver serve`` with ``config`` plus ``listen`` and ``health`` (free loopback ports)
    and ``tls`` (a certificate for 127.0.0.1 from a new CA, in ``workdir``), ready (``/readyz``
    answered 200 over verified TLS within ``ready_within`` seconds); stopped when the block
    ends."""
    port, health_port = _write_files(config, workdir)
    log_file = workdir / "vwserver.log"
    with log_file.open("wb") as log:
        args = [sys.executable, "-m", "vwserver.cli", "serve", "--config", "vwserver.yaml"]
        process = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, cwd=workdir
        )
    reaper.add(process)
    served = ServedProcess(
        base=f"https://127.0.0.1:{port}",
        process=process,
        ca_file=workdir / "ca.crt",
        log_file=log_file,
        health_base=f"http://127.0.0.1:{health_port}",
    )
    try:
        await _wait_ready(served, within=ready_within)
        yield served
    finally:
        await stop_process(process)


def _write_files(config: Mapping[str, Any], workdir: Path) -> tuple[int, int]:
    """The TLS files and the config in ``workdir``; the ports vwserver is to listen on (slices,
    health)."""
    workdir.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(workdir / "ca.crt"))
    cert.private_key_pem.write_to_path(str(workdir / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(workdir / "tls.crt"))
    port, health_port = free_ports(2)
    doc = {
        **config,
        "listen": {"host": "127.0.0.1", "port": port},
        "health": {"host": "127.0.0.1", "port": health_port},
        "tls": {"certFile": "tls.crt", "keyFile": "tls.key"},
    }
    (workdir / "vwserver.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return port, health_port


async def _wait_ready(served: ServedProcess, *, within: float) -> None:
    await wait_readyz(
        served.base,
        ssl_context=served.ssl_context(),
        process=served.process,
        log_tail=served.log_tail,
        within=within,
    )


async def wait_readyz(
    base: str,
    *,
    ssl_context: ssl.SSLContext,
    process: asyncio.subprocess.Process,
    log_tail: Callable[[], str],
    within: float,
) -> None:
    """Until ``base``/readyz answers 200 over TLS verified with ``ssl_context``; fails with
    ``log_tail()`` when ``process`` exits first or ``within`` seconds pass."""
    try:
        async with (
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ssl_context),
                timeout=aiohttp.ClientTimeout(total=5),
            ) as session,
            asyncio.timeout(within),
        ):
            while True:
                if process.returncode is not None:
                    raise AssertionError(
                        f"vwserver exited with code {process.returncode}:\n{log_tail()}"
                    )
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(f"{base}/readyz") as r:
                        if r.status == 200:
                            return
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"vwserver not ready within {within:.0f} s:\n{log_tail()}") from None
