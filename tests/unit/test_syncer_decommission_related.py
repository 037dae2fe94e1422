"""``--decommission --delete-downstream`` and related objects (vwserver.syncer.decommission) on
fake API servers: which copies go, in which order, and which stay.

Only a copy of this syncer's by the sync loop's rule goes (both labels, the owner label written
by its field manager): a look-alike labelled by someone else stays, on either side. Copies down
go after the primaries' copies are gone, and not in a namespace where a primary's copy is still
terminating (its operator may still read the password); copies up go through the endpoint.
The real servers: tests/e2e/test_syncer_decommission_kcp.py.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from tests.support.clock import FakeClock
from tests.unit.test_syncer_related import CONNECTION, PASSWORD
from vwserver.k8s.client import JSON, KubeClient
from vwserver.syncer.config import parse_syncer_config
from vwserver.syncer.decommission import Decommission
from vwserver.syncer.naming import LABEL_RELATED, LABEL_SYNCER, field_manager
from vwserver.syncer.related_spec import compile_all

ENDPOINT = "https://vw.example:6443/services/filtered/root:p/mongodb-eu"
DOWN = "https://downstream.example:6443"


class Fake:
    """Objects by (resource plural, namespace, name); LISTs of a collection return every object
    of its resource (the code under test must not rely on the label selector alone)."""

    def __init__(self, *objects: tuple[str, JSON]) -> None:
        self.objects = {
            (r, o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for r, o in objects
        }
        self.deleted: list[str] = []

    @staticmethod
    def _parts(url: str) -> list[str]:
        return urlsplit(url).path.split("/")

    async def request(self, method: str, url: str, **_: Any) -> JSON:
        assert method == "GET", (method, url)
        resource = self._parts(url)[-1]
        items = [o for (r, _, _), o in self.objects.items() if r == resource]
        return {"items": copy.deepcopy(items), "metadata": {}}

    async def get(self, url: str) -> JSON | None:
        parts = self._parts(url)
        return self.objects.get((parts[-2], parts[-3], parts[-1]))

    async def delete(self, url: str, *, uid: str | None = None) -> None:
        parts = self._parts(url)
        key = (parts[-2], parts[-3], parts[-1])
        obj = self.objects[key]
        assert uid == obj["metadata"]["uid"]
        self.deleted.append(f"{key[1]}/{key[2]}")
        if not obj["metadata"].get("finalizers"):
            del self.objects[key]
        else:
            obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"


def thing(namespace: str, name: str, *, finalizers: tuple[str, ...] = ()) -> tuple[str, JSON]:
    meta = {
        "name": name,
        "namespace": namespace,
        "uid": f"u-{namespace}-{name}",
        "labels": {LABEL_SYNCER: "eu"},
        "finalizers": list(finalizers),
    }
    return "things", {"metadata": meta}


def related_copy(
    namespace: str, name: str, *, label: str, ours: bool = True, cluster: str = ""
) -> tuple[str, JSON]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"u-{namespace}-{name}",
        "labels": {LABEL_SYNCER: "eu", LABEL_RELATED: label},
        "managedFields": [
            {
                "manager": field_manager("eu") if ours else "kubectl-edit",
                "operation": "Apply" if ours else "Update",
                "fieldsV1": {"f:metadata": {"f:labels": {f"f:{LABEL_SYNCER}": {}}}},
            }
        ],
    }
    if cluster:
        meta["annotations"] = {"kcp.io/cluster": cluster}
    return "secrets", {"metadata": meta}


def job(tmp_path: Path, upstream: Fake, downstream: Fake) -> Decommission:
    for name in ("kcp.kubeconfig", "cluster.kubeconfig"):
        (tmp_path / name).write_text("{}")
    raw = {
        "name": "eu",
        "upstream": {"kubeconfig": "kcp.kubeconfig", "urls": [ENDPOINT]},
        "downstream": {"kubeconfig": "cluster.kubeconfig"},
        "resources": [
            {
                "group": "g.io",
                "version": "v1",
                "resource": "things",
                "kind": "Thing",
                "related": [PASSWORD, CONNECTION],
            }
        ],
    }
    config = parse_syncer_config(raw, base_dir=tmp_path)
    return Decommission(
        config,
        upstream=cast(KubeClient, upstream),
        endpoints=cast(KubeClient, upstream),
        downstream=cast(KubeClient, downstream),
        upstream_server="https://kcp.example:6443",
        downstream_base=DOWN,
        clock=FakeClock(),
        wait_seconds=10,
    )


async def test_only_owned_related_copies_go_after_the_primaries_and_never_beside_a_terminating_one(
    tmp_path: Path,
) -> None:
    probe = job(tmp_path, Fake(), Fake())
    password, connection = (s.label for s in compile_all(probe.config.resources[0]))
    downstream = Fake(
        thing("kcp-a", "db"),
        related_copy("kcp-a", "pw", label=password),
        related_copy("kcp-a", "look-alike", label=password, ours=False),
        related_copy("kcp-a", "other-entry", label="another-1234abcd"),
        # the operator's finalizer keeps this copy terminating past --wait
        thing("kcp-b", "busy", finalizers=("operator.example/cleanup",)),
        related_copy("kcp-b", "busy-pw", label=password),
    )
    upstream = Fake(
        related_copy("default", "db-admin-app", label=connection, cluster="c1"),
        related_copy("default", "forged", label=connection, ours=False, cluster="c1"),
    )
    decommission = job(tmp_path, upstream, downstream)
    await decommission.delete_downstream()
    summary = decommission.summary
    # the primaries' copies first, then the related copy of the namespace with nothing pending
    assert downstream.deleted == ["kcp-a/db", "kcp-b/busy", "kcp-a/pw"]
    assert summary.copies_deleted == [
        "things kcp-a/db",
        "things kcp-b/busy",
        "secrets (related password) kcp-a/pw",
    ]
    assert summary.copies_terminating == ["things kcp-b/busy"]
    assert not summary.clean  # run again once it is gone: busy-pw goes then
    remaining = {name for (_, _, name) in downstream.objects}
    assert remaining == {"look-alike", "other-entry", "busy", "busy-pw"}
    assert upstream.deleted == ["default/db-admin-app"]
    assert summary.upstream_copies_deleted == [
        "secrets c1/default/db-admin-app (related connection)"
    ]
    assert "related copies deleted in kcp: 1" in "\n".join(summary.lines(downstream=True))
    assert not summary.failures

    # the operator is done: a second run deletes what the terminating copy kept
    del downstream.objects[("things", "kcp-b", "busy")]
    again = job(tmp_path, upstream, downstream)
    await again.delete_downstream()
    assert again.summary.copies_deleted == ["secrets (related password) kcp-b/busy-pw"]
    assert again.summary.upstream_copies_deleted == []
    assert again.summary.clean
