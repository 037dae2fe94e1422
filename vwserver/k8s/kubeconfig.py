"""Read the parts of a kubeconfig that a client needs: server, CA, credentials.

Only what vwserver (and its demo/test tooling) uses is supported: bearer tokens (inline or file),
client certificates (inline or file), a CA (inline or file) or ``insecure-skip-tls-verify``.
Exec and auth-provider plugins are refused with a clear error instead of being half-supported.
"""

from __future__ import annotations

import base64
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vwserver.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ClientAuth:
    """Where to connect and how to authenticate, independent of where it was read from."""

    server: str
    ca_pem: str | None = None
    insecure_skip_tls_verify: bool = False
    token: str | None = None
    token_file: Path | None = None
    client_cert_pem: str | None = None
    client_key_pem: str | None = None

    def bearer_token(self) -> str | None:
        """The token; a token file is re-read each call so rotated tokens are picked up."""
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


def load_kubeconfig(path: Path, *, context: str | None = None) -> ClientAuth:
    """Load ``context`` (default: current-context) of the kubeconfig at ``path``."""
    field = str(path)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(field, f"cannot read kubeconfig: {e}") from e
    base = path.parent
    name = context or doc.get("current-context")
    if not name:
        raise ConfigError(field, "no context given and no current-context set")
    ctx = _named(doc, "contexts", name, field=field)["context"]
    cluster = _named(doc, "clusters", ctx["cluster"], field=field)["cluster"]
    user = _named(doc, "users", ctx["user"], field=field)["user"] if ctx.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise ConfigError(
            f"{field}: users[{ctx['user']}]", "exec and auth-provider plugins are not supported"
        )
    return ClientAuth(
        server=str(cluster["server"]).rstrip("/"),
        ca_pem=_data_or_file(cluster, "certificate-authority", base=base),
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
        token=user.get("token"),
        token_file=base / user["tokenFile"] if user.get("tokenFile") else None,
        client_cert_pem=_data_or_file(user, "client-certificate", base=base),
        client_key_pem=_data_or_file(user, "client-key", base=base),
    )


def _named(doc: dict[str, Any], section: str, name: str, *, field: str) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if entry.get("name") == name:
            return dict(entry)
    raise ConfigError(f"{field}: {section}", f"no entry named {name!r}")


def _data_or_file(section: dict[str, Any], key: str, *, base: Path) -> str | None:
    data = section.get(f"{key}-data")
    if data:
        return base64.b64decode(str(data)).decode()
    file = section.get(key)
    if file:
        return (base / str(file)).read_text()
    return None
