"""A :class:`~vwserver.syncer.sync_loop.ResourceController` on fake API servers, for unit tests
of what the controller does over (fake) time: how often it writes, what it reports.

The fakes answer only the calls the controller makes for one object (namespace GET, server-side
apply, merge patches of the kcp object) and record them; the e2e tests against real kcp check
the same behaviour with real servers. The reflectors are never run: the test feeds the upstream
cache with :meth:`ControllerBed.list_upstream`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from vwserver.k8s.cache import Cache
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.reflector import Reflector
from vwserver.k8s.resources import NAMESPACES
from vwserver.syncer.config import parse_syncer_config
from vwserver.syncer.memory import TenantBudget
from vwserver.syncer.metrics import SyncerMetrics
from vwserver.syncer.naming import ObjectKey, namespace_metadata, upstream_key
from vwserver.syncer.sync_loop import ResourceController, _UpstreamEvents

UPSTREAM = "https://vw.example:6443/services/apiexport/x/y"
DOWNSTREAM = "https://downstream.example:7443"


@dataclass
class FakeServer:
    """Records every call; ``apply`` raises what ``apply_error`` makes, else echoes the body."""

    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    apply_error: Callable[[str], Exception] | None = None
    objects: dict[str, JSON] = field(default_factory=dict)

    def count(self, method: str) -> int:
        return sum(1 for m, _, _ in self.calls if m == method)

    async def get(self, url: str) -> JSON | None:
        self.calls.append(("get", url, None))
        return self.objects.get(url)

    async def request(self, method: str, url: str, **_: Any) -> JSON:
        self.calls.append((method, url, None))
        return {}

    async def apply(self, url: str, body: JSON, *, field_manager: str, force: bool = True) -> JSON:
        self.calls.append(("apply", url, body))
        if self.apply_error is not None:
            raise self.apply_error(url)
        return body

    async def merge_patch(self, url: str, patch: JSON, *, field_manager: str | None = None) -> JSON:
        self.calls.append(("merge_patch", url, patch))
        return patch


@dataclass
class ControllerBed:
    controller: ResourceController
    upstream: FakeServer
    downstream: FakeServer

    def list_upstream(self, *objects: JSON) -> list[ObjectKey]:
        """Put ``objects`` in the upstream cache as a LIST would (their keys get queued)."""
        reflector = self.controller.upstream_reflectors[UPSTREAM]
        budget = self.controller._budgets[UPSTREAM]
        budget.begin_list()
        reflector.handler.on_list([budget.admit("LISTED", o) for o in objects], "1")
        return [k for o in objects if (k := upstream_key(o)) is not None]


def controller_bed(tmp_path: Path, *, clock: Any, **config: Any) -> ControllerBed:
    """A controller for ``things.g.io`` of syncer ``eu`` with fake upstream and downstream."""
    for name in ("kcp.kubeconfig", "cluster.kubeconfig"):
        (tmp_path / name).write_text("{}")
    raw: dict[str, Any] = {
        "name": "eu",
        "upstream": {"kubeconfig": "kcp.kubeconfig", "urls": [UPSTREAM]},
        "downstream": {"kubeconfig": "cluster.kubeconfig"},
        "resources": [{"group": "g.io", "version": "v1", "resource": "things", "kind": "Thing"}],
        **config,
    }
    syncer_config = parse_syncer_config(raw, base_dir=tmp_path)
    upstream, downstream = FakeServer(), FakeServer()
    controller = ResourceController(
        config=syncer_config,
        resource=syncer_config.resources[0],
        upstream=cast(KubeClient, upstream),
        downstream=cast(KubeClient, downstream),
        downstream_base=DOWNSTREAM,
        metrics=SyncerMetrics(),
        clock=clock,
    )
    budget = controller._budgets[UPSTREAM] = TenantBudget(
        key=upstream_key,
        max_object_bytes=controller.resource.max_object_bytes,
        ledger=controller.ledger,
    )
    controller.upstream_reflectors[UPSTREAM] = Reflector(
        name="upstream things",
        client=cast(KubeClient, upstream),
        url=controller.source.collection(f"{UPSTREAM}/clusters/*"),
        handler=Cache(key=upstream_key, handler=_UpstreamEvents(controller)),
        clock=clock,
        admission=budget,
    )
    return ControllerBed(controller, upstream, downstream)


def thing(name: str, *, cluster: str = "c1", finalizers: tuple[str, ...] = (), **spec: Any) -> JSON:
    """An upstream Thing in namespace ``default`` of ``cluster``."""
    return {
        "apiVersion": "g.io/v1",
        "kind": "Thing",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "resourceVersion": "5",
            "generation": 1,
            "annotations": {"kcp.io/cluster": cluster},
            "finalizers": list(finalizers),
        },
        "spec": dict(spec),
    }


def known_namespace(bed: ControllerBed, key: ObjectKey) -> None:
    """The downstream namespace of ``key`` exists and is marked as its source's."""
    namespace = bed.controller._namespace_of(key)
    url = NAMESPACES.item(DOWNSTREAM, None, namespace)
    metadata = namespace_metadata(key.cluster, key.namespace)
    bed.downstream.objects[url] = {"metadata": {"name": namespace, **metadata}}


def start_related(bed: ControllerBed) -> None:
    """Give the controller's related entries their endpoint reflectors, not running (the test
    feeds their caches with :func:`list_related`), all of them listed (empty) already."""
    for watch in bed.controller.related:
        watch.set_endpoints([UPSTREAM])
        for task in watch._tasks.values():
            task.cancel()
        for reflector in watch.all_reflectors():
            reflector.synced.set()


def list_related(bed: ControllerBed, name: str, *objects: JSON, downstream: bool = False) -> None:
    """Put ``objects`` in related entry ``name``'s cache as a LIST would: the endpoint's
    (sources of origin kcp, copies of origin downstream) or ``downstream``'s, through the
    reflector's admission (its bounds)."""
    watch = next(w for w in bed.controller.related if w.spec.name == name)
    reflector = watch.downstream_reflector if downstream else watch.reflectors[UPSTREAM]
    admission = reflector._admission
    if admission is not None:
        admission.begin_list()
        objects = tuple(admission.admit("LISTED", o) for o in objects)
    reflector.handler.on_list(list(objects), "1")
