"""Session fixtures for the tests against real kcp: one kcp and one bootstrapped demo world per
session, shared by ``tests/e2e``, ``tests/conformance`` and every other test that asks for the
``kcp`` fixture (e.g. in ``tests/security``).

Session scope because kcp needs ~25 s to become ready and the bootstrap ~12 s; tests that change
shared objects put them back (or use their own). Every such test is marked ``e2e`` and runs on
the session's event loop (the fixtures' objects are bound to it).

Where kcp comes from, first match wins:

* ``KCP_KUBECONFIG`` (optional ``KCP_CONTEXT``): an existing kcp, never stopped by the tests. It
  must have been started with ``--token-auth-file=config/demo/users.csv``.
* ``KCP_IMAGE``: a kcp container via testcontainers, when that package is installed and a Docker
  engine answers (``DOCKER_HOST``; ``make e2e-container`` runs a module this way on podman).
* ``KCP_BINARY``: that kcp binary.
* otherwise ``scripts/kcp/build.sh`` (cached). It runs when collection finishes, not inside a
  test, so a long first build is not cut off by the per-test timeout.

With ``CI=true`` a kcp that cannot be obtained, built or started fails the tests; elsewhere the
"cannot be obtained/built" cases skip with the reason (a kcp that was built but does not start
is always an error).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io
import os
import tarfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, NoReturn

import aiohttp
import pytest
import pytest_asyncio

from devenv.bootstrap import DEMO_DIR, DEMO_USERS_FILE, Bootstrap, bootstrap
from devenv.kcp import KcpError, KcpInstance, build_kcp, free_ports, start_kcp

_HERE = Path(__file__).parent
# tests/chaos runs a kcp of its own (it kills it), from the same binary; tests/shards a sharded
# kcp of its own (tests/shards/conftest.py)
_KCP_DIRS = (_HERE / "e2e", _HERE / "conformance", _HERE / "chaos", _HERE / "shards")
_BINARY_KEY = pytest.StashKey[Path | str]()  # the binary, or why there is none


def _in_e2e(item: pytest.Item) -> bool:
    """Tests in the kcp directories, and any test that uses the session's kcp."""
    parents = Path(item.path).parents
    return any(d in parents for d in _KCP_DIRS) or "kcp" in getattr(item, "fixturenames", ())


def _unavailable(reason: str) -> NoReturn:
    """No kcp: a failure under CI (a silently skipped e2e suite proves nothing), else a skip."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and no kcp: {reason}", pytrace=False)
    pytest.skip(reason)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not _in_e2e(item):
            continue
        item.add_marker(pytest.mark.e2e)
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.obj):
            # append=False: in auto mode pytest-asyncio already gave the test a function-scoped
            # marker; ours must come first or the test runs on another loop than the fixtures.
            item.add_marker(pytest.mark.asyncio(loop_scope="session"), append=False)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Find or build the kcp binary before any test's timeout starts ticking."""
    if not any(_in_e2e(item) for item in session.items):
        return
    if os.environ.get("KCP_KUBECONFIG") or os.environ.get("KCP_IMAGE"):
        return
    binary: Path | str
    if os.environ.get("KCP_BINARY"):
        binary = Path(os.environ["KCP_BINARY"])
        if not os.access(binary, os.X_OK):
            binary = f"KCP_BINARY={binary} is not an executable file"
    else:
        try:
            binary = build_kcp()
        except KcpError as e:
            binary = f"cannot build kcp: {e}"
    session.config.stash[_BINARY_KEY] = binary


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def kcp(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[KcpInstance]:
    """A ready kcp (see the module docstring for where it comes from)."""
    if kubeconfig := os.environ.get("KCP_KUBECONFIG"):
        yield KcpInstance.from_kubeconfig(
            Path(kubeconfig),
            workdir=tmp_path_factory.mktemp("kcp-external"),
            context=os.environ.get("KCP_CONTEXT"),
        )
        return
    if image := os.environ.get("KCP_IMAGE"):
        async with _kcp_container(image, workdir=tmp_path_factory.mktemp("kcp-container")) as inst:
            yield inst
        return
    binary: Path = request.getfixturevalue("kcp_binary")
    # root_dir under pytest's basetemp: kept after the run (pytest prunes old runs), with kcp.log.
    async with start_kcp(
        binary=binary,
        root_dir=tmp_path_factory.mktemp("kcp"),
        token_auth_file=DEMO_USERS_FILE,
    ) as instance:
        _report(request.config, f"kcp {instance.url} ready after {instance.ready_seconds:.1f}s")
        yield instance


@pytest.fixture(scope="session")
def kcp_binary(request: pytest.FixtureRequest) -> Path:
    """The local kcp binary (tests of devenv's process handling need one)."""
    if os.environ.get("KCP_KUBECONFIG") or os.environ.get("KCP_IMAGE"):
        pytest.skip("KCP_KUBECONFIG/KCP_IMAGE: no local kcp binary in use")
    binary = request.config.stash.get(_BINARY_KEY, "kcp binary lookup did not run")
    if isinstance(binary, str):
        _unavailable(binary)
    return binary


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def world(request: pytest.FixtureRequest, kcp: KcpInstance) -> Bootstrap:
    """The demo world (provider, two consumers, Widgets, alice/bob) on the session's kcp."""
    try:
        result = await bootstrap(kcp)
    except KcpError as e:
        raise KcpError(f"{e}\n{kcp.log_tail()}") from e
    _report(request.config, f"bootstrap took {result.duration:.1f}s")
    return result


# --------------------------------------------------------------------------------------------
# KCP_IMAGE: kcp in a container, started by testcontainers through a Docker-compatible API
# (DOCKER_HOST; `make e2e-container` runs a module this way against podman's, with an image built
# from the cached kcp binary: scripts/image/kcp-image.sh). The container shares the host's network
# and kcp binds 127.0.0.1 on free ports, as the kcp binary does here: kcp's self-signed serving
# certificate names the address it binds (behind a published port it names only localhost and the
# container's own IP, which 127.0.0.1:<port> fails to verify against), and the admin kubeconfig
# and the endpoint-slice URLs kcp publishes are then valid from the host as they are.


@contextlib.asynccontextmanager
async def _kcp_container(image: str, *, workdir: Path) -> AsyncIterator[KcpInstance]:
    try:
        import docker  # type: ignore[import-untyped,import-not-found,unused-ignore]
        from testcontainers.core.container import (  # type: ignore[import-not-found,unused-ignore]
            DockerContainer,
        )
    except ImportError:
        _unavailable(f"KCP_IMAGE={image} is set but testcontainers is not installed")
    try:
        docker.from_env().ping()
    except Exception as e:
        _unavailable(f"KCP_IMAGE={image} is set but no Docker engine answers: {e}")

    port, etcd_client, etcd_peer = free_ports(3)
    base = f"https://127.0.0.1:{port}"
    container: Any = (
        DockerContainer(image)
        .with_kwargs(network_mode="host")
        .with_volume_mapping(str(DEMO_DIR), "/demo", "ro")
        .with_command(
            f"start --root-directory=/data --bind-address=127.0.0.1 --secure-port={port}"
            f" --embedded-etcd-client-port={etcd_client} --embedded-etcd-peer-port={etcd_peer}"
            " --batteries-included=+user --token-auth-file=/demo/users.csv"
        )
    )
    await asyncio.to_thread(container.start)
    try:
        kubeconfig = workdir / "admin.kubeconfig"
        await _copy_kubeconfig(container, base=base, to=kubeconfig, within=180)
        instance = KcpInstance.from_kubeconfig(kubeconfig, workdir=workdir, context="base")
        await _wait_readyz(instance, within=180)
        yield instance
    finally:
        await asyncio.to_thread(container.stop)


async def _copy_kubeconfig(container: Any, *, base: str, to: Path, within: float) -> None:
    """Copy kcp's kubeconfig out of ``container`` (kcp's image has no shell), pointing it at
    ``base``. kcp writes it before it is ready."""
    import yaml

    def fetch() -> bytes | None:
        try:
            stream, _ = container.get_wrapped_container().get_archive("/data/admin.kubeconfig")
        except Exception:
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile("admin.kubeconfig")
            return member.read() if member else None

    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while (raw := await asyncio.to_thread(fetch)) is None:
        if loop.time() > deadline:
            logs = await asyncio.to_thread(container.get_logs)
            raise KcpError(f"kcp container wrote no kubeconfig in {within}s; logs: {logs!r:.4000}")
        await asyncio.sleep(1)
    config = yaml.safe_load(raw)
    for cluster in config["clusters"]:
        _, sep, path = cluster["cluster"]["server"].partition("/clusters/")
        cluster["cluster"]["server"] = base + (sep + path if sep else "")
    await asyncio.to_thread(to.write_text, yaml.safe_dump(config))


async def _wait_readyz(instance: KcpInstance, *, within: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    async with instance.http_session(timeout=5) as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(f"{instance.url}/readyz") as resp:
                    if resp.status == 200:
                        return
            if loop.time() > deadline:
                raise KcpError(f"kcp at {instance.url} not ready in {within}s")
            await asyncio.sleep(1)


# --------------------------------------------------------------------------------------------
# Output


def _report(config: pytest.Config, line: str) -> None:
    """A line on the terminal even when output is captured (timings are part of the record)."""
    capman = config.pluginmanager.get_plugin("capturemanager")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if capman is None or reporter is None:
        print(line)
        return
    with capman.global_and_fixture_disabled():
        reporter.write_line(f"\n{line}")


@pytest.fixture
def observe(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """``observe(text)``: print an observation of kcp's behaviour to the terminal, uncaptured."""
    capman = request.config.pluginmanager.get_plugin("capturemanager")

    def emit(text: str) -> None:
        if capman is None:
            print(text)
            return
        with capman.global_and_fixture_disabled():
            print(f"\n[{request.node.name}] {text}", flush=True)

    return emit
