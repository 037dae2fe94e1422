"""Fixtures of the chaos tests: their own kcp (:mod:`tests.chaos.bed`), started once for the
package and stopped after its last test; the Go informers (``go_clients``); a namespace of
their own per test; a reaper that kills what a test started if the test is cut short."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.chaos.bed import ChaosKcp, chaos_kcp
from tests.support.go_binaries import go_clients, pytest_collection_finish
from tests.support.vwserver_process import Reaper

__all__ = ["bed", "go_clients", "namespace", "pytest_collection_finish", "reaper"]


@pytest_asyncio.fixture(scope="package", loop_scope="session")
async def bed(
    kcp_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ChaosKcp]:
    async with chaos_kcp(binary=kcp_binary, root=tmp_path_factory.mktemp("chaos")) as bed:
        yield bed


@pytest.fixture
def reaper() -> Iterator[Reaper]:
    """Kills the processes a test registered that still run when it ends (a test cut short by
    its timeout never unwinds its ``async with`` blocks)."""
    reaper = Reaper()
    yield reaper
    reaper.kill_all()


@pytest_asyncio.fixture(loop_scope="session")
async def namespace(bed: ChaosKcp) -> AsyncIterator[str]:
    """A new namespace in both consumer workspaces, deleted afterwards."""
    name = f"chaos-{uuid.uuid4().hex[:6]}"
    for ws in bed.world.consumers:
        await bed.kcp.kubectl("create", "namespace", name, server=ws.url)
    yield name
    if bed.serving.is_set():
        for ws in bed.world.consumers:
            await bed.kcp.kubectl(
                "delete", "namespace", name, "--wait=false", "--ignore-not-found",
                server=ws.url, check=False,
            )  # fmt: skip
