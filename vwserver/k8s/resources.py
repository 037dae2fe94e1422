"""Kubernetes resources addressed by URL: collection and item paths under any base URL.

A base URL may already end in ``/clusters/<workspace or *>`` (kcp), so paths are built by plain
concatenation and ``*`` stays literal.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ResourceType:
    """A resource of one API group version (``GroupVersionResource`` plus its kind)."""

    group: str
    version: str
    resource: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection(self, base: str, namespace: str | None = None) -> str:
        """``<base>/apis/<group>/<version>[/namespaces/<ns>]/<resource>`` (``api/v1`` for core)."""
        prefix = f"apis/{self.group}/{self.version}" if self.group else f"api/{self.version}"
        ns = f"/namespaces/{namespace}" if namespace else ""
        return f"{base.rstrip('/')}/{prefix}{ns}/{self.resource}"

    def item(
        self, base: str, namespace: str | None, name: str, *, subresource: str | None = None
    ) -> str:
        url = f"{self.collection(base, namespace)}/{name}"
        return f"{url}/{subresource}" if subresource else url


NAMESPACES = ResourceType(group="", version="v1", resource="namespaces", kind="Namespace")
EVENTS = ResourceType(group="", version="v1", resource="events", kind="Event")
LEASES = ResourceType(group="coordination.k8s.io", version="v1", resource="leases", kind="Lease")
