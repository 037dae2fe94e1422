"""Bring a running kcp into the demo/test state: a provider exporting Widgets, two consumers.

The e2e tests and the ``make run`` demo need the same world — an APIExport with bindings in
several workspaces, sample objects with labels to filter on, static users (none of whom may use
the export's virtual workspace directly: slice users get slices, never ``apiexports/content``,
see ``config/demo/provider.yaml``) — and kcp only serves the virtual workspace once every
step before it has settled. This module does those steps in kcp's required order, waits for
each one with a timeout, and is idempotent (everything is a server-side ``kubectl apply``), so
it can run against a fresh kcp, a kcp it set up before, or one started by hand with
``--token-auth-file=config/demo/users.csv``.

The manifests live in ``config/demo/`` so a human can apply them too; the sample Widgets are
generated here from a small deterministic matrix (:func:`sample_widgets`) because the tests
need to know exactly which objects exist and which labels they carry.
"""

from __future__ import annotations

import asyncio
import csv
import functools
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from devenv.kcp import REPO_ROOT, KcpError, KcpInstance, KubectlError

DEMO_DIR = REPO_ROOT / "config" / "demo"
DEMO_USERS_FILE = DEMO_DIR / "users.csv"

PROVIDER = "provider"
CONSUMERS = ("consumer-a", "consumer-b")
EXPORT_NAME = "widgets.example.io"
GROUP = "example.io"
VERSION = "v1alpha1"
RESOURCE = "widgets"

#: The sample matrix: every consumer gets every namespace, every namespace every label combination.
SAMPLE_NAMESPACES = ("team-red", "team-blue")
SAMPLE_ENVS = ("prod", "dev")
SAMPLE_REGIONS = ("eu", "us")
_COLORS = ("red", "green", "blue", "yellow")

T = TypeVar("T")

_APPLY = ("apply", "--server-side", "--force-conflicts", "--field-manager=vwserver-devenv")
_LEGACY_GRANTS = (
    ("clusterrolebinding", "widgets-export-content-alice"),
    ("clusterrole", "widgets-export-content"),
)


@dataclass(frozen=True, kw_only=True)
class StaticUser:
    """A user of kcp's static token file (``token,user,uid,"group1,group2"``)."""

    name: str
    token: str
    uid: str
    groups: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Workspace:
    name: str
    #: Workspace path, e.g. ``root:provider`` (works in ``/clusters/<path>`` on a shard).
    path: str
    #: Logical-cluster ID (``spec.cluster``), what the APIExport VW URLs need.
    cluster: str
    #: ``https://<kcp>/clusters/<path>``, for kubectl ``--server``.
    url: str


@dataclass(frozen=True, kw_only=True)
class SampleWidget:
    workspace: str
    cluster: str
    namespace: str
    name: str
    labels: Mapping[str, str]
    size: int
    color: str

    def manifest(self) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Widget",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": dict(self.labels),
            },
            "spec": {"size": self.size, "color": self.color},
        }


@dataclass(frozen=True, kw_only=True)
class Bootstrap:
    """What the bootstrap created, with everything a test or demo needs to address it."""

    provider: Workspace
    consumers: tuple[Workspace, ...]
    export_name: str
    group: str
    version: str
    resource: str
    #: APIExport virtual-workspace URLs from the APIExportEndpointSlice (one per shard).
    vw_urls: tuple[str, ...]
    #: Bearer token of each static user that kcp authenticates (name -> token).
    tokens: Mapping[str, str]
    widgets: tuple[SampleWidget, ...]
    #: Wall-clock seconds the bootstrap took.
    duration: float

    @property
    def vw_url(self) -> str:
        return self.vw_urls[0]

    @property
    def api_path(self) -> str:
        """``apis/<group>/<version>``, the part after ``clusters/<id>/``."""
        return f"apis/{self.group}/{self.version}"

    def consumer(self, name: str) -> Workspace:
        for ws in self.consumers:
            if ws.name == name:
                return ws
        raise KeyError(name)

    def describe(self) -> str:
        """A human-readable summary (the demo prints it)."""
        lines = [
            f"provider   {self.provider.path} (cluster {self.provider.cluster})",
            *(f"consumer   {ws.path} (cluster {ws.cluster})" for ws in self.consumers),
            f"export     {self.export_name} ({self.group}/{self.version} {self.resource})",
            *(f"VW URL     {url}" for url in self.vw_urls),
            *(f"user       {name}: token {token}" for name, token in self.tokens.items()),
            f"widgets    {len(self.widgets)} in "
            f"{', '.join(sorted({w.namespace for w in self.widgets}))} of each consumer",
            f"took       {self.duration:.1f}s",
        ]
        return "\n".join(lines)


def read_token_auth_file(path: Path) -> tuple[StaticUser, ...]:
    """Parse a kube static token file (CSV ``token,user,uid[,"group1,group2"]``)."""
    users = []
    with path.open(newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            token, name, uid, *rest = row
            groups = tuple(g for g in (rest[0].split(",") if rest else []) if g)
            users.append(StaticUser(name=name, token=token, uid=uid, groups=groups))
    return tuple(users)


def sample_widgets(workspaces: Sequence[Workspace]) -> tuple[SampleWidget, ...]:
    """The deterministic sample matrix: per workspace and namespace, one Widget per env x region.

    Names (``prod-eu``, ...) repeat across namespaces and workspaces on purpose: a proxy that
    keys objects by namespace/name alone would conflate them.
    """
    widgets = []
    for ws in workspaces:
        combos = itertools.product(SAMPLE_NAMESPACES, SAMPLE_ENVS, SAMPLE_REGIONS)
        for i, (ns, env, region) in enumerate(combos):
            widgets.append(
                SampleWidget(
                    workspace=ws.name,
                    cluster=ws.cluster,
                    namespace=ns,
                    name=f"{env}-{region}",
                    labels={"env": env, "region": region},
                    size=i + 1,
                    color=_COLORS[i % len(_COLORS)],
                )
            )
    return tuple(widgets)


async def bootstrap(
    kcp: KcpInstance,
    *,
    manifests: Path = DEMO_DIR,
    users_file: Path | None = DEMO_USERS_FILE,
    wait_timeout: float = 120.0,
    locations: Mapping[str, Mapping[str, Any]] | None = None,
    endpoints: int = 1,
) -> Bootstrap:
    """Create (or confirm) the demo world on ``kcp``; every wait is bounded by ``wait_timeout``.

    ``users_file``: the token file kcp was started with; each user in it is checked with a
    TokenReview, and a kcp that does not know them is an error (start kcp with that file).
    ``locations`` (a sharded kcp): the ``spec.location.selector`` of each workspace by name (the
    workspaces are then made here instead of from ``workspaces.yaml``); ``endpoints``: how many
    endpoint URLs (shards with a binding) the export's APIExportEndpointSlice must list.
    """
    started = time.monotonic()
    root = kcp.cluster_url("root")

    # 1. Workspaces, and their logical-cluster IDs.
    names = (PROVIDER, *CONSUMERS)
    if locations is None:
        await apply_retrying(kcp, root, manifests / "workspaces.yaml", within=wait_timeout)
    else:
        docs = [workspace_manifest(name, selector=locations.get(name)) for name in names]
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
        await apply_retrying(kcp, root, doc, within=wait_timeout)
    ready = await asyncio.gather(
        *(wait_workspace_ready(kcp, name, within=wait_timeout) for name in names)
    )
    workspaces = {ws.name: ws for ws in ready}
    provider = workspaces[PROVIDER]
    consumers = tuple(workspaces[name] for name in CONSUMERS)

    # 2. Schema and export in the provider; the export is usable once it has an identity.
    await apply_retrying(kcp, provider.url, manifests / "provider.yaml", within=wait_timeout)
    # Earlier demos gave alice apiexports/content, i.e. the whole export past vwserver: a kcp
    # bootstrapped by one of them must not keep that grant (apply never deletes).
    for kind, name in _LEGACY_GRANTS:
        await kcp.kubectl("delete", kind, name, "--ignore-not-found", server=provider.url)
    await poll(
        f"APIExport {EXPORT_NAME} status.identityHash",
        lambda: get_field(kcp, provider.url, "apiexport", EXPORT_NAME, "status", "identityHash"),
        within=wait_timeout,
    )

    # 3. Bindings in the consumers.
    for ws in consumers:
        await apply_retrying(kcp, ws.url, manifests / "consumer.yaml", within=wait_timeout)
    await asyncio.gather(
        *(
            poll(
                f"APIBinding {EXPORT_NAME} in {ws.path} phase Bound",
                functools.partial(_bound, kcp, ws.url),
                within=wait_timeout,
            )
            for ws in consumers
        )
    )

    # 4. The endpoint slice lists a shard's VW URL once a binding exists on that shard.
    async def published() -> tuple[str, ...] | None:
        urls = await _endpoint_urls(kcp, provider.url)
        return urls if urls is not None and len(urls) >= endpoints else None

    vw_urls = await poll(
        f"APIExportEndpointSlice {EXPORT_NAME} endpoint URLs ({endpoints})",
        published,
        within=wait_timeout,
    )

    # 5. Sample objects (namespaces first, in the same List).
    widgets = sample_widgets(consumers)
    for ws in consumers:
        mine = [w for w in widgets if w.workspace == ws.name]
        items: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            for ns in sorted({w.namespace for w in mine})
        ]
        items += [w.manifest() for w in mine]
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        await apply_retrying(kcp, ws.url, doc, within=wait_timeout)

    # 6. The VW may be published before it serves (early 404s): wait until it lists everything.
    await _wait_vw_serves(kcp, vw_urls, consumers, expected=len(widgets), within=wait_timeout)

    tokens = await _verified_tokens(kcp, users_file) if users_file is not None else {}
    return Bootstrap(
        provider=provider,
        consumers=consumers,
        export_name=EXPORT_NAME,
        group=GROUP,
        version=VERSION,
        resource=RESOURCE,
        vw_urls=vw_urls,
        tokens=tokens,
        widgets=widgets,
        duration=time.monotonic() - started,
    )


# --------------------------------------------------------------------------------------------
# Steps


async def poll(
    what: str,
    probe: Callable[[], Awaitable[T | None]],
    *,
    within: float,
    interval: float = 0.5,
) -> T:
    """Call ``probe`` until it returns non-None, for at most ``within`` seconds.

    kubectl errors count as "not yet"; the last one is reported on timeout.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last_error = ""
    while True:
        try:
            value = await probe()
        except KubectlError as e:
            value, last_error = None, str(e)
        if value is not None:
            return value
        if loop.time() >= deadline:
            detail = f"; last error: {last_error}" if last_error else ""
            raise KcpError(f"timed out after {within:.0f}s waiting for {what}{detail}")
        await asyncio.sleep(interval)


async def get_json(kcp: KcpInstance, server: str, *args: str) -> Any:
    result = await kcp.kubectl("get", *args, "-o", "json", server=server)
    return json.loads(result.stdout)


async def get_field(kcp: KcpInstance, server: str, kind: str, name: str, *path: str) -> Any:
    value: Any = await get_json(kcp, server, kind, name)
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value or None


async def wait_workspace_ready(kcp: KcpInstance, name: str, *, within: float) -> Workspace:
    async def probe() -> Workspace | None:
        obj = await get_json(kcp, kcp.cluster_url("root"), "workspace", name)
        cluster = obj.get("spec", {}).get("cluster")
        if obj.get("status", {}).get("phase") != "Ready" or not cluster:
            return None
        path = f"root:{name}"
        return Workspace(name=name, path=path, cluster=cluster, url=kcp.cluster_url(path))

    return await poll(f"workspace root:{name} Ready", probe, within=within)


async def _bound(kcp: KcpInstance, server: str) -> bool | None:
    phase = await get_field(kcp, server, "apibinding", EXPORT_NAME, "status", "phase")
    return True if phase == "Bound" else None


async def _endpoint_urls(kcp: KcpInstance, server: str) -> tuple[str, ...] | None:
    endpoints = await get_field(
        kcp, server, "apiexportendpointslice", EXPORT_NAME, "status", "endpoints"
    )
    urls = tuple(e["url"] for e in endpoints or [] if e.get("url"))
    return urls or None


async def apply_retrying(
    kcp: KcpInstance, server: str, source: Path | str, *, within: float
) -> None:
    """Server-side apply from a file or a literal document, retried while kcp catches up.

    Server-side apply with forced conflicts: no last-applied annotation on the sample objects,
    and a re-run restores fields (e.g. labels) that a test changed and did not put back.

    Right after a workspace turns Ready or a binding turns Bound, discovery and admission can
    lag for a moment ("no matches for kind", "namespace not found").
    """

    async def probe() -> bool:
        if isinstance(source, Path):
            await kcp.kubectl(*_APPLY, "-f", str(source), server=server)
        else:
            await kcp.kubectl(*_APPLY, "-f", "-", server=server, input=source)
        return True

    await poll(f"kubectl apply in {server}", probe, within=within)


async def _wait_vw_serves(
    kcp: KcpInstance,
    vw_urls: Sequence[str],
    consumers: Sequence[Workspace],
    *,
    expected: int,
    within: float,
) -> None:
    """Until the wildcard lists of ``vw_urls`` together show all ``expected`` widgets and each
    consumer answers 200 at one of them. With several shards each VW serves only the consumers
    on its own shard, so the widgets add up across the URLs (with one URL: that one lists all)."""
    path = f"apis/{GROUP}/{VERSION}/{RESOURCE}"
    async with kcp.http_session(timeout=10) as session:

        async def status_and_items(url: str) -> tuple[int, int]:
            try:
                async with session.get(url) as resp:
                    if resp.status != 200:
                        return resp.status, 0
                    return 200, len((await resp.json()).get("items", []))
            except (aiohttp.ClientError, TimeoutError):
                return 0, 0

        async def probe() -> bool | None:
            total = 0
            for vw in vw_urls:
                code, items = await status_and_items(f"{vw}/clusters/*/{path}")
                if code != 200:
                    return None
                total += items
            if total < expected:
                return None
            for ws in consumers:
                answers = [
                    (await status_and_items(f"{vw}/clusters/{ws.cluster}/{path}"))[0]
                    for vw in vw_urls
                ]
                if 200 not in answers:
                    return None
            return True

        await poll(
            f"APIExport VW(s) {', '.join(vw_urls)} to serve {expected} widgets",
            probe,
            within=within,
        )


def workspace_manifest(name: str, *, selector: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A Workspace in ``root``; ``selector``: its ``spec.location.selector`` (over the Shard
    objects' labels: which shard kcp schedules it onto)."""
    doc: dict[str, Any] = {
        "apiVersion": "tenancy.kcp.io/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": name},
    }
    if selector is not None:
        doc["spec"] = {"location": {"selector": dict(selector)}}
    return doc


async def _verified_tokens(kcp: KcpInstance, users_file: Path) -> dict[str, str]:
    """Each user's token, after a TokenReview proves kcp authenticates it as that user."""
    tokens = {}
    for user in read_token_auth_file(users_file):
        review = json.dumps(
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": user.token},
            }
        )
        result = await kcp.kubectl(
            "create", "-f", "-", "-o", "json", server=kcp.cluster_url("root"), input=review
        )
        status = json.loads(result.stdout).get("status", {})
        if not status.get("authenticated") or status.get("user", {}).get("username") != user.name:
            raise KcpError(
                f"kcp at {kcp.url} does not authenticate the static user {user.name!r} "
                f"(TokenReview status: {status}); start kcp with --token-auth-file={users_file}"
            )
        tokens[user.name] = user.token
    return tokens
