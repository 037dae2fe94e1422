"""The Go binaries of the tests, built from source and cached: by ``scripts/go/build.sh``,
``vwclient`` (the test clients, ``clients/go``) and ``vwprovider`` (the example provider on
multicluster-runtime, ``clients/go/provider``); by ``scripts/tools/build.sh``, ``helm`` (the
chart's tests) and ``kube-apiserver`` + ``etcd`` (a real Kubernetes API server,
``devenv/kubeapi.py``).

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

__all__ = [
    "etcd_binary",
    "go_clients",
    "go_provider",
    "helm",
    "kube_apiserver_binary",
    "pytest_collection_finish",
]

GO_BUILD_SCRIPT = REPO_ROOT / "scripts" / "go" / "build.sh"
TOOLS_BUILD_SCRIPT = REPO_ROOT / "scripts" / "tools" / "build.sh"
# fixture name -> (build script, binary, where the build's result is kept: the binary, or why
# there is none)
_BINARIES = {
    "go_clients": (GO_BUILD_SCRIPT, "vwclient", pytest.StashKey[Path | str]()),
    "go_provider": (GO_BUILD_SCRIPT, "vwprovider", pytest.StashKey[Path | str]()),
    "helm": (TOOLS_BUILD_SCRIPT, "helm", pytest.StashKey[Path | str]()),
    "kube_apiserver_binary": (TOOLS_BUILD_SCRIPT, "kube-apiserver", pytest.StashKey[Path | str]()),
    "etcd_binary": (TOOLS_BUILD_SCRIPT, "etcd", pytest.StashKey[Path | str]()),
}


def pytest_collection_finish(session: pytest.Session) -> None:
    for fixture, (script, binary, key) in _BINARIES.items():
        if key in session.config.stash:
            continue  # built already (another conftest imports this hook too)
        if any(fixture in getattr(item, "fixturenames", ()) for item in session.items):
            session.config.stash[key] = _build(script, binary)


def _build(script: Path, binary: str) -> Path | str:
    if shutil.which("go") is None:
        return f"no go command on PATH ({binary} is built from source)"
    try:
        done = subprocess.run(
            [str(script), binary],
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
        return f"{script} {binary} failed with exit code {done.returncode} (see its stderr)"
    return Path(lines[-1])


def _binary(request: pytest.FixtureRequest, fixture: str) -> Path:
    _, name, key = _BINARIES[fixture]
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


@pytest.fixture(scope="session")
def helm(request: pytest.FixtureRequest) -> Path:
    """The ``helm`` binary (helm.sh/helm/v3, ``scripts/tools/helm``)."""
    return _binary(request, "helm")


@pytest.fixture(scope="session")
def kube_apiserver_binary(request: pytest.FixtureRequest) -> Path:
    """The ``kube-apiserver`` binary (k8s.io/kubernetes, ``scripts/tools/kube``)."""
    return _binary(request, "kube_apiserver_binary")


@pytest.fixture(scope="session")
def etcd_binary(request: pytest.FixtureRequest) -> Path:
    """The ``etcd`` binary (go.etcd.io/etcd/server/v3, ``scripts/tools/kube``)."""
    return _binary(request, "etcd_binary")
