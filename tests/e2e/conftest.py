"""The Go binaries for the e2e tests (``go_clients``: ``vwclient``, ``go_provider``:
``vwprovider``), built once per session when collection finishes: :mod:`tests.support.
go_binaries`."""

from tests.support.go_binaries import go_clients, go_provider, pytest_collection_finish

__all__ = ["go_clients", "go_provider", "pytest_collection_finish"]
