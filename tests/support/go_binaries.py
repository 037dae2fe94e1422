"""The Go binaries of the kcp tests, built by ``scripts/go/build.sh``: ``vwclient`` (the test
clients, ``clients/go``) and ``vwprovider`` (the example provider on multicluster-runtime,
``clients/go/provider``).

Each is built once per session when collection finishes (like kcp in ``tests/conftest.py``), and
only if a collected test uses its fixture, so a first build of a few minutes is not cut off by a
test's timeout; later runs reuse the cached binary. Without Go (or when the build fails) the
tests that need a binary skip, or fail with ``CI=true``.

A directory's ``conftest.py`` offers the fixtures by importing them together with the hook
(``from tests.support.go_binaries import go_clients, pytest_collection_finish``); the hook
builds each binary once however many directories import it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from devenv.kcp import REPO_ROOT

__all__ = ["go_clients", "go_provider", "pytest_collection_finish"]

GO_BUILD_SCRIPT = REPO_ROOT / "scripts" / "go" / "build.sh"
# fixture name -> (binary, where the build's result is kept: the binary, or why there is none)
_BINARIES = {
    "go_clients": ("vwclient", pytest.StashKey[Path | str]()),
    "go_provider": ("vwprovider", pytest.StashKey[Path | str]()),
}


def pytest_collection_finish(session: pytest.Session) -> None:
    for fixture, (binary, key) in _BINARIES.items():
        if key in session.config.stash:
            continue  # built already (another conftest imports this hook too)
        if any(fixture in getattr(item, "fixturenames", ()) for item in session.items):
            session.config.stash[key] = _build(binary)


def _build(binary: str) -> Path | str:
    if shutil.which("go") is None:
        return f"no go command on PATH ({binary} is built from source)"
    try:
        done = subprocess.run(
            [str(GO_BUILD_SCRIPT), binary],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=1800,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot build {binary}: {e}"
    lines = done.stdout.split()
    if done.returncode != 0 or not lines or not os.access(lines[-1], os.X_OK):
        return (
            f"{GO_BUILD_SCRIPT} {binary} failed with exit code {done.returncode} (see its stderr)"
        )
    return Path(lines[-1])


def _binary(request: pytest.FixtureRequest, fixture: str) -> Path:
    name, key = _BINARIES[fixture]
    binary = request.config.stash.get(key, f"the {name} build did not run")
    if isinstance(binary, str):
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and no {name}: {binary}", pytrace=False)
        pytest.skip(binary)
    return binary


@pytest.fixture(scope="session")
def go_clients(request: pytest.FixtureRequest) -> Path:
    """The ``vwclient`` binary (subcommands ``informer`` and ``reconciler``)."""
    return _binary(request, "go_clients")


@pytest.fixture(scope="session")
def go_provider(request: pytest.FixtureRequest) -> Path:
    """The ``vwprovider`` binary (the example provider controller through a slice)."""
    return _binary(request, "go_provider")
