"""What the configuration files of ``vwserver serve`` and ``vwserver sync`` have in common.

Both files (:mod:`vwserver.config`, :mod:`vwserver.syncer.config`) are read the same way:

1. :func:`read_yaml` — the document, or a :class:`ConfigError` naming the file;
2. :func:`convert` — msgspec Structs derived from :class:`Strict` (unknown keys are errors, keys
   are camelCase), a wrong type or an unknown key reported with the exact path of the field
   (``$.slices[1].selector``);
3. each file's own checks for what types cannot say, with the helpers here: files that must
   exist (:func:`require_file`, relative to the config file: :func:`resolve`), name shapes (the
   regexes, one definition each in :mod:`vwserver.names`), logging (:class:`CommandConfig`) and
   how an API server is reached (:class:`ClusterAccess`: a kubeconfig or ``inCluster: true``).

Every problem is one :class:`ConfigError` naming the field; nothing is half-applied.

The defaults below are the configuration's: the modules that use them (:mod:`vwserver.listener`,
:mod:`vwserver.auth`) import them from here, so the configuration depends on nothing above it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TypeVar

import msgspec
import yaml

from vwserver.errors import ConfigError
from vwserver.k8s.kubeconfig import (
    SERVICE_ACCOUNT_DIR,
    ClientAuth,
    load_in_cluster,
    load_kubeconfig,
)
from vwserver.logs import LogFormat
from vwserver.names import DNS_LABEL_RE, LOGICAL_CLUSTER_RE, OBJECT_NAME_RE, WORKSPACE_RE

__all__ = [
    "DNS_LABEL_RE",
    "KIND_RE",
    "LOGICAL_CLUSTER_RE",
    "OBJECT_NAME_RE",
    "WORKSPACE_RE",
    "ClusterAccess",
    "CommandConfig",
    "Strict",
    "absolute",
    "camel",
    "check_access",
    "check_logging",
    "client_auth",
    "convert",
    "read_yaml",
    "require_file",
    "resolve",
]

T = TypeVar("T")

KIND_RE = re.compile(r"^[A-Z][A-Za-z0-9]*$")
"""A kind (CamelCase)."""

LOG_LEVELS = ("debug", "info", "warning", "error")

# --------------------------------------------------------------------------------------------
# Defaults of ``vwserver serve`` that the modules using them share (see the module docstring).

DEFAULT_HEADER_TIMEOUT = 10.0
"""``connections.headerTimeoutSeconds``: a request's head must be complete this long after the
connection (or its first byte); the TLS handshake gets as long."""
DEFAULT_BODY_TIMEOUT = 60.0
"""``connections.bodyTimeoutSeconds``: a request body must be complete this long after its head."""
DEFAULT_IDLE_TIMEOUT = 90.0
"""``connections.idleTimeoutSeconds``: an idle keep-alive connection closes after this long."""
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 256
"""``connections.maxConnectionsPerClient`` (0: no limit)."""

DEFAULT_TOKEN_TTL = 10.0
"""``auth.cache.tokenTTLSeconds``: how long a token kcp accepted is remembered."""
DEFAULT_TOKEN_NEGATIVE_TTL = 5.0
"""``auth.cache.tokenNegativeTTLSeconds``: how long a token kcp rejected is remembered."""
DEFAULT_ALLOW_TTL = 120.0
"""``auth.cache.allowTTLSeconds``: how long a granted slice/verb is remembered."""
DEFAULT_DENY_TTL = 10.0
"""``auth.cache.denyTTLSeconds``: how long a denied slice/verb is remembered."""
DEFAULT_MAX_ENTRIES = 10_000
"""``auth.cache.maxEntries``: entries per cache."""


# --------------------------------------------------------------------------------------------
# Structs


class Strict(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """Base of every config Struct: unknown keys are errors (a typo must not be silently
    ignored), keys are camelCase."""


class CommandConfig(Strict):
    """Keys every command's file has."""

    log_level: str = "info"
    """``debug``, ``info``, ``warning`` or ``error``."""
    log_format: LogFormat = "text"
    """``json``: one JSON object per line, for log collectors (the Deployment's choice);
    ``text``: for people at a terminal."""


class ClusterAccess(Strict):
    """How an API server is reached: a kubeconfig (and context), or the pod's ServiceAccount
    (``inCluster: true``: ``KUBERNETES_SERVICE_HOST``/``_PORT``, token and CA under
    ``/var/run/secrets/kubernetes.io/serviceaccount``, the token re-read as it rotates)."""

    kubeconfig: str | None = None
    """A kubeconfig file (tokens, token files, client certificates, exec credential plugins)."""
    context: str | None = None
    """The kubeconfig's context to use (default: its current context)."""
    in_cluster: bool = False
    """``true``: the pod's ServiceAccount (token and CA under
    ``/var/run/secrets/kubernetes.io/serviceaccount``, the token re-read as kubelet rotates
    it)."""


# --------------------------------------------------------------------------------------------
# Reading


def read_yaml(path: Path) -> object:
    """A YAML file's document (``{}`` for an empty file); ConfigError names the file by its
    absolute path (what a relative path meant depends on a working directory the reader of the
    message does not see, e.g. a container's)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(str(absolute(path)), f"cannot read: {e.strerror}") from e
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(str(absolute(path)), f"not valid YAML: {e}") from e
    return raw if raw is not None else {}


def convert(raw: object, cls: type[T]) -> T:
    """Decode a config document into ``cls``; a type error or unknown key names its field."""
    try:
        return msgspec.convert(raw, cls)
    except msgspec.ValidationError as e:
        # msgspec says e.g. "Expected `int`, got `str` - at `$.listen.port`"; lead with the path.
        problem, _, where = str(e).rpartition(" - at ")
        if problem:
            raise ConfigError(where.strip("`"), problem) from e
        raise ConfigError("$", str(e)) from e  # a problem of the top-level mapping


# --------------------------------------------------------------------------------------------
# Checks


def camel(name: str) -> str:
    """A Struct field's name as the file spells it (``token_file`` → ``tokenFile``)."""
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def absolute(path: Path) -> Path:
    """``path`` made absolute and normalized, symlinks kept (a Secret mounted in a pod is a
    symlink into a timestamped directory; its mount path is the name people know)."""
    return Path(os.path.abspath(path))


def resolve(value: str, *, base: Path) -> Path:
    """Relative paths in a config file are relative to the file's directory; the result is
    absolute, so every message that names it says exactly which file was meant."""
    return absolute(base / value)


def require_file(value: str, *, field: str, base: Path) -> None:
    path = resolve(value, base=base)
    if not path.is_file():
        raise ConfigError(field, f"file {value!r} does not exist ({path})")


def check_logging(config: CommandConfig) -> None:
    if config.log_level.lower() not in LOG_LEVELS:
        raise ConfigError("$.logLevel", f"unknown level {config.log_level!r}")


def check_access(
    access: ClusterAccess, *, field: str, base: Path, others: tuple[str, ...] = ()
) -> None:
    """``access`` names exactly one way to the server — ``kubeconfig``, ``inCluster`` or one
    of ``others`` (set keys of a subclass, e.g. ``server``) — and its kubeconfig exists."""
    chosen = [
        name
        for name, set_ in (
            ("kubeconfig", access.kubeconfig is not None),
            ("inCluster", access.in_cluster),
            *((other, getattr(access, other) is not None) for other in others),
        )
        if set_
    ]
    if not chosen:
        ways = ", ".join(("kubeconfig", *others))
        raise ConfigError(field, f"set either {ways} or inCluster: true")
    if len(chosen) > 1:
        raise ConfigError(field, f"{' and '.join(chosen)} are mutually exclusive")
    if access.in_cluster and access.context is not None:
        raise ConfigError(f"{field}.context", "only meaningful with kubeconfig")
    if access.kubeconfig is not None:
        require_file(access.kubeconfig, field=f"{field}.kubeconfig", base=base)


async def client_auth(
    access: ClusterAccess,
    *,
    field: str,
    base: Path,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> ClientAuth:
    """The credentials ``access`` names (an exec plugin has run once when this returns);
    ``service_account_dir`` is for tests. Raises :class:`ConfigError`."""
    if access.in_cluster:
        try:
            return load_in_cluster(service_account_dir=service_account_dir)
        except ConfigError as e:
            raise ConfigError(f"{field}.inCluster", e.problem) from e
    assert access.kubeconfig is not None, "check_access() first"
    return await load_kubeconfig(resolve(access.kubeconfig, base=base), context=access.context)
