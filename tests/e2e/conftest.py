"""The Go binaries for the e2e tests (``go_clients``: ``vwclient``, ``go_provider``:
``vwprovider``; ``helm``, ``kube_apiserver_binary``, ``etcd_binary``), built once per session
when collection finishes: :mod:`tests.support.go_binaries`."""

from tests.support.go_binaries import (
    etcd_binary,
    go_clients,
    go_provider,
    helm,
    kube_apiserver_binary,
    pytest_collection_finish,
)

__all__ = [
    "etcd_binary",
    "go_clients",
    "go_provider",
    "helm",
    "kube_apiserver_binary",
    "pytest_collection_finish",
]
