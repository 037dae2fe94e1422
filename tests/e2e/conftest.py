"""The Go test clients (``clients/go``, built by ``scripts/go/build.sh``) for the e2e tests.

Built once per session when collection finishes (like kcp in ``tests/conftest.py``), so a first
build of a few minutes is not cut off by a test's timeout; later runs reuse the cached binary.
Without Go (or when the build fails) the tests that need the clients skip, or fail with
``CI=true``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from vwserver.devenv.kcp import REPO_ROOT

GO_BUILD_SCRIPT = REPO_ROOT / "scripts" / "go" / "build.sh"
_GO_CLIENTS_KEY = pytest.StashKey[Path | str]()  # the binary, or why there is none


def pytest_collection_finish(session: pytest.Session) -> None:
    if any("go_clients" in getattr(item, "fixturenames", ()) for item in session.items):
        session.config.stash[_GO_CLIENTS_KEY] = _build_go_clients()


def _build_go_clients() -> Path | str:
    if shutil.which("go") is None:
        return "no go command on PATH (the Go test clients are built from source)"
    try:
        done = subprocess.run(
            [str(GO_BUILD_SCRIPT)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=1800,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot build the Go test clients: {e}"
    lines = done.stdout.split()
    if done.returncode != 0 or not lines or not os.access(lines[-1], os.X_OK):
        return f"{GO_BUILD_SCRIPT} failed with exit code {done.returncode} (see its stderr)"
    return Path(lines[-1])


@pytest.fixture(scope="session")
def go_clients(request: pytest.FixtureRequest) -> Path:
    """The ``vwclient`` binary (subcommands ``informer`` and ``reconciler``)."""
    binary = request.config.stash.get(_GO_CLIENTS_KEY, "Go client build did not run")
    if isinstance(binary, str):
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and no Go test clients: {binary}", pytrace=False)
        pytest.skip(binary)
    return binary
