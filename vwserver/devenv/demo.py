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
"Which exports a slice may serve" in the README). Everything it writes goes to ``.run/`` in the
repository (git-ignored). Ctrl-C (or SIGTERM) stops vwserver, then kcp, and removes kcp's
temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import signal
import socket
import sys
from pathlib import Path

import trustme
import yaml

from vwserver.devenv.bootstrap import DEMO_USERS_FILE, Bootstrap, Workspace, bootstrap
from vwserver.devenv.kcp import KcpError, KcpInstance, build_kcp, start_kcp
from vwserver.devenv.slices import bind_api, install_api, slice_manifest, wait_slice_ready

REPO = Path(__file__).resolve().parents[2]
SLICES = {"prod": {"env": "prod"}, "dev": {"env": "dev"}}


def _port(preferred: int) -> int:
    """``preferred`` if it is free on loopback, else any free port."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
        except OSError:
            s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_server_files(run_dir: Path, *, kcp: KcpInstance, api: Workspace, port: int) -> str:
    """TLS material and vwserver's config (kcp mode); returns vwserver's base URL."""
    run_dir.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(run_dir / "ca.crt"))
    cert.private_key_pem.write_to_path(str(run_dir / "tls.key"))
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


def write_kubeconfigs(run_dir: Path, endpoints: dict[str, str], *, token: str) -> None:
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
                        "certificate-authority": str(run_dir / "ca.crt"),
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
        (run_dir / f"{name}.kubeconfig").write_text(yaml.safe_dump(kubeconfig, sort_keys=False))


def instructions(
    run_dir: Path, *, kcp: KcpInstance, world: Bootstrap, base: str, endpoints: dict[str, str]
) -> str:
    rel = os.path.relpath(run_dir, Path.cwd())
    a = world.consumer("consumer-a")
    widget = next(w for w in world.widgets if w.cluster == a.cluster and w.labels["env"] == "prod")
    prod = endpoints["prod"]
    kc = shlex.quote(str(kcp.kubeconfig))
    admin = f"kubectl --kubeconfig {kc} --server {a.url}"
    provider = f"kubectl --kubeconfig {kc} --server {world.provider.url}"
    lines = [
        "",
        f"vwserver is serving 2 slices of {world.export_name} at {base} (TLS, CA {rel}/ca.crt)",
        "",
        f"# the slices, as the provider sees them in {world.provider.path}:",
        f"{provider} get filteredapiexportendpointslices -o wide",
        "",
        "# as alice, every prod widget in every consumer workspace (the wildcard endpoint):",
        f"kubectl --kubeconfig {rel}/prod.kubeconfig get widgets -A",
        "# alice was granted only the prod slice (manifests/rbac/example-slice-user.yaml): 403",
        f"kubectl --kubeconfig {rel}/dev.kubeconfig get widgets -A",
        "",
        f"# one consumer workspace ({a.path}, logical cluster {a.cluster}):",
        f"kubectl --kubeconfig {rel}/prod.kubeconfig --server '{prod}/clusters/{a.cluster}' "
        "get widgets -A",
        "",
        "# watch the prod slice, then move a widget out of it and back (second shell):",
        f"kubectl --kubeconfig {rel}/prod.kubeconfig get widgets -A -w --output-watch-events",
        f"{admin} label widget {widget.name} -n {widget.namespace} env=dev --overwrite",
        f"{admin} label widget {widget.name} -n {widget.namespace} env=prod --overwrite",
        "",
        "# the same with curl:",
        f"curl --cacert {rel}/ca.crt -H 'Authorization: Bearer {world.tokens['alice']}' "
        f"'{prod}/clusters/*/apis/{world.group}/{world.version}/{world.resource}'",
        "",
        "# alice cannot go around vwserver: kcp's own APIExport virtual workspace refuses her",
        "# (Forbidden: she has the prod slice, not apiexports/content on the export):",
        f"kubectl --kubeconfig {rel}/prod.kubeconfig --server '{world.vw_url}/clusters/*' "
        f"--certificate-authority {shlex.quote(str(kcp.ca_file))} get widgets -A",
        "",
        f"vwserver config: {rel}/vwserver.yaml   kcp admin kubeconfig: {kcp.kubeconfig}",
        "Ctrl-C stops vwserver and kcp.",
    ]
    return "\n".join(lines)


async def run(*, run_dir: Path, port: int) -> None:
    binary = await asyncio.to_thread(build_kcp)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with start_kcp(binary=binary, token_auth_file=DEMO_USERS_FILE) as kcp:
        print(f"kcp ready at {kcp.url} after {kcp.ready_seconds:.1f}s; bootstrapping the demo")
        world = await bootstrap(kcp)
        print(world.describe())
        api = await install_api(kcp, workspace="vwserver")
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
        await kcp.kubectl(
            "apply", "-f", str(REPO / "manifests" / "rbac" / "example-slice-user.yaml"),
            server=world.provider.url,
        )  # fmt: skip
        base = write_server_files(run_dir, kcp=kcp, api=api, port=port)
        server = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "vwserver.cli",
            "serve",
            "--config",
            str(run_dir / "vwserver.yaml"),
        )
        try:
            await _wait_ready(base, ca=run_dir / "ca.crt", server=server)
            endpoints = {}
            for name in SLICES:
                status = await wait_slice_ready(kcp, world.provider, name, within=30)
                endpoints[name] = status["endpoints"][0]["url"]
            write_kubeconfigs(run_dir, endpoints, token=world.tokens["alice"])
            print(
                instructions(run_dir, kcp=kcp, world=world, base=base, endpoints=endpoints),
                flush=True,
            )
            waiter = asyncio.ensure_future(server.wait())
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if waiter.done():
                raise KcpError(f"vwserver exited with code {server.returncode}")
        finally:
            if server.returncode is None:
                server.terminate()
                try:
                    await asyncio.wait_for(server.wait(), 10)
                except TimeoutError:
                    server.kill()
                    await server.wait()
        print("stopping kcp")


async def _wait_ready(base: str, *, ca: Path, server: asyncio.subprocess.Process) -> None:
    import ssl

    import aiohttp

    ctx = ssl.create_default_context(cafile=str(ca))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        for _ in range(100):
            if server.returncode is not None:
                raise KcpError(f"vwserver exited with code {server.returncode}")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{base}/readyz") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise KcpError("vwserver did not become ready within 10s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vwserver.devenv.demo", description=__doc__)
    parser.add_argument("--run-dir", type=Path, default=REPO / ".run")
    parser.add_argument("--port", type=int, default=8443, help="vwserver port (if free)")
    args = parser.parse_args(argv)
    try:
        asyncio.run(run(run_dir=args.run_dir, port=_port(args.port)))
    except KcpError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
