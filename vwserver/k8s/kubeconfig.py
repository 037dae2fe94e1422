"""Client configuration: where an API server is and how vwserver authenticates to it.

Library: **kubernetes-asyncio** (``kubernetes_asyncio.config``) reads the configuration — a
kubeconfig context (``KubeConfigLoader``: clusters, users, contexts, file references relative to
the kubeconfig, exec credential plugins, the ``oidc`` auth-provider) or the pod's ServiceAccount
(``InClusterConfigLoader``: ``KUBERNETES_SERVICE_HOST``/``_PORT``, the token and CA under
:data:`SERVICE_ACCOUNT_DIR`). Why: these are the ecosystem's formats, with rules (exec plugin
protocol, credential expiry, token rotation) that a reader of our own would get subtly wrong or
leave out, as ours did (it refused plugins and had no in-cluster configuration). Its cost: the
package imports its whole generated API client (~0.7 s, ~35 MB), so it is imported only when a
configuration is loaded, not by every module that names :class:`ClientAuth`.

What the rest of vwserver uses is :class:`ClientAuth`: server URL, CA, a bearer token (static,
a file re-read on every request, or a :class:`TokenProvider`) and a client certificate. The
library's own REST client is not used: the proxy's hot path and the control loops stay on raw
aiohttp (:mod:`vwserver.proxy.upstream`, :mod:`vwserver.k8s.client`), and ask
:meth:`ClientAuth.bearer_token` — synchronous, no I/O but a small file read — per request.

Token rotation:

* **ServiceAccount** (:func:`load_in_cluster`): the projected token file is re-read by the
  library's refresh hook once its minute is up (kubelet rotates the file in place).
* **exec plugin** (:func:`load_kubeconfig`; the library's loader runs on an event loop of its
  own, see :func:`_in_own_loop`): the plugin runs once at load; when the credential's
  ``expirationTimestamp`` comes within the library's safety margin (5 minutes), the next
  :meth:`~ClientAuth.bearer_token` starts a background re-run on the running event loop and
  keeps answering with the current token until the new one is there (one run at a time; a failed
  run is logged and retried after :data:`RETRY_INTERVAL`). A credential without expiry is kept
  for the process' lifetime, as client-go keeps it (client-go also re-runs on a 401; we do not).
* **oidc auth-provider**: the library refreshes an expired id-token with its refresh token;
  vwserver asks it every :data:`POLL_INTERVAL` while the token is in use.
* **tokenFile** of a kubeconfig user: re-read on every request, as before.

Not supported (refused or ignored as before): username/password (kcp has no basic auth),
``tls-server-name`` and ``proxy-url`` (ignored), client certificates from an exec plugin are read
once (not rotated).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import yaml

from vwserver.errors import ConfigError

if TYPE_CHECKING:
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config.kube_config import KubeConfigLoader

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where Kubernetes mounts a pod's ServiceAccount token (``token``) and cluster CA (``ca.crt``)."""

POLL_INTERVAL = 60.0
"""Seconds between asking an auth-provider whether its token needs refreshing (the library's own
``refresh_token`` loop uses the same interval)."""
RETRY_INTERVAL = 10.0
"""Seconds after a failed (or any) plugin run before the next may start."""


class TokenProvider(Protocol):
    """Where a bearer token comes from when it can change while vwserver runs."""

    def token(self) -> str | None:
        """The token to send now. Synchronous and cheap: called for every request."""
        ...


@dataclass(frozen=True, slots=True)
class ClientAuth:
    """Where to connect and how to authenticate, independent of where it was read from.

    The bearer token is, first match wins: ``token_provider``'s, ``token_file``'s (re-read each
    time), ``token``.
    """

    server: str
    ca_pem: str | None = None
    insecure_skip_tls_verify: bool = False
    token: str | None = None
    token_file: Path | None = None
    token_provider: TokenProvider | None = None
    client_cert_pem: str | None = None
    client_key_pem: str | None = None

    def bearer_token(self) -> str | None:
        """The token; a token file is re-read each call so rotated tokens are picked up."""
        if self.token_provider is not None:
            return self.token_provider.token()
        if self.token_file is not None:
            return self.token_file.read_text().strip()
        return self.token

    def ssl_context(self) -> ssl.SSLContext | bool:
        """An SSL context for aiohttp (False only for plain http or an explicit skip-verify)."""
        if self.server.startswith("http://"):
            return False
        ctx = (
            ssl.create_default_context(cadata=self.ca_pem)
            if self.ca_pem
            else (ssl.create_default_context())
        )
        if self.insecure_skip_tls_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.client_cert_pem and self.client_key_pem:
            # ssl can only load a key pair from files: write them to a private temp dir briefly.
            with tempfile.TemporaryDirectory() as tmp:
                cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
                cert.write_text(self.client_cert_pem)
                key.touch(mode=0o600)
                key.write_text(self.client_key_pem)
                ctx.load_cert_chain(cert, key)
        return ctx


# --------------------------------------------------------------------------------------------
# kubeconfig


async def load_kubeconfig(path: Path, *, context: str | None = None) -> ClientAuth:
    """``context`` (default: current-context) of the kubeconfig at ``path``, credentials
    included: an exec plugin has run once when this returns. Raises :class:`ConfigError`
    (field: the file; ``<file>: contexts`` when the context does not exist)."""
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config.config_exception import ConfigException
    from kubernetes_asyncio.config.kube_config import KubeConfigLoader

    field = str(path)
    try:
        doc = yaml.safe_load(await asyncio.to_thread(path.read_text)) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(field, f"cannot read kubeconfig: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(field, "not a kubeconfig (no mapping)")
    name = context or doc.get("current-context")
    if not name:
        raise ConfigError(field, "no context given and no current-context set")
    user = _user_of(doc, str(name), field=field)
    if "username" in user or "password" in user:
        raise ConfigError(f"{field}: users", "username/password are not supported")
    configuration = Configuration()
    try:
        loader = KubeConfigLoader(
            config_dict=doc, active_context=name, config_base_path=str(path.parent)
        )
        await _in_own_loop(loader, configuration)
    except (ConfigException, OSError, KeyError, TypeError, ValueError, ImportError) as e:
        raise ConfigError(field, f"unusable context {name!r}: {e}") from e
    settings = _cluster_settings(configuration, field=field)
    provider: TokenProvider | None = None
    token_file: Path | None = None
    token: str | None = None
    if "exec" in user or "auth-provider" in user:
        provider = PluginToken(
            loader,
            configuration,
            exec_config=dict(user["exec"]) if "exec" in user else None,
            base_dir=path.parent,
        )
    elif user.get("tokenFile") and not user.get("token"):
        # The library reads a token file once; rotated tokens must be picked up (re-read).
        token_file = path.parent / str(user["tokenFile"])
    else:
        token = _bearer(configuration)
    return ClientAuth(**settings, token=token, token_file=token_file, token_provider=provider)


async def _in_own_loop(loader: KubeConfigLoader, configuration: Configuration) -> None:
    """``loader.load_and_set(configuration)`` on an event loop of its own, in a daemon thread.

    Why: a plugin runs as a subprocess, and on Python 3.11 a task cancelled while asyncio sets
    up a subprocess can leave the loop unable to finish its shutdown (the transport's pipe
    connection never settles); a refresh in flight at SIGTERM would then hang ``serve`` and
    ``sync``. On its own loop the plugin run always completes (or fails) by itself; cancelling
    the caller only stops waiting for it. It also keeps the plugin away from uvloop.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def run() -> None:
        error: BaseException | None = None
        try:
            asyncio.run(loader.load_and_set(configuration))
        except BaseException as e:  # handed to the waiting task
            error = e
        with contextlib.suppress(RuntimeError):  # the caller's loop is gone: nobody waits
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=run, name="kubeconfig credentials", daemon=True).start()
    await done


def _user_of(doc: Mapping[str, Any], context: str, *, field: str) -> dict[str, Any]:
    """The ``user`` section of ``context``, checked enough for errors to name the problem."""
    ctx = _named(doc, "contexts", context, field=field).get("context") or {}
    user_name = ctx.get("user")
    if not user_name:
        return {}
    return dict(_named(doc, "users", str(user_name), field=field).get("user") or {})


def _named(doc: Mapping[str, Any], section: str, name: str, *, field: str) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            return dict(entry)
    raise ConfigError(f"{field}: {section}", f"no entry named {name!r}")


def _cluster_settings(configuration: Configuration, *, field: str) -> dict[str, Any]:
    """ClientAuth's server, CA and client certificate from what the library loaded (it hands
    out files: temporary ones for ``*-data``)."""
    try:
        return {
            "server": str(configuration.host).rstrip("/"),
            "ca_pem": _read(configuration.ssl_ca_cert),
            "insecure_skip_tls_verify": not configuration.verify_ssl,
            "client_cert_pem": _read(configuration.cert_file),
            "client_key_pem": _read(configuration.key_file),
        }
    except OSError as e:
        raise ConfigError(field, f"cannot read a file it names: {e}") from e


def _read(file: object) -> str | None:
    return Path(str(file)).read_text() if file else None


def _bearer(configuration: Configuration) -> str | None:
    """The token the library set (it stores ``Bearer <token>``)."""
    value = configuration.api_key.get("BearerToken")
    if not value:
        return None
    scheme, _, token = str(value).partition(" ")
    if scheme != "Bearer":
        raise ConfigError("kubeconfig", f"{scheme} credentials are not supported")
    return token.strip() or None


class PluginToken:
    """A token from a kubeconfig's exec or auth-provider plugin, run by kubernetes-asyncio's
    ``KubeConfigLoader``; refreshed in the background before it expires (module docstring)."""

    def __init__(
        self,
        loader: KubeConfigLoader,
        configuration: Configuration,
        *,
        exec_config: dict[str, Any] | None,
        base_dir: Path,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loader = loader
        self._configuration = configuration
        self._monotonic = monotonic
        self._token = _bearer(configuration)
        self._task: asyncio.Task[None] | None = None
        self._last_run = monotonic()
        self.exec_config = exec_config
        """The kubeconfig's ``exec`` stanza (None for an auth-provider), e.g. to copy it."""
        self.base_dir = base_dir
        """The kubeconfig's directory: what a relative ``command`` is relative to."""
        self.min_interval = RETRY_INTERVAL
        """Seconds between two plugin runs at least (tests lower it)."""

    def token(self) -> str | None:
        if self._task is None and self._due():
            with contextlib.suppress(RuntimeError):  # no running loop: nobody to run it
                self._task = asyncio.get_running_loop().create_task(
                    self._refresh_in_background(), name="credential plugin"
                )
        return self._token

    def _due(self) -> bool:
        if self._monotonic() - self._last_run < self.min_interval:
            return False
        if self.exec_config is None:  # auth-provider: the library knows whether it expired
            return self._monotonic() - self._last_run >= POLL_INTERVAL
        from kubernetes_asyncio.config.kube_config import EXPIRY_SKEW_PREVENTION_DELAY

        expiry: datetime.datetime | None = getattr(self._loader, "exec_plugin_expiry", None)
        if expiry is None:
            return False  # no expiry: kept, as client-go keeps it
        now = datetime.datetime.now(datetime.UTC)
        return expiry - EXPIRY_SKEW_PREVENTION_DELAY <= now

    async def refresh(self) -> None:
        """Ask the library for a current credential now (it re-runs the plugin if needed)."""
        self._last_run = self._monotonic()
        await _in_own_loop(self._loader, self._configuration)
        self._token = _bearer(self._configuration)

    async def _refresh_in_background(self) -> None:
        try:
            await self.refresh()
        except Exception as e:  # the old token stays; retried after min_interval
            log.warning("refreshing the credential plugin's token failed: %s", e)
        finally:
            self._task = None


# --------------------------------------------------------------------------------------------
# in-cluster


def load_in_cluster(
    *,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    environ: Mapping[str, str] | None = None,
) -> ClientAuth:
    """The pod's own API server and ServiceAccount: ``https://$KUBERNETES_SERVICE_HOST:
    $KUBERNETES_SERVICE_PORT``, ``<service_account_dir>/ca.crt`` and ``/token`` (re-read when
    the library's refresh period is up). ``service_account_dir`` and ``environ`` are for tests.
    Raises :class:`ConfigError` (field ``inCluster``) when any of it is missing."""
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config.config_exception import ConfigException
    from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader

    loader = InClusterConfigLoader(
        token_filename=str(service_account_dir / "token"),
        cert_filename=str(service_account_dir / "ca.crt"),
        environ=dict(environ) if environ is not None else os.environ,
    )
    configuration = Configuration()
    try:
        loader.load_and_set(configuration)
    except (ConfigException, OSError) as e:
        raise ConfigError(
            "inCluster", f"no in-cluster configuration ({service_account_dir}): {e}"
        ) from e
    settings = _cluster_settings(configuration, field="inCluster")
    return ClientAuth(**settings, token_provider=ServiceAccountToken(configuration))


class ServiceAccountToken:
    """The ServiceAccount token, re-read by kubernetes-asyncio's refresh hook (once a minute)."""

    def __init__(self, configuration: Configuration) -> None:
        self._configuration = configuration
        self._token = _bearer(configuration)

    def token(self) -> str | None:
        # The in-cluster loader's hook: a plain function that re-reads the file once its period
        # is up (other loaders' hooks may be coroutine functions; this one never is).
        hook = cast(
            "Callable[[Configuration], None] | None", self._configuration.refresh_api_key_hook
        )
        if hook is not None:
            try:
                hook(self._configuration)
                self._token = _bearer(self._configuration)
            except Exception as e:  # mid-rotation or unreadable: keep the last good token
                log.warning("re-reading the ServiceAccount token failed: %s", e)
        return self._token
