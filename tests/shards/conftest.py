"""One sharded kcp per pytest run (``devenv.shards``: cache server, root shard, second shard,
front-proxy), and the demo world placed across its shards:

* ``root:provider`` (the Widget export) and ``root:consumer-a`` on the root shard,
* ``root:consumer-b`` and ``root:slices`` (where the tests' slices live) on the second shard,
* ``root:vwserver-api`` (vwserver's own API) on the root shard,

so that the slice, the export and the consumers are not all on one shard. Everything is
reached through the front-proxy (``sharded.front``) except the APIExport virtual workspaces,
which are at each shard's own URL, as kcp publishes them.

The binaries are built (or found in the cache) when collection finishes, like the one-shard kcp
of ``tests/conftest.py``; ``CI=true`` turns a missing binary into a failure, elsewhere a skip.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from devenv.bootstrap import Bootstrap, Workspace
from devenv.kcp import KcpError
from devenv.shards import (
    DEMO_PLACEMENT,
    SECOND_SHARD,
    ShardedKcp,
    bootstrap_placed,
    build_sharded_kcp,
    start_sharded_kcp,
)
from tests.conftest import _report, _unavailable
from tests.support import go_binaries
from tests.support.go_binaries import go_clients, go_provider

__all__ = ["go_clients", "go_provider"]

_HERE = Path(__file__).parent
_BINARIES_KEY = pytest.StashKey[dict[str, Path] | str]()
SLICES_WS = "slices"
PLACEMENT = DEMO_PLACEMENT


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build (or find) the sharded kcp's binaries — and the Go clients the collected tests use
    — before any test's timeout starts ticking."""
    go_binaries.pytest_collection_finish(session)
    if not any(_HERE in Path(item.path).parents for item in session.items):
        return
    binaries: dict[str, Path] | str
    try:
        binaries = build_sharded_kcp()
    except KcpError as e:
        binaries = f"cannot build the sharded kcp: {e}"
    session.config.stash[_BINARIES_KEY] = binaries


@dataclass(frozen=True, kw_only=True)
class ShardedWorld:
    bed: ShardedKcp
    world: Bootstrap
    #: Where the tests create slices (second shard).
    slices: Workspace

    def consumer_on(self, shard: str) -> Workspace:
        """The demo consumer the fixture placed on ``shard``."""
        (ws,) = (w for w in self.world.consumers if PLACEMENT[w.name] == shard)
        return ws

    def clusters_not_on(self, shard: str) -> set[str]:
        """The logical clusters of the demo world's workspaces placed on another shard than
        ``shard`` (its consumers and the provider's workspace): never in that shard's answers."""
        placed = [*self.world.consumers, self.world.provider]
        return {ws.cluster for ws in placed if PLACEMENT[ws.name] != shard}

    def vw_url(self, shard: str) -> str:
        """kcp's APIExport VW URL of the Widget export on ``shard``."""
        (url,) = (u for u in self.world.vw_urls if self.bed.shard_of_url(u) == shard)
        return url


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def sharded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ShardedKcp]:
    binaries = request.config.stash.get(_BINARIES_KEY, "sharded kcp build did not run")
    if isinstance(binaries, str):
        _unavailable(binaries)
    async with start_sharded_kcp(
        binaries=binaries, root_dir=tmp_path_factory.mktemp("sharded-kcp")
    ) as bed:
        _report(request.config, f"sharded kcp ready after {bed.ready_seconds:.1f}s")
        yield bed


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def sharded_world(request: pytest.FixtureRequest, sharded: ShardedKcp) -> ShardedWorld:
    """The demo world placed across the shards (see the module docstring)."""
    try:
        world = await bootstrap_placed(sharded, wait_timeout=180)
        slices = await sharded.create_workspace(SLICES_WS, shard=SECOND_SHARD)
    except KcpError as e:
        raise KcpError(f"{e}\n{sharded.front.log_tail()}") from e
    _report(request.config, f"sharded bootstrap took {world.duration:.1f}s")
    return ShardedWorld(bed=sharded, world=world, slices=slices)
