"""The syncer's deployment (``manifests/syncer``) between real kcp and a real Kubernetes API server.

The syncer is deployed in its downstream cluster, so that cluster is a real kube-apiserver here
(``devenv/kubeapi.py``: etcd + kube-apiserver, no kubelet — the API objects are what is
checked), with the syncer world of ``tests/e2e/test_syncer_kcp.py`` on the session's kcp
(provider exporting the MongoDBCommunity-like API, two consumers) and, in the kube-apiserver,
the plain CRD of ``config/syncer/downstream-crd.yaml`` and a fake operator writing status:

* **downstream**: everything ``kubectl kustomize manifests/syncer`` renders is applied to the
  kube-apiserver with server-side strict validation — the Deployment too (nothing runs it);
  a TokenRequest token of the ServiceAccount the Deployment's pod template names is requested,
  and the syncer runs in-process as that pod would: ``downstream: {inCluster: true}``, the token
  and a CA at ServiceAccount paths, ``KUBERNETES_SERVICE_HOST``/``_PORT`` naming the server
  (behind the TLS front of ``tests/e2e/credentials.py``, which forwards the token unchanged and
  records it: the real RBAC authorizer judges every request as the ServiceAccount);
* **upstream**: as the ConfigMap says — ``endpointSlice: FilteredAPIExportEndpointSlice`` read
  from kcp (the CRD of ``manifests/crd/``, its status pointing at an in-process vwserver proxy
  with real delegated authentication: TokenReview and SubjectAccessReview in the slice's
  workspace) with the identity of ``manifests/rbac/syncer-upstream.yaml``, granted to a
  ServiceAccount of the slice's workspace;
* the **config file is the ConfigMap's**, with only the Secret's path, the slice's workspace
  and the health address (a free loopback port) replaced.

The shipped grants must carry a full round trip, deletion, and a Warning Event for an object
that leaves the view. Each ClusterRole rule removed in turn (and ``patch`` removed upstream) must
fail visibly: the downstream's 403 naming the missing resource shows up in the syncer's error, its
``/readyz``, the kcp object's ``Synced`` condition or its warning log — and the work that rule
is for is not done.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from devenv.bootstrap import Workspace, apply_retrying, poll
from devenv.kcp import KcpInstance
from devenv.kubeapi import KubeAPIServer
from tests.e2e.credentials import InCluster, in_cluster
from tests.e2e.test_syncer_kcp import (
    EXPORT,
    SETUP,
    FakeMongoOperator,
    SyncWorld,
    _setup,
    downstream_copy,
    eventually,
    running,
    synced_condition,
    unique,
    upstream_status,
)
from tests.support.serve import serve_app
from vwserver.auth.access import AccessReviewer
from vwserver.auth.guard import Guard
from vwserver.auth.tokens import TokenReviewer
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import load_kubeconfig
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Route, Routes, RouteTable
from vwserver.selector import Selector
from vwserver.server import build_app
from vwserver.syncer.config import SyncerConfig, parse_syncer_config
from vwserver.syncer.runner import Syncer

REPO = Path(__file__).resolve().parents[2]
SLICE_CRD = REPO / "manifests" / "crd" / "filteredapiexportendpointslices.yaml"
UPSTREAM_RBAC = REPO / "manifests" / "rbac" / "syncer-upstream.yaml"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
FIELD_MANAGER = "vwserver-tests"

Doc = dict[str, Any]


# --------------------------------------------------------------------------------------------
# The rendered base


@dataclass(frozen=True)
class Base:
    """What ``kubectl kustomize manifests/syncer`` renders, by kind."""

    docs: dict[str, Doc]

    @property
    def namespace(self) -> str:
        return str(self.docs["Namespace"]["metadata"]["name"])

    @property
    def service_account(self) -> str:
        return str(self.docs["ServiceAccount"]["metadata"]["name"])

    @property
    def config_text(self) -> str:
        (text,) = self.docs["ConfigMap"]["data"].values()
        return str(text)

    def rbac(self, *, without: str | None = None) -> tuple[str, list[Doc]]:
        """The ServiceAccount and RBAC objects; ``without``: that resource's ClusterRole rule
        removed, every name suffixed (another ServiceAccount, so variants do not interfere).
        Returns the ServiceAccount's name and the objects."""
        docs = [copy.deepcopy(self.docs[kind]) for kind in RBAC_KINDS]
        if without is None:
            return self.service_account, docs
        suffix = f"-without-{without}"
        for doc in docs:
            doc["metadata"]["name"] += suffix
            if "roleRef" in doc:
                doc["roleRef"]["name"] += suffix
                for subject in doc["subjects"]:
                    subject["name"] += suffix
            if doc["kind"] == "ClusterRole":
                rules = [r for r in doc["rules"] if without not in r.get("resources", [])]
                assert len(rules) == len(doc["rules"]) - 1, f"no rule for {without}"
                doc["rules"] = rules
        return self.service_account + suffix, docs


def render_base() -> Base:
    result = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "manifests" / "syncer")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    return Base({d["kind"]: d for d in docs})


def cluster_role_resources(base: Base) -> list[str]:
    """The resource of each ClusterRole rule (one each), for the parametrized variants."""
    resources = []
    for rule in base.docs["ClusterRole"]["rules"]:
        (resource,) = rule["resources"]
        resources.append(resource)
    return resources


# --------------------------------------------------------------------------------------------
# The env


@dataclass
class Deployed:
    world: SyncWorld
    base: Base
    kubeapi: KubeAPIServer
    """The downstream cluster (``world.downstream`` is its stand-in)."""
    slice_name: str
    upstream_kubeconfig: Path
    """The syncer's kcp identity: a ServiceAccount of the slice's workspace with exactly
    ``manifests/rbac/syncer-upstream.yaml``."""

    @property
    def kcp(self) -> KcpInstance:
        return self.world.kcp

    def config(self, *, upstream_kubeconfig: Path | None = None) -> SyncerConfig:
        """The ConfigMap's config file; only the paths and addresses of this test bed differ."""
        raw = yaml.safe_load(self.base.config_text)
        assert raw["downstream"] == {"inCluster": True}
        raw["upstream"]["kubeconfig"] = str(upstream_kubeconfig or self.upstream_kubeconfig)
        assert raw["upstream"]["endpointSlice"]["name"] == self.slice_name
        raw["upstream"]["endpointSlice"]["workspace"] = self.world.provider.path
        raw["health"] = {**raw["health"], "host": "127.0.0.1", "port": 0}
        return parse_syncer_config(raw, base_dir=self.world.dir)

    async def service_account_token(self, sa: str, namespace: str) -> str:
        """A TokenRequest token (what kubelet mounts) from the downstream cluster."""
        result = await self.kubeapi.kubectl("create", "token", sa, "-n", namespace, "--duration=1h")
        return result.stdout.strip()

    async def install_downstream(self, *, without: str | None = None) -> tuple[str, str]:
        """Apply the rendered RBAC (``without`` one ClusterRole rule; the full base, Deployment
        included, when None) to the downstream cluster; wait until its authorizer enforces it;
        the ServiceAccount's name and token."""
        sa, docs = self.base.rbac(without=without)
        items = list(self.base.docs.values()) if without is None else docs
        await self.kubeapi.kubectl(
            "apply", "--server-side", "--validate=strict", f"--field-manager={FIELD_MANAGER}",
            "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )  # fmt: skip
        token = await self.service_account_token(sa, self.base.namespace)
        (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
        await wait_enforced(self.kubeapi, token, self.base, cluster_role, without=without)
        return sa, token


async def wait_enforced(
    kubeapi: KubeAPIServer,
    token: str,
    base: Base,
    cluster_role: Doc,
    *,
    without: str | None,
) -> None:
    """Until the downstream's authorizer answers, for the token (SelfSubjectAccessReview), yes to every
    verb of every rule we applied and no to the removed rule's: a start before the bindings took
    effect would show 403s that are not the removed rule's."""
    checks: list[tuple[Doc, bool]] = []
    for rule in base.docs["ClusterRole"]["rules"]:
        (group,), (resource,) = rule["apiGroups"], rule["resources"]
        kept = resource != without
        assert (rule in cluster_role["rules"]) == kept
        for verb in rule["verbs"]:
            # namespaced resources: any namespace (the copies' namespaces are derived)
            attrs = {"group": group, "resource": resource, "verb": verb, "namespace": "any-ns"}
            if resource == "namespaces":
                del attrs["namespace"]
            checks.append((attrs, kept))
    for rule in base.docs["Role"]["rules"]:
        for verb in rule["verbs"]:
            attrs = {
                "group": rule["apiGroups"][0],
                "resource": rule["resources"][0],
                "verb": verb,
                "namespace": base.namespace,
            }
            checks.append((attrs, True))
    url = f"{kubeapi.url}/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    async with kubeapi.http_session(token=token, timeout=10) as session:

        async def enforced() -> bool | None:
            for attrs, expected in checks:
                review = {
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SelfSubjectAccessReview",
                    "spec": {"resourceAttributes": attrs},
                }
                async with session.post(url, json=review) as resp:
                    assert resp.status == 201, f"SelfSubjectAccessReview: {await resp.text()}"
                    allowed = (await resp.json())["status"].get("allowed", False)
                if allowed != expected:
                    return None
            return True

        await poll("the downstream to enforce the applied RBAC", enforced, within=SETUP)


async def upstream_identity(
    kcp: KcpInstance, world: SyncWorld, *, name: str, rules: Callable[[list[Doc]], list[Doc]]
) -> Path:
    """A ServiceAccount ``default/<name>`` of the slice's workspace, granted
    ``manifests/rbac/syncer-upstream.yaml`` (its rules passed through ``rules``), and a
    kubeconfig for kcp with its token."""
    provider = world.provider
    role, binding = [d for d in yaml.safe_load_all(UPSTREAM_RBAC.read_text()) if d]
    role["metadata"]["name"] += f":{name}"
    role["rules"] = rules(role["rules"])
    binding["metadata"]["name"] = role["metadata"]["name"]
    binding["roleRef"]["name"] = role["metadata"]["name"]
    binding["subjects"] = [{"kind": "ServiceAccount", "name": name, "namespace": "default"}]
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": "default"}}  # fmt: skip
    await apply_retrying(
        kcp,
        provider.url,
        json.dumps({"apiVersion": "v1", "kind": "List", "items": [sa, role, binding]}),
        within=SETUP,
    )

    async def token() -> str | None:
        result = await kcp.kubectl("create", "token", name, "--duration=1h", server=provider.url)
        return result.stdout.strip() or None

    path = world.dir / f"{name}.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "kcp",
                "contexts": [{"name": "kcp", "context": {"cluster": "kcp", "user": name}}],
                "clusters": [
                    {
                        "name": "kcp",
                        "cluster": {"server": kcp.url, "certificate-authority": str(kcp.ca_file)},
                    }
                ],
                "users": [{"name": name, "user": {"token": await poll(name, token, within=SETUP)}}],
            }
        )
    )
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def deployed(
    kcp: KcpInstance, kubeapi: KubeAPIServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Deployed]:
    base = render_base()
    slice_name = yaml.safe_load(base.config_text)["upstream"]["endpointSlice"]["name"]
    async with kcp.http_session(timeout=30) as session, kubeapi.http_session() as down:
        world = await _setup(
            kcp, tmp_path_factory.mktemp("syncer-deploy"), session, kubeapi=(kubeapi, down)
        )
        provider = world.provider
        # vwserver in front of the export, serving the slice (region=eu) with real delegated
        # authentication: kcp reviews the syncer's token and its grant on the slice.
        admin = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
        routes = Routes(
            RouteTable(
                [
                    Route(
                        cluster=provider.cluster,
                        name=slice_name,
                        selector=Selector.parse("region=eu"),
                        upstream_url=world.vw_url,
                    )
                ]
            )
        )
        async with KubeClient(auth=admin, timeout=10) as reviews:
            guard = Guard(
                tokens=TokenReviewer(client=reviews, negative_ttl=1.0),
                access=AccessReviewer(client=reviews, deny_ttl=1.0),
            )
            app = build_app(routes=routes, upstream=UpstreamClient(auth=admin), guard=guard)
            async with serve_app(app) as proxy:
                endpoint = f"{proxy}/services/filtered-apiexport/{provider.cluster}/{slice_name}"
                # The slice object the syncer reads its endpoints from: vwserver's API as a
                # plain CRD in the slice's workspace, its status written as vwserver would.
                await apply_retrying(kcp, provider.url, SLICE_CRD, within=SETUP)
                the_slice = {
                    "apiVersion": "sync.edge-connect.eu/v1alpha1",
                    "kind": "FilteredAPIExportEndpointSlice",
                    "metadata": {"name": slice_name},
                    "spec": {
                        "export": {"path": provider.path, "name": EXPORT},
                        "objectSelector": {"matchLabels": {"region": "eu"}},
                    },
                }
                await apply_retrying(kcp, provider.url, json.dumps(the_slice), within=SETUP)
                await kcp.kubectl(
                    "patch", "filteredapiexportendpointslice", slice_name,
                    "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"endpoints": [{"url": endpoint}]}}),
                    server=provider.url,
                )  # fmt: skip
                upstream = await upstream_identity(
                    kcp, world, name="syncer-eu", rules=lambda rules: rules
                )
                operator = asyncio.create_task(FakeMongoOperator(world).run())
                try:
                    yield Deployed(world, base, kubeapi, slice_name, upstream)
                finally:
                    operator.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await operator


# --------------------------------------------------------------------------------------------
# Running a syncer as the pod would


@contextlib.asynccontextmanager
async def pod(
    deployed: Deployed, token: str, directory: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[InCluster]:
    """The pod's view of the downstream cluster: env and ServiceAccount directory."""
    async with in_cluster(
        api_url=deployed.kubeapi.url, ca_file=deployed.kubeapi.ca, token=token, directory=directory
    ) as view:
        for key, value in view.environ.items():
            monkeypatch.setenv(key, value)
        yield view


@dataclass
class Attempt:
    """A syncer expected to fail: its task is kept, a crash is evidence, not an error."""

    syncer: Syncer
    task: asyncio.Task[None]

    def crash(self) -> BaseException | None:
        if self.task.done() and not self.task.cancelled():
            return self.task.exception()
        return None


@contextlib.asynccontextmanager
async def attempt(deployed: Deployed, config: SyncerConfig, sa_dir: Path) -> AsyncIterator[Attempt]:
    syncer = Syncer(config, base_dir=deployed.world.dir, service_account_dir=sa_dir)
    stop = asyncio.Event()
    task = asyncio.create_task(syncer.run(stop), name=f"syncer {config.name} (expected to fail)")
    try:
        yield Attempt(syncer, task)
    finally:
        stop.set()
        async with asyncio.timeout(20):  # a stop that hangs fails the test here
            await asyncio.gather(task, return_exceptions=True)


async def readyz(syncer: Syncer) -> tuple[int, str]:
    assert syncer.health_url is not None
    async with aiohttp.ClientSession() as plain, plain.get(f"{syncer.health_url}/readyz") as resp:
        return resp.status, await resp.text()


def forbidden(text: str, resource: str) -> bool:
    """The API server's 403 for ``resource``: ``... is forbidden: User "..." cannot get resource "<r>" ...``"""
    return "forbidden" in text.lower() and f'resource "{resource}"' in text


async def evidence(
    run: Attempt, caplog: pytest.LogCaptureFixture, resource: str, up: Doc | None
) -> list[str]:
    """Where the 403 for ``resource`` is visible to an operator (empty: nowhere yet)."""
    found = []
    if (crash := run.crash()) is not None:
        assert forbidden(str(crash), resource), f"the syncer stopped for another reason: {crash!r}"
        found.append(f"the syncer stopped: {crash}")
    if run.syncer.health_url is not None and not run.task.done():
        status, text = await readyz(run.syncer)
        if status == 503 and forbidden(text, resource):
            found.append(f"/readyz {status}: {text.strip()}")
    condition = synced_condition(up or {})
    if condition.get("status") == "False" and forbidden(condition.get("message", ""), resource):
        found.append(f"Synced=False {condition.get('reason')}: {condition['message']}")
    found += [
        f"log {r.levelname}: {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.WARNING and forbidden(r.getMessage(), resource)
    ]
    return found


# --------------------------------------------------------------------------------------------
# The shipped grants suffice


async def test_shipped_rbac_and_config_sync_through_the_slice(
    deployed: Deployed, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Exactly the rendered downstream objects (RBAC, Deployment ...) applied to a real
    kube-apiserver, the Deployment's ServiceAccount's token, the upstream example grant and the
    ConfigMap's config: an object goes down, its status up (``Synced=True``), deleting it cleans up both
    sides; one relabelled out of the slice leaves a ``FinalizerStuck`` Event downstream; the
    Lease is in the Role's namespace; every downstream request carried the token."""
    world, base = deployed.world, deployed.base
    ws = world.consumers["a"]
    sa, token = await deployed.install_downstream()
    # the token is the one the Deployment's pods would mount, and the server kept the Deployment
    deployment = base.docs["Deployment"]
    pod_spec = deployment["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == sa and pod_spec["automountServiceAccountToken"]
    stored = await world.get(
        f"{world.downstream.url}/apis/apps/v1/namespaces/{base.namespace}/deployments/"
        f"{deployment['metadata']['name']}"
    )
    assert stored is not None and stored["spec"]["template"]["spec"]["serviceAccountName"] == sa
    async with (
        pod(deployed, token, tmp_path, monkeypatch) as view,
        running(world, deployed.config(), service_account_dir=view.service_account_dir) as syncer,
    ):
        assert await readyz(syncer) == (200, "ok")
        lease_url = (
            f"{world.downstream.url}/apis/coordination.k8s.io/v1/"
            f"namespaces/{base.namespace}/leases/{syncer.config.lease_name}"
        )
        lease = await world.get(lease_url)
        assert lease is not None and lease["spec"]["holderIdentity"] == syncer.identity

        async def renewed() -> bool:  # the holder's PUTs (Role verb update) go through
            now = await world.get(lease_url)
            return now is not None and now["spec"]["renewTime"] != lease["spec"]["renewTime"]

        await eventually("the Lease renewed", renewed)

        # down, up, deletion
        name = unique("deployed")
        await world.create(ws, name, region="eu")
        await eventually("downstream copy", lambda: downstream_copy(world, ws, name))
        up = await eventually(
            "status up", lambda: upstream_status(world, ws, name, phase="Running")
        )
        assert synced_condition(up)["status"] == "True"
        await world.delete(world.up_url(ws, "default", name))

        async def gone() -> bool:
            return (
                await world.get(world.up_url(ws, "default", name)) is None
                and await downstream_copy(world, ws, name) is None
            )

        await eventually("gone in kcp and downstream", gone)

        # out of the slice while holding the finalizer: the Event is written downstream
        mover = unique("mover")
        try:
            await world.create(ws, mover, region="eu")
            await eventually("mover's copy", lambda: downstream_copy(world, ws, mover))
            await world.patch(
                world.up_url(ws, "default", mover), {"metadata": {"labels": {"region": "us"}}}
            )
            event = await eventually("FinalizerStuck event", lambda: stuck_event(world, ws, mover))
            assert event["type"] == "Warning"
        finally:
            await world.purge(ws, mover)
    assert view.seen_tokens and set(view.seen_tokens) == {token}


async def stuck_event(world: SyncWorld, ws: Workspace, name: str) -> Doc | None:
    """The ``FinalizerStuck`` Event the syncer writes next to where the copy of ``name`` was."""
    events = await world.get(f"{world.downstream.url}/api/v1/namespaces/{world.down_ns(ws)}/events")
    return next(
        (
            e
            for e in (events or {}).get("items", [])
            if e["reason"] == "FinalizerStuck" and e["involvedObject"]["name"] == name
        ),
        None,
    )


# --------------------------------------------------------------------------------------------
# Each rule is needed: without it the syncer fails, visibly


@pytest.mark.parametrize("resource", cluster_role_resources(render_base()))
async def test_without_a_cluster_role_rule_the_syncer_fails_visibly(
    deployed: Deployed,
    resource: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    observe: Callable[[str], None],
) -> None:
    """The rendered RBAC minus the ClusterRole rule for ``resource``: the 403 for it becomes
    visible (the syncer's error, ``/readyz``, the kcp object's condition or a warning), and what
    the rule is for does not happen (no downstream copy; for events: no Event)."""
    world = deployed.world
    ws = world.consumers["b"]
    _, token = await deployed.install_downstream(without=resource)
    name = unique(f"no-{resource[:8]}")
    caplog.set_level(logging.WARNING, logger="vwserver")
    async with (
        pod(deployed, token, tmp_path, monkeypatch) as view,
        attempt(deployed, deployed.config(), view.service_account_dir) as run,
    ):
        try:
            await world.create(ws, name, region="eu")
            if resource == "events":
                # everything else works: the copy is made; the Event cannot be
                await eventually("copy", lambda: downstream_copy(world, ws, name))
                await world.patch(
                    world.up_url(ws, "default", name), {"metadata": {"labels": {"region": "us"}}}
                )
                await eventually(
                    "stuck",
                    lambda: _value(any(s["name"] == name for s in run.syncer.stuck_objects())),
                )

            async def seen() -> list[str] | None:
                up = await world.get(world.up_url(ws, "default", name))
                return await evidence(run, caplog, resource, up) or None

            found = await eventually(f"a visible 403 for {resource}", seen)
            observe("\n".join(found))
            if resource == "events":
                assert await stuck_event(world, ws, name) is None
            else:
                assert await downstream_copy(world, ws, name) is None, found
            if resource == run.syncer.config.resources[0].target.resource:
                up = await world.get(world.up_url(ws, "default", name))
                condition = synced_condition(up or {})
                assert (condition.get("status"), condition.get("reason")) == ("False", "Forbidden")
        finally:
            await world.purge(ws, name)
    assert set(view.seen_tokens) == {token}


async def _value(value: bool) -> bool:
    return value


async def test_without_patch_upstream_nothing_is_synced(
    deployed: Deployed,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    observe: Callable[[str], None],
) -> None:
    """``manifests/rbac/syncer-upstream.yaml`` without ``patch`` on the slice's content: the
    syncer may read but not put its finalizer on an object, so it creates nothing downstream (a
    copy without the finalizer could be orphaned by a deletion) and logs vwserver's 403."""
    world = deployed.world
    ws = world.consumers["b"]

    def without_patch(rules: list[Doc]) -> list[Doc]:
        content = [
            r for r in rules if r.get("resources") == ["filteredapiexportendpointslices/content"]
        ]
        assert len(content) == 1 and "patch" in content[0]["verbs"]
        content[0]["verbs"] = [v for v in content[0]["verbs"] if v != "patch"]
        return rules

    kubeconfig = await upstream_identity(
        deployed.kcp, world, name="syncer-eu-without-patch", rules=without_patch
    )
    _, token = await deployed.install_downstream()
    name = unique("no-patch")
    caplog.set_level(logging.WARNING, logger="vwserver")
    config = deployed.config(upstream_kubeconfig=kubeconfig)
    async with (
        pod(deployed, token, tmp_path, monkeypatch) as view,
        attempt(deployed, config, view.service_account_dir) as run,
    ):
        try:
            await world.create(ws, name, region="eu")

            async def refused() -> list[str] | None:
                return [
                    r.getMessage()
                    for r in caplog.records
                    if r.levelno >= logging.WARNING
                    and name in r.getMessage()
                    and "403" in r.getMessage()
                    and "cannot patch" in r.getMessage()
                ] or None

            found = await eventually("vwserver's 403 for patch", refused)
            observe("\n".join(found))
            assert run.crash() is None, run.crash()
            assert await downstream_copy(world, ws, name) is None, found
            up = await world.get(world.up_url(ws, "default", name))
            assert up is not None and not up["metadata"].get("finalizers")
        finally:
            await world.purge(ws, name)
