"""``make run-sync``: the syncer's reference use case, running, in one command, until Ctrl-C.

A consumer creates a database in its kcp workspace; a syncer copies it into a separate cluster
where an operator acts on it; the operator's status comes back into kcp; deleting the database
removes the downstream copy first. The story is built from the shipped pieces, the way a
provider would assemble them, so that it shows the product and proves those pieces fit:

* a local kcp (:mod:`devenv.kcp`, as ``make run``), the MongoDBCommunity-like API of
  ``config/syncer/provider.yaml`` exported from workspace ``root:sync-provider``, bound in two
  consumer workspaces (``config/syncer/consumer.yaml``);
* vwserver's API bound in the provider, a FilteredAPIExportEndpointSlice ``mongodb-eu``
  (``region=eu``) there, and ``vwserver serve`` in kcp mode serving it over TLS (the same process
  and files as ``make run``, :func:`devenv.demo.start_vwserver`);
* the downstream cluster: a kcp workspace (``make run-sync``) or a real kube-apiserver
  (:mod:`devenv.kubeapi`, which the e2e test runs too), with the plain CRD of
  ``config/syncer/downstream-crd.yaml``, and a small operator in it
  (:class:`devenv.mongo_operator.MongoOperator`, in this process);
* ``vwserver sync`` as its own process, with a config written next to vwserver's, shaped like
  ``config/syncer.example.yaml`` (syncer ``eu``, the slice read from kcp, its endpoints trusted
  with vwserver's CA, ``mongoUri`` kept downstream, and the related Secrets of :data:`RELATED`:
  the password Secret copied down, the operator's connection-string Secret copied up).

Then it prints kubectl lines: create the sample database and its password Secret
(``config/syncer/sample.yaml``), watch or wait for its status (``Pending`` until the password
has reached the operator), look at the downstream copy and the Secrets on both sides, delete it
and see every copy go. :func:`story_lines` is their one
source (a pure function of where things are); ``tests/e2e/test_seed_story_kcp.py`` runs each of
them as printed against a story started by :func:`seed_story`, the code ``make run-sync`` runs.

Everything it writes goes to ``.run/sync/`` (git-ignored). Ctrl-C (or SIGTERM) stops the syncer,
the operator, vwserver and kcp, in that order, and removes kcp's temporary directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import shlex
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import yaml

from devenv.bootstrap import (
    Workspace,
    apply_retrying,
    get_field,
    poll,
    wait_workspace_ready,
)
from devenv.demo import (
    DemoLine,
    served_endpoint,
    shown_path,
    start_vwserver,
    stop_process,
    story_main,
)
from devenv.kcp import KcpError, KcpInstance, build_kcp, start_kcp
from devenv.kubeapi import KubeAPIServer
from devenv.mongo_operator import API, PLURAL, MongoOperator, connection_secret_name, users_of
from devenv.slices import bind_api, install_api, slice_manifest
from vwserver.files import write_private
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import load_kubeconfig
from vwserver.syncer.naming import LABEL_SYNCER, downstream_namespace

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "config" / "syncer"
SAMPLE_FILE = MANIFESTS / "sample.yaml"
EXPORT = "mongodbcommunity.mongodb.com"
RESOURCE = f"{PLURAL}.{EXPORT}"
#: The slice the syncer reads, and the labels it selects (config/syncer.example.yaml's).
SLICE = "mongodb-eu"
SLICE_LABELS = {"region": "eu"}
SYNCER = "eu"
#: What the slice shows of the consumers' Secrets (the export claims ``secrets``): the password
#: Secrets its databases name, and the Secrets syncer ``eu`` copies up into kcp (the
#: connection strings the operator writes downstream), which carry its owner label.
SLICE_RELATED: list[dict[str, Any]] = [
    {
        "resource": "secrets",
        "referencedBy": {
            "group": EXPORT,
            "version": "v1",
            "resource": PLURAL,
            "path": "spec.users[*].passwordSecretRef.name",
        },
    },
    {"resource": "secrets", "selector": {"matchLabels": {LABEL_SYNCER: SYNCER}}},
]
#: The syncer's related resources of each database (``resources[0].related`` of its config,
#: and of config/syncer.example.yaml): the password Secret its users name, copied down before
#: the database (found by the same path as the slice's referencedBy rule), and the
#: connection-string Secret the operator writes downstream, ``<database>-<db>-<user>``, copied
#: up into the consumer's namespace with the syncer's owner label (which the slice's selector
#: rule shows, so that the write passes the slice).
RELATED: list[dict[str, Any]] = [
    {
        "name": "password",
        "origin": "kcp",
        "group": "",
        "version": "v1",
        "resource": "secrets",
        "kind": "Secret",
        "reference": {"path": "spec.users[*].passwordSecretRef.name"},
    },
    {
        "name": "connection-string",
        "origin": "downstream",
        "group": "",
        "version": "v1",
        "resource": "secrets",
        "kind": "Secret",
        "nameTemplate": "{{ .metadata.name }}-{{ .spec.users[*].db }}-{{ .spec.users[*].name }}",
    },
]
NAMESPACE_PREFIX = "kcp-"
#: The workspace of vwserver's own APIExport (``make run`` uses the same).
API_WORKSPACE = "vwserver"
#: The export path that config/syncer/consumer.yaml binds; replaced by the provider's path.
_CONSUMER_EXPORT_PATH = "root:sync-provider"
_HEALTH_LINE = re.compile(r"health and metrics on (http://\S+)")
SETUP = 120.0  # seconds for any one setup step


# --------------------------------------------------------------------------------------------
# Where things are


@dataclass(frozen=True, kw_only=True)
class StoryNames:
    """The story's workspace names under ``root``."""

    provider: str = "sync-provider"
    consumers: tuple[str, ...] = ("sync-team-a", "sync-team-b")
    downstream: str = "sync-downstream"

    @classmethod
    def unique(cls, prefix: str = "seed") -> StoryNames:
        """Names no other run uses (tests on a shared kcp)."""
        tag = f"{prefix}-{uuid.uuid4().hex[:5]}"
        return cls(
            provider=f"{tag}-provider",
            consumers=(f"{tag}-team-a", f"{tag}-team-b"),
            downstream=f"{tag}-down",
        )


@dataclass(frozen=True, kw_only=True)
class SyncWorld:
    provider: Workspace
    consumers: tuple[Workspace, ...]
    #: The downstream cluster: a kcp workspace, or :attr:`kubeapi`'s stand-in
    #: (:meth:`~devenv.kubeapi.KubeAPIServer.as_workspace`).
    downstream: Workspace
    #: Where vwserver's APIExport lives.
    api: Workspace
    #: The downstream cluster when it is a real kube-apiserver.
    kubeapi: KubeAPIServer | None = None

    @property
    def downstream_shown(self) -> str:
        """The downstream cluster, as the printed text names it."""
        if self.kubeapi is not None:
            return f"the kube-apiserver at {self.kubeapi.url}"
        return f"workspace {self.downstream.path}"


@dataclass(frozen=True, kw_only=True)
class Sample:
    """The database of ``config/syncer/sample.yaml``, which the printed lines create (with
    the password Secret its user names, created first, from the same file)."""

    name: str
    namespace: str
    labels: dict[str, str]
    spec: dict[str, Any]
    #: The Secrets the file creates next to the database (its password Secret).
    secrets: tuple[str, ...] = ()

    @property
    def connection_secrets(self) -> tuple[str, ...]:
        """What the operator writes downstream for each user, ``<database>-<db>-<user>``, and
        the syncer copies up (its ``connection-string`` entry's template gives these names)."""
        obj = {"metadata": {"name": self.name}, "spec": self.spec}
        return tuple(connection_secret_name(self.name, user) for user in users_of(obj))


def sample_database(path: Path = SAMPLE_FILE) -> Sample:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    doc = next(d for d in docs if d.get("kind") == "MongoDBCommunity")
    meta = doc["metadata"]
    namespace = meta.get("namespace", "default")
    secrets = tuple(
        str(d["metadata"]["name"])
        for d in docs
        if d.get("kind") == "Secret" and d["metadata"].get("namespace", "default") == namespace
    )
    return Sample(
        name=meta["name"],
        namespace=namespace,
        labels=dict(meta.get("labels") or {}),
        spec=dict(doc.get("spec") or {}),
        secrets=secrets,
    )


# --------------------------------------------------------------------------------------------
# What the story prints


#: custom-columns of the consumer's view: what the operator reported, and the syncer's condition.
STATUS_COLUMNS = (
    "NAME:.metadata.name,PHASE:.status.phase,VERSION:.status.version,"
    "MEMBERS:.status.currentMongoDBMembers,"
    'SYNCED:.status.conditions[?(@.type=="Synced")].status'
)
#: custom-columns of the downstream view: where the copy is and the operator's internal URI.
DOWNSTREAM_COLUMNS = (
    "NAMESPACE:.metadata.namespace,NAME:.metadata.name,PHASE:.status.phase,"
    "MONGOURI:.status.mongoUri"
)


def story_lines(
    *, kcp: KcpInstance, world: SyncWorld, sample_file: str, sample: Sample
) -> list[DemoLine]:
    """The kubectl lines the story prints, in order (no I/O).

    ``sample_file``: ``config/syncer/sample.yaml`` as printed (:func:`~devenv.demo.shown_path`).
    Every line is run by ``tests/e2e/test_seed_story_kcp.py``.
    """
    team = world.consumers[0]
    kc = shlex.quote(str(kcp.kubeconfig))
    consumer = f"kubectl --kubeconfig {kc} --server {team.url}"
    if world.kubeapi is None:
        downstream = f"kubectl --kubeconfig {kc} --server {world.downstream.url}"
    else:
        downstream = f"kubectl --kubeconfig {shlex.quote(str(world.kubeapi.kubeconfig))}"
    provider = f"kubectl --kubeconfig {kc} --server {world.provider.url}"
    db = f"{PLURAL} {sample.name} -n {sample.namespace}"
    selector = ",".join(f"{k}={v}" for k, v in SLICE_LABELS.items())
    labels = ",".join(f"{k}={v}" for k, v in sample.labels.items()) or "no labels"
    columns = shlex.quote(f"custom-columns={DOWNSTREAM_COLUMNS}")
    see_downstream = f"{downstream} get {PLURAL} -A -o {columns}"
    copy_ns = downstream_namespace(team.cluster, sample.namespace, prefix=NAMESPACE_PREFIX)
    owner = f"-L {LABEL_SYNCER}"
    see_secrets = f"{consumer} get secrets -n {sample.namespace} {owner}"
    see_downstream_secrets = f"{downstream} get secrets -n {copy_ns} {owner}"
    passwords = ", ".join(sample.secrets) or "none"
    connections = ", ".join(sample.connection_secrets) or "none"
    return [
        DemoLine(
            key="slice",
            shows=(
                f"the slice the syncer reads ({selector}), served by vwserver, in "
                f"{world.provider.path}:",
            ),
            command=f"{provider} get filteredapiexportendpointslices -o wide",
        ),
        DemoLine(
            key="create",
            shows=(
                f"create a database in consumer workspace {team.path} "
                f"({sample.namespace}/{sample.name}, {labels}) and its password Secret "
                f"({passwords}):",
            ),
            command=f"{consumer} apply -f {shlex.quote(sample_file)}",
        ),
        DemoLine(
            key="watch",
            shows=(
                "watch its status arrive from the downstream operator (Pending until its "
                "password Secret is there, then Running; Ctrl-C ends the watch):",
            ),
            command=f"{consumer} get {db} -w -o {shlex.quote(f'custom-columns={STATUS_COLUMNS}')}",
        ),
        DemoLine(
            key="wait",
            shows=("or wait for it (returns once the phase is Running):",),
            command=f"{consumer} wait {PLURAL}/{sample.name} -n {sample.namespace} "
            f"--for=jsonpath='{{.status.phase}}'=Running --timeout=60s",
        ),
        DemoLine(
            key="downstream",
            shows=(
                f"the copy in the downstream cluster ({world.downstream_shown}), in a "
                "namespace per source workspace and namespace,",
                "with the operator's mongoUri, which the syncer keeps there (statusExclude):",
            ),
            command=see_downstream,
        ),
        DemoLine(
            key="downstream-secrets",
            shows=(
                f"next to it, the password Secret the syncer copied down ({passwords}, with "
                f"its owner label) and the connection string the operator wrote ({connections}):",
            ),
            command=see_downstream_secrets,
        ),
        DemoLine(
            key="secrets",
            shows=(
                f"in the consumer workspace, the password Secret and the connection string the "
                f"syncer brought back ({connections}; its owner label is what the slice shows "
                f"syncer {SYNCER}):",
            ),
            command=see_secrets,
        ),
        DemoLine(
            key="delete",
            shows=(
                "delete it: kcp keeps it until the syncer has deleted the downstream copy and "
                "the copied Secrets (its finalizer); kubectl waits for that:",
            ),
            command=f"{consumer} delete {db}",
        ),
        DemoLine(
            key="downstream-gone",
            shows=("the downstream copy is gone:",),
            command=see_downstream,
        ),
        DemoLine(
            key="downstream-secrets-gone",
            shows=(
                "and so are the Secrets next to it (the operator deletes its connection string "
                "with the database; the empty namespace goes too):",
            ),
            command=see_downstream_secrets,
        ),
        DemoLine(
            key="secrets-gone",
            shows=(
                "in the consumer workspace only your own password Secret is left (the "
                "connection string's copy is gone):",
            ),
            command=see_secrets,
        ),
    ]


def story_text(
    *,
    kcp: KcpInstance,
    world: SyncWorld,
    run_dir: str,
    base: str,
    endpoint: str,
    health: str,
    sample_file: str,
    sample: Sample,
) -> str:
    """Everything the story prints once the syncer is ready: :func:`story_lines` with a frame."""
    sources = ", ".join(ws.path for ws in world.consumers)
    out = [
        "",
        f"vwserver serves slice {SLICE} of {EXPORT} at {endpoint}",
        f"syncer {SYNCER} syncs it from {sources} into {world.downstream_shown}, where an "
        "operator writes status",
    ]
    for line in story_lines(kcp=kcp, world=world, sample_file=sample_file, sample=sample):
        out += ["", *(f"# {text}" for text in line.shows), line.command]
    out += [
        "",
        f"configs: {run_dir}/vwserver.yaml {run_dir}/syncer.yaml   vwserver: {base}   "
        f"syncer health and metrics: {health}",
        f"kcp admin kubeconfig: {kcp.kubeconfig}",
        *(
            [f"downstream admin kubeconfig: {world.kubeapi.kubeconfig}"]
            if world.kubeapi is not None
            else []
        ),
        "Ctrl-C stops the syncer, the operator, vwserver and kcp.",
    ]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# The world in kcp


async def bootstrap_sync(
    kcp: KcpInstance,
    names: StoryNames = StoryNames(),
    *,
    api_workspace: str = API_WORKSPACE,
    kubeapi: KubeAPIServer | None = None,
    within: float = SETUP,
) -> SyncWorld:
    """Provider, consumers, downstream workspace (none with ``kubeapi``: the downstream cluster
    then), vwserver's API and the slice. Idempotent (every step is a server-side apply); every
    wait bounded by ``within``."""
    all_names = (names.provider, *names.consumers, *([] if kubeapi else [names.downstream]))
    workspaces = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": n}}
            for n in all_names
        ],
    }
    await apply_retrying(kcp, kcp.cluster_url("root"), json.dumps(workspaces), within=within)
    ready = await asyncio.gather(*(wait_workspace_ready(kcp, n, within=within) for n in all_names))
    provider, *consumers = ready[: 1 + len(names.consumers)]

    # The API, its export, and a binding in each consumer.
    await apply_retrying(kcp, provider.url, MANIFESTS / "provider.yaml", within=within)
    await poll(
        f"APIExport {EXPORT} identity",
        lambda: get_field(kcp, provider.url, "apiexport", EXPORT, "status", "identityHash"),
        within=within,
    )
    binding = (MANIFESTS / "consumer.yaml").read_text()
    binding = binding.replace(_CONSUMER_EXPORT_PATH, provider.path)
    for ws in consumers:
        await apply_retrying(kcp, ws.url, binding, within=within)
    for ws in consumers:
        await poll(
            f"APIBinding {EXPORT} in {ws.path} Bound",
            functools.partial(_bound, kcp, ws.url),
            within=within,
        )

    # vwserver's API in the provider, and the slice.
    api = await install_api(kcp, workspace=api_workspace, within=within)
    await bind_api(kcp, provider, api=api, within=within)
    manifest = slice_manifest(
        SLICE,
        export_path=provider.path,
        export_name=EXPORT,
        selector={"matchLabels": SLICE_LABELS},
        related=SLICE_RELATED,
    )
    await apply_retrying(kcp, provider.url, manifest, within=within)

    # The downstream cluster's CRD, served and in discovery (the syncer checks discovery).
    crd = MANIFESTS / "downstream-crd.yaml"
    if kubeapi is None:
        downstream = ready[-1]
        await apply_retrying(kcp, downstream.url, crd, within=within)
        session = kcp.http_session(timeout=10)
    else:
        downstream = kubeapi.as_workspace()
        await kubeapi.kubectl("apply", "--server-side", "--validate=strict", "-f", str(crd))
        session = kubeapi.http_session(timeout=10)

    async with session:

        async def discovered() -> bool | None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(f"{downstream.url}/{API}") as resp:
                    if resp.status == 200:
                        found = await resp.json()
                        served = [r.get("name") for r in found.get("resources") or []]
                        return True if PLURAL in served else None
            return None

        await poll(f"{RESOURCE} in {downstream.path}'s discovery", discovered, within=within)
    return SyncWorld(
        provider=provider,
        consumers=tuple(consumers),
        downstream=downstream,
        api=api,
        kubeapi=kubeapi,
    )


async def _bound(kcp: KcpInstance, server: str) -> bool | None:
    phase = await get_field(kcp, server, "apibinding", EXPORT, "status", "phase")
    return True if phase == "Bound" else None


# --------------------------------------------------------------------------------------------
# The syncer


def write_syncer_files(run_dir: Path, *, kcp: KcpInstance, world: SyncWorld) -> Path:
    """The syncer's kubeconfigs and config (next to vwserver's ``ca.crt``); returns the config.

    Both identities are admins: kcp-admin towards kcp (the slice, and the endpoints, which
    vwserver authorizes with kcp), and in the downstream cluster kcp-admin or the
    kube-apiserver's admin (a client certificate; the kubeconfig names its files).
    """
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    kcp.write_admin_kubeconfig(run_dir / "kcp.kubeconfig", server=kcp.url)
    downstream_kubeconfig = run_dir / "downstream.kubeconfig"
    if world.kubeapi is None:
        kcp.write_admin_kubeconfig(downstream_kubeconfig, server=world.downstream.url)
    else:
        write_private(downstream_kubeconfig, world.kubeapi.kubeconfig.read_text())
    config = {
        "name": SYNCER,
        "upstream": {
            "kubeconfig": "kcp.kubeconfig",
            "endpointSlice": {
                "kind": "FilteredAPIExportEndpointSlice",
                "workspace": world.provider.path,
                "name": SLICE,
            },
            "refreshSeconds": 10,
        },
        # The endpoints are vwserver's: its certificate, signed by the story's own CA.
        "endpoints": {"caFile": "ca.crt"},
        "downstream": {"kubeconfig": "downstream.kubeconfig"},
        "resources": [
            {
                "group": EXPORT,
                "version": "v1",
                "resource": PLURAL,
                "kind": "MongoDBCommunity",
                "statusExclude": ["mongoUri"],
                "related": RELATED,
            }
        ],
        "namespacePrefix": NAMESPACE_PREFIX,
        "resyncSeconds": 30,
        "health": {"host": "127.0.0.1", "port": 0},
    }
    path = run_dir / "syncer.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@dataclass(frozen=True, kw_only=True)
class SyncerProcess:
    process: asyncio.subprocess.Process
    #: ``http://host:port`` of its /healthz, /readyz and /metrics.
    health: str


@contextlib.asynccontextmanager
async def start_syncer(
    config: Path, *, log: TextIO | None = None, within: float = 60.0
) -> AsyncIterator[SyncerProcess]:
    """``vwserver sync --config config`` until the block ends, ready (``/readyz`` 200: every
    informer has listed) when the block starts. Its stderr goes to ``log`` (default: ours)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vwserver.cli", "sync", "--config", str(config),
        stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None
    health: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    relay = asyncio.create_task(_relay(process.stderr, log, health))
    try:
        url = await _wait_syncer_ready(process, health, within=within)
        yield SyncerProcess(process=process, health=url)
    finally:
        await stop_process(process)
        with contextlib.suppress(TimeoutError):  # its last lines; cancelled after 5 s
            await asyncio.wait_for(relay, 5)


async def _relay(
    stream: asyncio.StreamReader, log: TextIO | None, health: asyncio.Future[str]
) -> None:
    """Copy the syncer's stderr to ``log`` (default: ours), noting its health URL."""
    while line := await stream.readline():
        text = line.decode(errors="replace")
        if not health.done() and (found := _HEALTH_LINE.search(text)):
            health.set_result(found.group(1))
        sink = log if log is not None else sys.stderr
        sink.write(text)
        sink.flush()


async def _wait_syncer_ready(
    process: asyncio.subprocess.Process, health: asyncio.Future[str], *, within: float
) -> str:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while loop.time() < deadline:
            if process.returncode is not None:
                raise KcpError(f"vwserver sync exited with code {process.returncode}")
            if health.done():
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(f"{health.result()}/readyz") as r:
                        if r.status == 200:
                            return health.result()
            await asyncio.sleep(0.2)
    raise KcpError(f"vwserver sync was not ready within {within:.0f}s")


# --------------------------------------------------------------------------------------------
# The whole story


@dataclass(frozen=True, kw_only=True)
class Story:
    """A running story: where everything is."""

    world: SyncWorld
    #: vwserver's base URL and the slice's endpoint.
    base: str
    endpoint: str
    vwserver: asyncio.subprocess.Process
    syncer: SyncerProcess
    operator: MongoOperator
    operator_task: asyncio.Task[None]
    run_dir: Path


@contextlib.asynccontextmanager
async def seed_story(
    kcp: KcpInstance,
    *,
    run_dir: Path,
    port: int,
    names: StoryNames = StoryNames(),
    api_workspace: str = API_WORKSPACE,
    kubeapi: KubeAPIServer | None = None,
    ready_after: float = 3.0,
    log: TextIO | None = None,
    say: Callable[[str], None] | None = None,
) -> AsyncIterator[Story]:
    """The story on ``kcp``, running while the block runs; everything it started is stopped
    when the block ends (the syncer first, so that it releases its Lease while vwserver and the
    downstream still answer).

    ``port``: vwserver's (if free; 0: any). ``log``: where vwserver's and the syncer's logs go
    (default: our stderr). ``say``: where the operator's lines go (default: our stderr).
    ``ready_after``: seconds the operator reports a new database Pending before Running.
    ``kubeapi``: the downstream cluster (default: a workspace of ``kcp``).
    """
    world = await bootstrap_sync(kcp, names, api_workspace=api_workspace, kubeapi=kubeapi)
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    async with contextlib.AsyncExitStack() as stack:
        process, base = await stack.enter_async_context(
            start_vwserver(run_dir, kcp=kcp, api=world.api, port=port, log=log)
        )
        endpoint = await served_endpoint(kcp, world.provider, SLICE, base=base)

        if kubeapi is None:
            auth = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
        else:
            auth = await load_kubeconfig(kubeapi.kubeconfig)
        client = await stack.enter_async_context(KubeClient(auth=auth))
        operator = MongoOperator(
            client, cluster_url=world.downstream.url, ready_after=ready_after, say=say
        )
        task = asyncio.create_task(operator.run(), name="mongodb operator")
        stack.push_async_callback(_cancel, task)

        config = write_syncer_files(run_dir, kcp=kcp, world=world)
        syncer = await stack.enter_async_context(start_syncer(config, log=log))
        yield Story(
            world=world,
            base=base,
            endpoint=endpoint,
            vwserver=process,
            syncer=syncer,
            operator=operator,
            operator_task=task,
            run_dir=run_dir,
        )


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


# --------------------------------------------------------------------------------------------
# make run-sync


async def run(*, run_dir: Path, port: int) -> None:
    """The story until SIGINT/SIGTERM (at any point, the bootstrap included) or until one of its
    processes stops by itself."""
    story = asyncio.current_task()
    assert story is not None
    loop = asyncio.get_running_loop()
    stopping: list[int] = []

    def stop(signum: int) -> None:
        if not stopping:  # once: a second Ctrl-C must not cut the shutdown short
            stopping.append(signum)
            story.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig)
    try:
        await _story(run_dir=run_dir, port=port)
    except asyncio.CancelledError:
        if not stopping:
            raise
    print("stopped")


async def _story(*, run_dir: Path, port: int) -> None:
    binary = await asyncio.to_thread(build_kcp)
    async with start_kcp(binary=binary) as kcp:
        print(
            f"kcp ready at {kcp.url} after {kcp.ready_seconds:.1f}s; bootstrapping the story",
            flush=True,
        )
        async with seed_story(kcp, run_dir=run_dir, port=port) as story:
            cwd = Path.cwd()
            text = story_text(
                kcp=kcp,
                world=story.world,
                run_dir=shown_path(run_dir, cwd),
                base=story.base,
                endpoint=story.endpoint,
                health=story.syncer.health,
                sample_file=shown_path(SAMPLE_FILE, cwd),
                sample=sample_database(),
            )
            print(text, flush=True)
            watched: dict[asyncio.Future[Any], str] = {
                asyncio.ensure_future(story.vwserver.wait()): "vwserver",
                asyncio.ensure_future(story.syncer.process.wait()): "vwserver sync",
                story.operator_task: "the operator",
            }
            try:
                done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for future in watched:
                    if future is not story.operator_task:
                        future.cancel()
            raise KcpError(f"{watched[done.pop()]} stopped by itself (see its log above)")


def main(argv: list[str] | None = None) -> int:
    return story_main(
        run, argv, prog="python -m devenv.seed_story", description=__doc__,
        run_dir=REPO / ".run" / "sync", port=8444,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
