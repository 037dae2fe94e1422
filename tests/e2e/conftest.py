"""The Go binaries for the e2e tests (``go_clients``: ``vwclient``, ``go_provider``:
``vwprovider``; ``helm``, ``kube_apiserver_binary``, ``etcd_binary``), built once per session
when collection finishes: :mod:`tests.support.go_binaries`; ``kubeapi``: a real kube-apiserver
(etcd + kube-apiserver, no kubelet), one per module that asks for it."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from devenv.kubeapi import KubeAPIServer, start_kube_apiserver
from tests.support.go_binaries import (
    etcd_binary,
    go_clients,
    go_provider,
    helm,
    kube_apiserver_binary,
    pytest_collection_finish,
)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def kubeapi(
    kube_apiserver_binary: Path, etcd_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[KubeAPIServer]:
    async with start_kube_apiserver(
        kube_apiserver=kube_apiserver_binary,
        etcd=etcd_binary,
        root_dir=tmp_path_factory.mktemp("kubeapi"),
    ) as server:
        yield server


__all__ = [
    "etcd_binary",
    "go_clients",
    "go_provider",
    "helm",
    "kube_apiserver_binary",
    "kubeapi",
    "pytest_collection_finish",
]
