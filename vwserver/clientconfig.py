"""``vwserver kubeconfig``: a kubeconfig for one slice endpoint, with the caller's credentials.

Why a command: a slice's URL (``status.endpoints[].url`` of a FilteredAPIExportEndpointSlice) is
used exactly like an APIExport virtual workspace, by people and controllers that already have a
kubeconfig for kcp. What they need is that kubeconfig with a different server —
``<endpoint>/clusters/<cluster id | *>``, where the ``/clusters/`` segment is easy to get wrong —
and vwserver's serving CA instead of kcp's. Copying tokens and certificates between files by hand
is error-prone, so this command derives the new file from the source context.

What the output looks like: one cluster, one user, one context, all with the same name. CAs and
client certificates are embedded (``*-data``, as ``kubectl config view --flatten`` does), so the
file works wherever it is copied; a ``tokenFile`` stays a reference (made absolute), so a rotated
token keeps working, and so does an exec credential plugin (its stanza is copied, a relative
command path made absolute). Contexts whose credentials cannot be written down (an
auth-provider) are refused. The file is written with mode 0600 because it holds credentials.
The source kubeconfig is read with kubernetes-asyncio (:mod:`vwserver.k8s.kubeconfig`).

The functions above the "I/O" marker are pure, so the construction is unit-tested without a
server; :func:`run` and its helpers below it read files, ask kcp and write the result.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import ssl
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO, TypeVar
from urllib.parse import urlsplit

import yaml

from vwserver.config.base import LOGICAL_CLUSTER_RE, OBJECT_NAME_RE, WORKSPACE_RE
from vwserver.errors import (
    ApiError,
    ApiForbidden,
    ApiUnauthorized,
    ConfigError,
    UpstreamUnavailable,
)
from vwserver.files import write_private
from vwserver.k8s import kcp
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kcp import SLICE_ENDPOINT_PREFIX, SLICES
from vwserver.k8s.kubeconfig import ClientAuth, PluginToken, load_kubeconfig

FETCH_TIMEOUT = 30.0

_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)


def add_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    """Register ``vwserver kubeconfig`` on the CLI's subcommands."""
    p = sub.add_parser(
        "kubeconfig",
        help="write a kubeconfig for a slice endpoint, with credentials of a kcp kubeconfig",
        description=(
            "Write a kubeconfig whose server is <endpoint>/clusters/<cluster>, with the "
            "credentials of a source kubeconfig context (token, token file, client certificate)."
        ),
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--endpoint", metavar="URL", help="a slice's status.endpoints[].url")
    where.add_argument(
        "--slice",
        metavar="NAME",
        help="read status.endpoints[0].url of this FilteredAPIExportEndpointSlice from kcp",
    )
    p.add_argument(
        "--workspace",
        metavar="PATH",
        help="workspace of --slice (path or logical-cluster ID; default: the source server's)",
    )
    p.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="source kubeconfig (default: $KUBECONFIG, else ~/.kube/config)",
    )
    p.add_argument("--context", help="context of the source kubeconfig (default: current)")
    p.add_argument(
        "--cluster",
        default="*",
        metavar="ID|*",
        help="logical-cluster ID of one consumer workspace, or * for all (default: *)",
    )
    p.add_argument(
        "--certificate-authority",
        type=Path,
        metavar="FILE",
        help="vwserver's serving CA (PEM); default: the source cluster's CA",
    )
    p.add_argument("--name", help="name of the cluster, user and context written")
    p.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="write here (mode 0600), not stdout"
    )


# --------------------------------------------------------------------------------------------
# Pure parts


def cluster_server(endpoint: str, *, cluster: str) -> str:
    """``<endpoint>/clusters/<cluster>``; raises :class:`ConfigError` naming the bad flag."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError("--endpoint", f"{endpoint!r} is not an http(s) URL")
    if parts.query or parts.fragment:
        raise ConfigError("--endpoint", f"{endpoint!r} must not have a query or fragment")
    if "/clusters/" in f"{parts.path}/":
        raise ConfigError(
            "--endpoint",
            f"{endpoint!r} already names a cluster; give the slice URL and use --cluster",
        )
    check_cluster(cluster)
    return kcp.clusters(endpoint, cluster)


def check_cluster(cluster: str) -> None:
    if cluster != "*" and not LOGICAL_CLUSTER_RE.match(cluster):
        raise ConfigError(
            "--cluster",
            f"{cluster!r} is not a logical-cluster ID or * (use the ID from "
            "`kubectl get workspace NAME -o jsonpath={.spec.cluster}`, not the workspace path)",
        )


def default_name(endpoint: str, *, cluster: str) -> str:
    """``<slice name>`` for ``*``, ``<slice name>-<cluster>`` otherwise (``vwserver`` when the
    URL is not a vwserver slice URL)."""
    path = urlsplit(endpoint).path
    _, found, rest = path.partition(SLICE_ENDPOINT_PREFIX + "/")
    segments = rest.split("/") if found else []
    base = segments[1] if len(segments) >= 2 and segments[1] else "vwserver"
    return base if cluster == "*" else f"{base}-{cluster}"


def build_kubeconfig(
    *, server: str, name: str, credentials: ClientAuth, ca_pem: str | None
) -> dict[str, Any]:
    """The kubeconfig document: ``server`` with ``credentials``' user and ``ca_pem``.

    ``credentials.server`` is ignored. With ``ca_pem`` None the source's own ``ca_pem`` /
    ``insecure_skip_tls_verify`` apply.
    """
    cluster: dict[str, Any] = {"server": server}
    if server.startswith("https://"):
        ca = ca_pem if ca_pem is not None else credentials.ca_pem
        if ca is not None:
            cluster["certificate-authority-data"] = _b64(ca)
        elif ca_pem is None and credentials.insecure_skip_tls_verify:
            cluster["insecure-skip-tls-verify"] = True
    user: dict[str, Any] = {}
    provider = credentials.token_provider
    if isinstance(provider, PluginToken) and provider.exec_config is not None:
        user["exec"] = _portable_exec(provider.exec_config, base=provider.base_dir)
    elif provider is not None:
        raise ConfigError(
            "--kubeconfig",
            "the context's credentials come from an auth-provider; they cannot be copied",
        )
    if credentials.token is not None:
        user["token"] = credentials.token
    if credentials.token_file is not None:
        user["tokenFile"] = str(credentials.token_file)
    if credentials.client_cert_pem is not None and credentials.client_key_pem is not None:
        user["client-certificate-data"] = _b64(credentials.client_cert_pem)
        user["client-key-data"] = _b64(credentials.client_key_pem)
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }


def _portable_exec(exec_config: Mapping[str, Any], *, base: Path) -> dict[str, Any]:
    """An exec stanza that works from anywhere: a command given as a relative path (one with a
    separator, which kubectl resolves against the kubeconfig's directory) made absolute."""
    stanza = dict(exec_config)
    command = str(stanza.get("command", ""))
    if os.sep in command and not os.path.isabs(command):
        stanza["command"] = str((base / command).resolve())
    return stanza


def slice_path(source_server: str, *, name: str, workspace: str | None) -> str:
    """The API path of a FilteredAPIExportEndpointSlice (cluster-scoped) in ``workspace``, or in
    the workspace the source server URL names (``.../clusters/<workspace>``)."""
    if not OBJECT_NAME_RE.match(name):
        raise ConfigError("--slice", f"{name!r} is not a valid object name")
    if workspace is None:
        _, found, rest = urlsplit(source_server).path.partition("/clusters/")
        workspace = rest.split("/", 1)[0] if found else None
        if not workspace:
            raise ConfigError(
                "--workspace",
                f"required: the source server {source_server} names no workspace (/clusters/…)",
            )
    if not WORKSPACE_RE.match(workspace):
        raise ConfigError("--workspace", f"{workspace!r} is not a workspace path or cluster ID")
    return SLICES.item(kcp.workspace(workspace), None, name)


def first_endpoint(obj: Mapping[str, Any], *, name: str) -> str:
    """``status.endpoints[0].url`` of a slice object, or a :class:`ConfigError` saying why not."""
    status = obj.get("status") or {}
    endpoints = status.get("endpoints") or []
    url = endpoints[0].get("url") if endpoints and isinstance(endpoints[0], dict) else None
    if not url:
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        why = f" (Ready={ready.get('status')}: {ready.get('message')})" if ready else ""
        raise ConfigError("--slice", f"{name} has no endpoint in status.endpoints yet{why}")
    return str(url)


def source_kubeconfig(flag: Path | None, *, environ: Mapping[str, str]) -> Path:
    """The source kubeconfig, resolved like kubectl does (one file only)."""
    if flag is not None:
        return flag
    env = environ.get("KUBECONFIG", "")
    paths = [p for p in env.split(os.pathsep) if p]
    if len(paths) > 1:
        raise ConfigError("--kubeconfig", "KUBECONFIG lists several files; name one")
    if paths:
        return Path(paths[0])
    return Path(environ.get("HOME", "~")).expanduser() / ".kube" / "config"


def _b64(pem: str) -> str:
    return base64.b64encode(pem.encode()).decode()


# --------------------------------------------------------------------------------------------
# I/O


def run(args: argparse.Namespace, *, stdout: TextIO | None = None) -> None:
    """Carry out ``vwserver kubeconfig``. Raises :class:`ConfigError` naming the flag."""
    slice_name: str | None = args.slice
    cluster: str = args.cluster
    # Flags that need no file or network are checked first.
    check_cluster(cluster)
    if args.workspace is not None and slice_name is None:
        raise ConfigError("--workspace", "only meaningful with --slice")
    endpoint: str | None = args.endpoint  # argparse: exactly one of --endpoint / --slice
    if endpoint is not None:
        cluster_server(endpoint, cluster=cluster)
    credentials, endpoint = asyncio.run(
        _source_and_endpoint(args, endpoint=endpoint, slice_name=slice_name)
    )
    ca_pem = _read_ca(args.certificate_authority) if args.certificate_authority else None
    server = cluster_server(endpoint, cluster=cluster)
    name: str = args.name or default_name(endpoint, cluster=cluster)
    doc = build_kubeconfig(server=server, name=name, credentials=credentials, ca_pem=ca_pem)
    text = yaml.safe_dump(doc, sort_keys=False)
    output: Path | None = args.output
    if output is None:
        (stdout or sys.stdout).write(text)
        return
    try:
        write_private(output, text)  # it holds the caller's credentials: 0600 from the start
    except OSError as e:
        raise ConfigError("--output", f"cannot write {output}: {e.strerror}") from e


async def _source_and_endpoint(
    args: argparse.Namespace, *, endpoint: str | None, slice_name: str | None
) -> tuple[ClientAuth, str]:
    """The source credentials (an exec plugin runs on this loop) and the endpoint URL."""
    credentials = await _load_source(args.kubeconfig, context=args.context)
    if endpoint is None:
        assert slice_name is not None  # argparse: exactly one of --endpoint / --slice
        path = slice_path(credentials.server, name=slice_name, workspace=args.workspace)
        endpoint = first_endpoint(await _fetch(credentials, path), name=slice_name)
    return credentials, endpoint


async def _load_source(flag: Path | None, *, context: str | None) -> ClientAuth:
    path = source_kubeconfig(flag, environ=os.environ).expanduser()
    if not path.is_file():
        raise ConfigError("--kubeconfig", f"{path} does not exist")
    try:
        return await load_kubeconfig(path.resolve(), context=context)
    except ConfigError as e:
        which = "--context" if context and e.field.endswith(": contexts") else "--kubeconfig"
        raise ConfigError(which, str(e)) from e
    except (OSError, KeyError, TypeError, ValueError, AttributeError) as e:
        # a file referenced from the kubeconfig is missing, or an entry lacks a required key
        raise ConfigError("--kubeconfig", f"{path}: unusable context: {e!r}") from e


def _read_ca(path: Path) -> str:
    try:
        pem = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("--certificate-authority", f"cannot read {path}: {e}") from e
    try:
        ssl.create_default_context(cadata=pem)
    except (ssl.SSLError, ValueError) as e:
        raise ConfigError(
            "--certificate-authority", f"{path} holds no PEM CA certificate: {e}"
        ) from e
    return pem


async def _fetch(credentials: ClientAuth, path: str) -> dict[str, Any]:
    try:
        async with KubeClient(auth=credentials, timeout=FETCH_TIMEOUT) as client:
            obj = await client.get(path)
    except ApiError as e:
        flag = "--kubeconfig" if isinstance(e, ApiUnauthorized | ApiForbidden) else "--slice"
        message = " ".join(e.message.split())  # one line, whatever the server sent
        raise ConfigError(flag, f"kcp answered {e.code} {e.reason}: {message}") from e
    except UpstreamUnavailable as e:
        # the client's message carries the exception's repr; the cause reads better on one line
        cause = e.__cause__
        detail = (str(cause) or type(cause).__name__) if cause is not None else str(e)
        raise ConfigError("--kubeconfig", f"cannot reach kcp: {detail}") from e
    if obj is None:
        _, _, workspace, *_, name = path.split("/")
        raise ConfigError("--slice", f"no FilteredAPIExportEndpointSlice {name!r} in {workspace}")
    return obj
