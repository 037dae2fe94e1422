"""The container image (``make image``), built once per session and run with podman:
:mod:`tests.support.podman`."""

from tests.support.podman import pytest_collection_finish, vwserver_image

__all__ = ["pytest_collection_finish", "vwserver_image"]
