"""The chaos tests' own world: a kcp they may kill, a relay between vwserver and that kcp, and
``vwserver serve`` processes they may kill.

The session's kcp (``tests/conftest.py``) is shared by every e2e test and must never die, so
the chaos tests start their own, with devenv's helpers (:mod:`devenv.kcp`, :mod:`devenv.
bootstrap`, :mod:`devenv.slices`), and differ from the test bed in three ways:

* **Restartable on its data.** kcp runs on a root directory under the test's tmp path, on fixed
  ports; :meth:`ChaosKcp.crash` SIGKILLs it and :meth:`ChaosKcp.start` runs it again on the same
  directory (the same etcd data, certificates and ports), as after a crash of a real shard.
* **A static identity.** The ``kcp-admin`` token changes on every start; every client here
  (the tests' own writes, vwserver, the Go informers) uses a user of a static token file
  instead, with ``kcp-admin``'s group (admin of every workspace), so their credentials survive
  restarts.
* **A relay in front.** kcp publishes its virtual-workspace URLs with the relay's port
  (``--shard-virtual-workspace-url``) and vwserver's ``upstream.server`` is the relay, so every
  byte between vwserver and kcp — the controller's, the cache's, the proxy's, the reviews' —
  passes :class:`~tests.support.relay.Relay`, which a test stalls and cuts. The tests' direct
  writes and reads of kcp do not.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devenv.bootstrap import Bootstrap, Workspace, bootstrap, get_json, poll
from devenv.demo import stop_process
from devenv.kcp import REPO_ROOT, KcpInstance, KcpProcess, free_ports
from devenv.slices import KIND, bind_api, install_api, slice_manifest
from tests.support.relay import Relay
from tests.support.vwserver_process import Reaper

TOKEN = "chaos-admin-token"  # a user of the chaos kcp's static token file
USER = "chaos-admin"
GROUPS = ("system:kcp:admin",)
"""kcp-admin's group: admin of every workspace. (Not ``system:masters``: kcp records no
creator for a workspace such a user creates, and the workspace never finishes initializing.)"""
API_WORKSPACE = "vwserver-api"
SLICE = "prod"
"""The slice every chaos test reads: ``env=prod`` of the demo export, in the provider."""
DIRECT_SLICE = "prod-direct"
"""The same selector as a static slice with ``cache: false``: the pass-through path."""
SELECTOR = {"matchLabels": {"env": "prod"}}
KCP_READY_WITHOUT = 180.0
"""Seconds kcp may take to become ready (a first start on 2 busy cores takes ~40 s)."""


def in_slice(labels: Mapping[str, str]) -> bool:
    return labels.get("env") == "prod"


@dataclass
class ChaosKcp:
    """The chaos tests' kcp, the demo world on it, and the relay vwserver reaches it through."""

    process: KcpProcess
    relay: Relay
    kcp: KcpInstance
    """kcp as the static user (``kubectl``, ``http_session``: its token)."""
    world: Bootstrap
    api: Workspace
    """The workspace of vwserver's own APIExport (where the controller finds slices)."""
    serving: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while kcp runs (writers wait for it instead of hammering a dead port)."""
    restarts: list[float] = field(default_factory=list)
    """Seconds from each restart to kcp's ``/readyz``."""

    @property
    def relay_url(self) -> str:
        return f"https://127.0.0.1:{self.relay.port}"

    async def crash(self) -> None:
        """SIGKILL kcp (and its embedded etcd)."""
        self.serving.clear()
        await self.process.kill()

    async def start(self) -> float:
        """Run kcp again on its data; the seconds until it was ready."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        await self.process.start()
        await self.process.wait_ready(timeout=KCP_READY_WITHOUT)
        self.restarts.append(loop.time() - began)
        self.serving.set()
        return self.restarts[-1]

    def slice_url(self, base: str, cluster: str = "*", *, name: str = SLICE) -> str:
        """The URL of slice ``name`` of the vwserver at ``base``, for one logical cluster."""
        provider = self.world.provider.cluster
        return f"{base}/services/filtered-apiexport/{provider}/{name}/clusters/{cluster}"

    def vwserver_config(
        self,
        *,
        external_url: str | None = None,
        lease: Mapping[str, Any] | None = None,
        resync: float = 30.0,
    ) -> dict[str, Any]:
        """vwserver's config in kcp mode through the relay: the slice ``prod`` from kcp (read
        through the shared watch cache, on by default), and ``prod-direct`` (static,
        ``cache: false``: every read passed to kcp)."""
        controller: dict[str, Any] = {"export": {"path": self.api.path}, "resyncSeconds": resync}
        if lease is not None:
            controller["lease"] = dict(lease)
        provider = self.world.provider.cluster
        config: dict[str, Any] = {
            "upstream": {"server": self.relay_url, "caFile": str(self.kcp.ca_file), "token": TOKEN},
            "controller": controller,
            "slices": [
                {
                    "cluster": provider,
                    "name": DIRECT_SLICE,
                    "export": {"cluster": provider, "name": self.world.export_name},
                    "selector": SELECTOR,
                    "cache": False,
                }
            ],
            "logFormat": "json",
            "shutdownGracePeriodSeconds": 2,
        }
        if external_url is not None:
            config["externalURL"] = external_url
        return config

    async def widget_lists(self) -> float:
        """LISTs of widgets across logical clusters (what a virtual workspace's ``clusters/*``
        LIST is) kcp answered since it started, from its ``/metrics``."""
        async with (
            self.kcp.http_session(timeout=10) as session,
            session.get(f"{self.kcp.url}/metrics") as resp,
        ):
            assert resp.status == 200, f"kcp /metrics: {resp.status}"
            samples = parse_metrics(await resp.text())
        return metric_sum(
            samples, "apiserver_request_total", resource="widgets", verb="LIST", scope="cluster"
        )

    async def widget_lists_per_vw_list(self) -> float:
        """How much :meth:`widget_lists` grows with one LIST through the export's virtual
        workspace (kcp counts such a LIST in its virtual-workspace server and again in the
        shard it is served from), measured once: a LIST with ``limit=1``."""
        before = await self.widget_lists()
        url = f"{self.world.vw_url}/clusters/*/apis/example.io/v1alpha1/widgets"
        async with (
            self.kcp.http_session(timeout=10) as session,
            session.get(url, params={"limit": "1"}) as resp,
        ):
            assert resp.status == 200, await resp.text()
        return await self.widget_lists() - before

    async def slice_status(self, name: str = SLICE) -> dict[str, Any]:
        provider = self.world.provider
        status: dict[str, Any] = (await get_json(self.kcp, provider.url, KIND, name)).get(
            "status"
        ) or {}
        return status


@contextlib.asynccontextmanager
async def chaos_kcp(*, binary: Path, root: Path) -> AsyncIterator[ChaosKcp]:
    """A new kcp on ``root``, bootstrapped with the demo world, vwserver's API bound in the
    provider and the slice ``prod`` created; stopped (and its relay closed) on exit."""
    users = root / "users.csv"
    users.write_text(f'{TOKEN},{USER},uid-{USER},"{",".join(GROUPS)}"\n')
    async with Relay(0, forwarding=True) as relay:
        process = KcpProcess(
            binary=binary,
            root_dir=root / "kcp",
            remove_root_dir=False,
            token_auth_file=users,
            extra_args=[f"--shard-virtual-workspace-url=https://127.0.0.1:{relay.port}"],
        )
        relay.target = process.secure_port
        try:
            await process.start()
            await process.wait_ready(timeout=KCP_READY_WITHOUT)
            kubeconfig = root / "chaos.kubeconfig"
            _write_static_kubeconfig(process.kubeconfig, kubeconfig)
            kcp = KcpInstance.from_kubeconfig(
                kubeconfig, workdir=root, context="base", process=process
            )
            world = await bootstrap(kcp, users_file=None)
            api = await install_api(kcp, workspace=API_WORKSPACE)
            await bind_api(kcp, world.provider, api=api)
            manifest = slice_manifest(
                SLICE,
                export_path=world.provider.path,
                export_name=world.export_name,
                selector=SELECTOR,
            )
            await kcp.kubectl("apply", "-f", "-", server=world.provider.url, input=manifest)
            bed = ChaosKcp(process=process, relay=relay, kcp=kcp, world=world, api=api)
            bed.serving.set()
            yield bed
        finally:
            await process.stop(grace=5)


def _write_static_kubeconfig(admin: Path, path: Path) -> None:
    """kcp's admin kubeconfig (its server and CA) with the static user as context ``base``."""
    config = yaml.safe_load(admin.read_text())
    ctx = next(c["context"] for c in config["contexts"] if c["name"] == "base")
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == ctx["cluster"])
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "base",
        "contexts": [{"name": "base", "context": {"cluster": "kcp", "user": USER}}],
        "clusters": [{"name": "kcp", "cluster": cluster}],
        "users": [{"name": USER, "user": {"token": TOKEN}}],
    }
    path.write_text(yaml.safe_dump(doc))


# --------------------------------------------------------------------------------------------
# vwserver processes


class VwServer:
    """``vwserver serve`` (plain HTTP on loopback) as a process a test kills and starts again
    on the same port; its log (every run's) goes to ``<workdir>/<name>.log``."""

    def __init__(
        self, name: str, *, workdir: Path, config: Mapping[str, Any], reaper: Reaper
    ) -> None:
        self.name = name
        self.port, self.health_port = free_ports(2)
        self.config = {
            "externalURL": self.base,
            **config,
            "listen": {"host": "127.0.0.1", "port": self.port},
            "health": {"host": "127.0.0.1", "port": self.health_port},
            "insecureServing": True,
        }
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_file = workdir / f"{name}.yaml"
        self.config_file.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.log_file = workdir / f"{name}.log"
        self._reaper = reaper
        self._process: asyncio.subprocess.Process | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def start(self, *, ready_within: float = 60.0) -> None:
        """Start it and wait until ``/readyz`` answers 200."""
        assert not self.running, f"{self.name} runs already"
        with self.log_file.open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "vwserver.cli", "serve", "--config", str(self.config_file),
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, cwd=REPO_ROOT,
            )  # fmt: skip
        self._reaper.add(process)
        self._process = process

        async def ready() -> bool | None:
            if self._process is not None and self._process.returncode is not None:
                raise AssertionError(
                    f"{self.name} exited with code {self._process.returncode}\n{self.log_tail()}"
                )
            status, _ = await self.get("/readyz")
            return True if status == 200 else None

        try:
            await poll(f"{self.name} /readyz", ready, within=ready_within, interval=0.1)
        except Exception as e:
            raise AssertionError(f"{e}\n{self.log_tail()}") from e

    async def kill(self) -> None:
        """SIGKILL: no shutdown, no lease release, open connections reset."""
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGKILL)
            await asyncio.wait_for(process.wait(), 10)

    async def stop(self) -> None:
        """SIGTERM (a graceful shutdown), SIGKILL after 10 s."""
        process, self._process = self._process, None
        if process is not None:
            await stop_process(process)

    async def get(self, path: str, *, health: bool = False) -> tuple[int, str]:
        """Status and text of an unauthenticated GET (health, metrics; ``health``: on the health
        listener, which alone serves ``/debug/cache``); 0 when nobody answers."""
        base = f"http://127.0.0.1:{self.health_port}" if health else self.base
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
                session.get(base + path) as resp,
            ):
                return resp.status, await resp.text()
        except (aiohttp.ClientError, TimeoutError):
            return 0, ""

    async def metrics(self) -> Samples:
        """Its ``/metrics`` now."""
        status, text = await self.get("/metrics")
        assert status == 200, f"{self.name} /metrics: {status}"
        return parse_metrics(text)

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_file.read_text(errors="replace").splitlines()[-lines:]
        return f"--- last lines of {self.log_file} ---\n" + "\n".join(text)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""Prometheus samples: (name, sorted labels) -> value."""


def parse_metrics(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric_sum(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        value
        for (sample, sample_labels), value in samples.items()
        if sample == name and labels.items() <= dict(sample_labels).items()
    )


async def wait_served(bed: ChaosKcp, server: VwServer, *, within: float = 60.0) -> None:
    """Until the slice ``prod`` is Ready with ``server``'s endpoint and both slices answer a
    LIST through ``server``."""
    prefix = server.config["externalURL"]

    async def ours() -> bool | None:
        status = await bed.slice_status()
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        urls = [e.get("url", "") for e in status.get("endpoints") or []]
        ready = conditions.get("Ready") == "True" and any(u.startswith(prefix) for u in urls)
        return True if ready else None

    await poll(f"slice {SLICE} Ready at {prefix}", ours, within=within)
    async with bed.kcp.http_session(timeout=10) as session:
        for name in (SLICE, DIRECT_SLICE):
            url = bed.slice_url(server.base, name=name) + "/apis/example.io/v1alpha1/widgets"

            async def lists(url: str = url) -> bool | None:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    # resourceVersion=0: the cache answers it (once synced) without asking kcp
                    params = {"limit": "1", "resourceVersion": "0"}
                    async with session.get(url, params=params) as resp:
                        return True if resp.status == 200 else None
                return None

            await poll(f"a LIST through {url}", lists, within=within)
