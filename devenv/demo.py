"""``make run``: a local kcp, the demo world, and vwserver in front of it, until Ctrl-C.

The point is to *see* vwserver work in one command, the way a provider uses it: vwserver's API
is installed in kcp (workspace ``root:vwserver``) and bound in the provider workspace, where two
FilteredAPIExportEndpointSlices are created with kubectl (``prod``: env=prod, ``dev``: env=dev).
vwserver runs as the real ``vwserver serve`` process in kcp mode (its embedded controller finds
the slices, serves them and writes their endpoint URLs into their status), over TLS with a
throwaway CA. The demo then writes a kubeconfig per slice endpoint (from ``status.endpoints``)
and prints copy-pasteable kubectl and curl lines.

The demo teaches the safe setup: alice, the slice user, is granted
``filteredapiexportendpointslices/content`` on the ``prod`` slice only
(``manifests/rbac/example-slice-user.yaml``), never ``apiexports/content`` on the export, so
kcp's own APIExport virtual workspace refuses her and vwserver's filter cannot be bypassed. The
slices live in the export's own workspace, so they need no grant from the export's owner (see
"Which exports a slice may serve" in docs/kcp-mode.md). Everything it writes goes to ``.run/``
in the repository (git-ignored). Ctrl-C (or SIGTERM) stops vwserver, then kcp, and removes kcp's
temporary directory.

What is printed is tested: :func:`demo_lines` is the one source of the printed commands (a pure
function of where things are), and ``tests/e2e/test_demo_lines_kcp.py`` runs each of them, as
printed, against a vwserver started by :func:`serve_demo` — the same code ``make run`` uses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import re
import shlex
import signal
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import trustme
import yaml

from devenv.bootstrap import (
    DEMO_USERS_FILE,
    Bootstrap,
    SampleWidget,
    Workspace,
    bootstrap,
    get_json,
    poll,
)
from devenv.kcp import KcpError, KcpInstance, build_kcp, start_kcp
from devenv.shards import (
    DEMO_PLACEMENT,
    bootstrap_placed,
    build_sharded_kcp,
    start_sharded_kcp,
)
from devenv.slices import KIND, bind_api, install_api, slice_manifest, wait_slice_ready
from vwserver.files import write_private
from vwserver.k8s.kcp import shard_id

REPO = Path(__file__).resolve().parents[1]
SLICES = {"prod": {"env": "prod"}, "dev": {"env": "dev"}}
#: Where the sharded demo (``make run SHARDS=2``) places the workspaces.
#: The workspace of vwserver's own APIExport in the demo.
API_WORKSPACE = "vwserver"
#: The slice user's grant (alice, slice ``prod``), applied in the provider workspace.
SLICE_USER_GRANT = REPO / "manifests" / "rbac" / "example-slice-user.yaml"

#: Bind attempts before the demo gives up (each after another process took the port).
_BIND_ATTEMPTS = 5
_ADDRESS_IN_USE = re.compile(rf"\[Errno {errno.EADDRINUSE}\]|address already in use", re.IGNORECASE)


# --------------------------------------------------------------------------------------------
# What the demo prints


@dataclass(frozen=True, kw_only=True)
class DemoLine:
    """One printed command: ``shows`` (printed as comments above it) says what it shows."""

    #: A stable name, so that the test can tell the lines apart (never printed).
    key: str
    shows: tuple[str, ...]
    #: The shell text exactly as printed; run from the directory the demo was started in.
    command: str


def demo_widget(world: Bootstrap) -> SampleWidget:
    """The widget the printed ``label`` lines move out of the prod slice and back."""
    a = world.consumer("consumer-a")
    return next(w for w in world.widgets if w.cluster == a.cluster and w.labels["env"] == "prod")


def shown_path(path: Path, cwd: Path) -> str:
    """``path`` as the printed lines name it: relative to the directory the demo runs in when it
    is inside it (``.run``), else absolute."""
    path, cwd = path.resolve(), cwd.resolve()
    return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)


def demo_lines(
    *, run_dir: str, kcp: KcpInstance, world: Bootstrap, endpoints: Mapping[str, str]
) -> list[DemoLine]:
    """The kubectl and curl lines the demo prints, in order (no I/O).

    ``run_dir``: the demo's directory as printed (:func:`shown_path`); ``endpoints``: each
    slice's ``status.endpoints[0].url``. Every line is run by ``tests/e2e/test_demo_lines_kcp.py``.
    """
    a = world.consumer("consumer-a")
    widget = demo_widget(world)
    prod = endpoints["prod"]
    kc = shlex.quote(str(kcp.kubeconfig))
    admin = f"kubectl --kubeconfig {kc} --server {a.url}"
    provider = f"kubectl --kubeconfig {kc} --server {world.provider.url}"
    alice = f"-H 'Authorization: Bearer {world.tokens['alice']}'"
    status = "-w '\\nHTTP %{http_code}\\n'"
    resource = f"apis/{world.group}/{world.version}/{world.resource}"
    relabel = f"{admin} label widget {widget.name} -n {widget.namespace}"

    def file(name: str) -> str:
        return shlex.quote(f"{run_dir}/{name}")

    return [
        DemoLine(
            key="slices",
            shows=(f"the slices, as the provider sees them in {world.provider.path}:",),
            command=f"{provider} get filteredapiexportendpointslices -o wide",
        ),
        DemoLine(
            key="prod-wildcard",
            shows=(
                "as alice, every prod widget in every consumer workspace (the wildcard endpoint):",
            ),
            command=f"kubectl --kubeconfig {file('prod.kubeconfig')} get widgets -A",
        ),
        DemoLine(
            key="dev-forbidden",
            shows=(
                "alice was granted only the prod slice (manifests/rbac/example-slice-user.yaml): "
                "Forbidden",
            ),
            command=f"kubectl --kubeconfig {file('dev.kubeconfig')} get widgets -A",
        ),
        DemoLine(
            key="prod-one-workspace",
            shows=(f"one consumer workspace ({a.path}, logical cluster {a.cluster}):",),
            command=f"kubectl --kubeconfig {file('prod.kubeconfig')} --server "
            f"'{prod}/clusters/{a.cluster}' get widgets -A",
        ),
        DemoLine(
            key="watch",
            shows=("watch the prod slice (until Ctrl-C), then move a widget out of it and back:",),
            command=f"kubectl --kubeconfig {file('prod.kubeconfig')} get widgets -A -w "
            "--output-watch-events",
        ),
        DemoLine(
            key="relabel-out",
            shows=(
                f"in a second shell: {widget.namespace}/{widget.name} of {a.path} leaves the "
                "slice (the watch shows DELETED) ...",
            ),
            command=f"{relabel} env=dev --overwrite",
        ),
        DemoLine(
            key="relabel-in",
            shows=("... and enters it again (ADDED):",),
            command=f"{relabel} env=prod --overwrite",
        ),
        DemoLine(
            key="curl",
            shows=("the same list with curl (only env=prod widgets, HTTP 200):",),
            command=f"curl -sS --cacert {file('ca.crt')} {alice} {status} "
            f"'{prod}/clusters/*/{resource}'",
        ),
        DemoLine(
            key="kcp-refuses-kubectl",
            shows=(
                "alice cannot go around vwserver: kcp's own APIExport virtual workspace refuses "
                "her",
                "(Forbidden: she has the prod slice, not apiexports/content on the export):",
            ),
            command=f"kubectl --kubeconfig {file('prod.kubeconfig')} --server "
            f"'{world.vw_url}/clusters/*' --certificate-authority "
            f"{shlex.quote(str(kcp.ca_file))} get widgets -A",
        ),
        DemoLine(
            key="kcp-refuses-curl",
            shows=("the same with curl (HTTP 403):",),
            command=f"curl -sS --cacert {shlex.quote(str(kcp.ca_file))} {alice} {status} "
            f"'{world.vw_url}/clusters/*/{resource}'",
        ),
    ]


def demo_text(
    *, run_dir: str, kcp: KcpInstance, world: Bootstrap, base: str, endpoints: Mapping[str, str]
) -> str:
    """Everything the demo prints once vwserver serves: :func:`demo_lines` with a frame."""
    out = [
        "",
        f"vwserver is serving {len(endpoints)} slices of {world.export_name} at {base} "
        f"(TLS, CA {run_dir}/ca.crt)",
    ]
    for line in demo_lines(run_dir=run_dir, kcp=kcp, world=world, endpoints=endpoints):
        out += ["", *(f"# {text}" for text in line.shows), line.command]
    out += [
        "",
        f"vwserver config: {run_dir}/vwserver.yaml   kcp admin kubeconfig: {kcp.kubeconfig}",
        "Ctrl-C stops vwserver and kcp.",
    ]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Files


def write_server_files(run_dir: Path, *, kcp: KcpInstance, api: Workspace, port: int) -> str:
    """TLS material and vwserver's config (kcp mode); returns vwserver's base URL."""
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(run_dir / "ca.crt"))
    write_private(run_dir / "tls.key", cert.private_key_pem.bytes())
    cert.cert_chain_pems[0].write_to_path(str(run_dir / "tls.crt"))
    base = f"https://127.0.0.1:{port}"
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "tls": {"certFile": "tls.crt", "keyFile": "tls.key"},
        "externalURL": base,
        # vwserver's own identity towards kcp: the demo uses kcp-admin.
        "upstream": {"kubeconfig": str(kcp.kubeconfig), "context": kcp.admin_context},
        # kcp mode: the slices come from kcp, where the demo created them with kubectl.
        "controller": {"export": {"path": api.path}, "resyncSeconds": 10},
    }
    (run_dir / "vwserver.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return base


def write_kubeconfigs(run_dir: Path, endpoints: Mapping[str, str], *, token: str) -> None:
    """One kubeconfig per slice, pointing at its endpoint's wildcard cluster, as alice."""
    for name, endpoint in endpoints.items():
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": f"vwserver-{name}",
                    "cluster": {
                        "server": f"{endpoint}/clusters/*",
                        "certificate-authority": str(run_dir.resolve() / "ca.crt"),
                    },
                }
            ],
            # alice's kcp token: vwserver asks kcp who she is and whether she may use the slice.
            "users": [{"name": "alice", "user": {"token": token}}],
            "contexts": [
                {"name": name, "context": {"cluster": f"vwserver-{name}", "user": "alice"}}
            ],
            "current-context": name,
        }
        # alice's token: readable by the demo's user only
        write_private(run_dir / f"{name}.kubeconfig", yaml.safe_dump(kubeconfig, sort_keys=False))


# --------------------------------------------------------------------------------------------
# vwserver in front of a bootstrapped kcp


@dataclass(frozen=True, kw_only=True)
class DemoServer:
    """A running demo vwserver: its base URL and each slice's endpoint URL."""

    base: str
    endpoints: Mapping[str, str]
    run_dir: Path
    process: asyncio.subprocess.Process


async def prepare_world(kcp: KcpInstance, world: Bootstrap, *, api_workspace: str) -> Workspace:
    """vwserver's API, bound in the provider; the slices; alice's grant. Idempotent."""
    api = await install_api(kcp, workspace=api_workspace)
    await bind_api(kcp, world.provider, api=api)
    for name, labels in SLICES.items():
        manifest = slice_manifest(
            name,
            export_path=world.provider.path,
            export_name=world.export_name,
            selector={"matchLabels": labels},
        )
        await kcp.kubectl("apply", "-f", "-", server=world.provider.url, input=manifest)
    # alice may use the slice "prod" — nothing else of the export through vwserver, and
    # nothing at all directly from kcp (no apiexports/content: config/demo/provider.yaml).
    await kcp.kubectl("apply", "-f", str(SLICE_USER_GRANT), server=world.provider.url)
    return api


@contextlib.asynccontextmanager
async def serve_demo(
    kcp: KcpInstance,
    world: Bootstrap,
    *,
    run_dir: Path,
    port: int,
    api_workspace: str = API_WORKSPACE,
    log: TextIO | None = None,
) -> AsyncIterator[DemoServer]:
    """The demo's vwserver (``vwserver serve`` in kcp mode, over TLS) on ``kcp``, with the slices
    Ready and a kubeconfig per slice in ``run_dir``; stopped when the block ends.

    ``port``: tried first if free (0: any); if another process takes it before vwserver binds
    it, vwserver is started again on another port. ``log``: where vwserver's log goes (default:
    our stderr).
    """
    api = await prepare_world(kcp, world, api_workspace=api_workspace)
    async with start_vwserver(run_dir, kcp=kcp, api=api, port=port, log=log) as (process, base):
        endpoints = {}
        for name in SLICES:
            endpoints[name] = await served_endpoint(kcp, world.provider, name, base=base)
        write_kubeconfigs(run_dir, endpoints, token=world.tokens["alice"])
        yield DemoServer(base=base, endpoints=endpoints, run_dir=run_dir, process=process)


async def served_endpoint(kcp: KcpInstance, ws: Workspace, name: str, *, base: str) -> str:
    """The endpoint URL of slice ``name`` in ``ws`` once it is Ready *and* served by the vwserver
    at ``base`` (a vwserver that lost its port to another process may have written its own URL
    first)."""
    await wait_slice_ready(kcp, ws, name, within=30)

    async def ours() -> str | None:
        status = (await get_json(kcp, ws.url, KIND, name)).get("status") or {}
        urls = [e.get("url", "") for e in status.get("endpoints") or []]
        return next((u for u in urls if u.startswith(f"{base}/")), None)

    return await poll(f"slice {name} served at {base}", ours, within=30)


def _port(preferred: int) -> int:
    """``preferred`` if it is free on loopback, else any free port (0: any)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
        except OSError:
            s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def start_vwserver(
    run_dir: Path, *, kcp: KcpInstance, api: Workspace, port: int, log: TextIO | None
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """A ready ``vwserver serve`` on a port it could bind; stopped on exit.

    A free port found here may be taken by another process before vwserver binds it. vwserver
    then exits at once naming EADDRINUSE on stderr, and is started again on a new port (new
    config, new certificate). Readiness is checked against this run's own fresh CA, so another
    server on the port can never pass for ours.
    """
    candidate = _port(port)
    for attempt in range(1, _BIND_ATTEMPTS + 1):
        base = write_server_files(run_dir, kcp=kcp, api=api, port=candidate)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vwserver.cli", "serve",
            "--config", str(run_dir / "vwserver.yaml"),
            stdin=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert process.stderr is not None
        in_use = asyncio.Event()
        relay = asyncio.create_task(_relay(process.stderr, log, in_use))
        try:
            try:
                await _wait_ready(base, ca=run_dir / "ca.crt", server=process)
            except _Exited:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(relay), 5)  # the rest of its stderr
                if not in_use.is_set() or attempt == _BIND_ATTEMPTS:
                    raise KcpError(f"vwserver exited with code {process.returncode}") from None
                taken, candidate = candidate, _port(0)
                print(f"port {taken} was taken; starting vwserver on {candidate}", file=sys.stderr)
                continue
            yield process, base
            return
        finally:
            await stop_process(process)
            with contextlib.suppress(TimeoutError):  # its last lines; cancelled after 5 s
                await asyncio.wait_for(relay, 5)
    raise AssertionError("unreachable")  # pragma: no cover


async def _relay(stream: asyncio.StreamReader, log: TextIO | None, in_use: asyncio.Event) -> None:
    """Copy vwserver's stderr to ``log`` (default: ours), noting an address already in use."""
    while line := await stream.readline():
        text = line.decode(errors="replace")
        if _ADDRESS_IN_USE.search(text):
            in_use.set()
        sink = log if log is not None else sys.stderr
        sink.write(text)
        sink.flush()


async def stop_process(process: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL after 10 s; reaped either way."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


class _Exited(KcpError):
    """vwserver exited before it was ready."""


async def _wait_ready(
    base: str, *, ca: Path, server: asyncio.subprocess.Process, within: float = 30.0
) -> None:
    ctx = ssl.create_default_context(cafile=str(ca))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=ctx), timeout=timeout
    ) as session:
        while loop.time() < deadline:
            if server.returncode is not None:
                raise _Exited(f"vwserver exited with code {server.returncode}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(f"{base}/readyz") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise KcpError(f"vwserver did not become ready within {within:.0f}s")


# --------------------------------------------------------------------------------------------
# make run


@contextlib.asynccontextmanager
async def demo_kcp(*, shards: int) -> AsyncIterator[tuple[KcpInstance, Bootstrap, list[str]]]:
    """The demo's kcp and world: one kcp (``shards=1``), or a sharded kcp (``shards=2``,
    :mod:`devenv.shards`) with the provider and consumer-a on the root shard and consumer-b on
    the second shard; the last item: lines that describe the kcp."""
    if shards == 1:
        binary = await asyncio.to_thread(build_kcp)
        async with start_kcp(binary=binary, token_auth_file=DEMO_USERS_FILE) as kcp:
            print(f"kcp ready at {kcp.url} after {kcp.ready_seconds:.1f}s; bootstrapping the demo")
            yield kcp, await bootstrap(kcp), []
        return
    if shards != 2:
        raise KcpError(f"the sharded demo has 2 shards, not {shards}")
    binaries = await asyncio.to_thread(build_sharded_kcp)
    async with start_sharded_kcp(binaries=binaries) as bed:
        print(
            f"sharded kcp ready after {bed.ready_seconds:.1f}s: front-proxy {bed.front.url}, "
            + ", ".join(f"shard {s.name} {s.url}" for s in bed.shards.values())
            + "; bootstrapping the demo"
        )
        world = await bootstrap_placed(bed)
        lines = [f"{name:<10} on shard {shard}" for name, shard in DEMO_PLACEMENT.items()]
        yield bed.front, world, lines


async def endpoint_lines(kcp: KcpInstance, world: Bootstrap) -> list[str]:
    """One line per endpoint URL of each demo slice (one per shard of the export), naming the
    shard of the export's VW URL it serves."""
    by_id = {shard_id(u): u for u in world.vw_urls}
    lines = []
    for name in SLICES:
        status = (await get_json(kcp, world.provider.url, KIND, name)).get("status") or {}
        for endpoint in status.get("endpoints") or []:
            url = str(endpoint.get("url") or "")
            _, found, sid = url.partition("/shards/")
            upstream = by_id.get(sid, "?") if found else world.vw_urls[0]
            lines.append(f"endpoint   {name}: {url}  (kcp VW {upstream})")
    return lines


async def run(*, run_dir: Path, port: int, shards: int = 1) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with demo_kcp(shards=shards) as (kcp, world, placement):
        print(world.describe())
        for line in placement:
            print(line)
        async with serve_demo(kcp, world, run_dir=run_dir, port=port) as server:
            text = demo_text(
                run_dir=shown_path(run_dir, Path.cwd()),
                kcp=kcp,
                world=world,
                base=server.base,
                endpoints=server.endpoints,
            )
            print(text, flush=True)
            if shards > 1:
                print("\n".join(await endpoint_lines(kcp, world)), flush=True)
            waiter = asyncio.ensure_future(server.process.wait())
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if waiter.done() and not stop.is_set():  # Ctrl-C reaches vwserver too
                raise KcpError(f"vwserver exited with code {server.process.returncode}")
        print("stopping kcp")


def story_main(
    story: Callable[..., Coroutine[Any, Any, None]],
    argv: list[str] | None,
    *,
    prog: str,
    description: str | None,
    run_dir: Path,
    port: int,
    shards_option: bool = False,
) -> int:
    """The command line of a development story (``make run``, ``make run-sync``): its run
    directory and vwserver's port (``shards_option``: and ``--shards``, the story takes a
    ``shards`` argument); a kcp failure is one line and exit code 1."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--run-dir", type=Path, default=run_dir)
    parser.add_argument("--port", type=int, default=port, help="vwserver port (if free)")
    if shards_option:
        parser.add_argument(
            "--shards", type=int, choices=(1, 2), default=1, help="2: a sharded kcp"
        )
    args = parser.parse_args(argv)
    extra = {"shards": args.shards} if shards_option else {}
    try:
        asyncio.run(story(run_dir=args.run_dir, port=args.port, **extra))
    except KcpError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    return story_main(
        run, argv, prog="python -m devenv.demo", description=__doc__, run_dir=REPO / ".run",
        port=8443, shards_option=True,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
