"""Client configuration through kubernetes-asyncio (vwserver.k8s.kubeconfig): kubeconfig
contexts with every credential kind, exec plugins re-run before expiry, the in-cluster
ServiceAccount with its token re-read on rotation, and errors that name the problem."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import ssl
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from vwserver.errors import ConfigError
from vwserver.k8s.kubeconfig import (
    ClientAuth,
    PluginToken,
    ServiceAccountToken,
    load_in_cluster,
    load_kubeconfig,
)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(path: Path, user: dict[str, Any], **cluster: Any) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {"server": "https://kcp:6443/clusters/root/", **cluster},
                    }
                ],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    return path


PLUGIN = """\
import datetime, json, pathlib, sys
runs = pathlib.Path(sys.argv[1])
n = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(n))
status = {"token": f"token-{n}"}
if sys.argv[2] != "none":
    expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=float(sys.argv[2]))
    status["expirationTimestamp"] = expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": status}))
"""


def exec_plugin(tmp_path: Path, *, expires_in: float | None) -> Path:
    """An exec credential plugin printing ``token-<n>`` (n counts its runs in ``runs``) and,
    unless ``expires_in`` is None, an expirationTimestamp that many seconds from now."""
    script = tmp_path / "get-token"
    script.write_text(
        f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'plugin.py'} {tmp_path / 'runs'} "
        f"{'none' if expires_in is None else expires_in}\n"
    )
    (tmp_path / "plugin.py").write_text(PLUGIN)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


async def eventually(probe: Callable[[], bool], *, within: float = 10) -> None:
    for _ in range(int(within / 0.05)):
        if probe():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


def exec_user(script: Path) -> dict[str, Any]:
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": str(script),
            "args": [],
            "interactiveMode": "Never",
        }
    }


async def test_static_credentials_and_files_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("alice")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    user = {
        "token": "t0k",
        "client-certificate-data": b64(cert.cert_chain_pems[0].bytes()),
        "client-key-data": b64(cert.private_key_pem.bytes()),
    }
    path = kubeconfig(tmp_path / "kc", user, **{"certificate-authority": "ca.crt"})
    auth = await load_kubeconfig(path)
    assert auth.server == "https://kcp:6443/clusters/root"
    assert auth.ca_pem == ca.cert_pem.bytes().decode()
    assert auth.client_cert_pem == cert.cert_chain_pems[0].bytes().decode()
    assert auth.client_key_pem == cert.private_key_pem.bytes().decode()
    assert auth.bearer_token() == "t0k"
    assert isinstance(auth.ssl_context(), ssl.SSLContext)


async def test_a_token_file_is_re_read_on_every_request(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("first\n")
    auth = await load_kubeconfig(kubeconfig(tmp_path / "kc", {"tokenFile": "token"}))
    assert auth.token_file == tmp_path / "token"
    assert auth.bearer_token() == "first"
    (tmp_path / "token").write_text("rotated\n")
    assert auth.bearer_token() == "rotated"


async def test_insecure_skip_tls_verify(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "kc", {"token": "x"}, **{"insecure-skip-tls-verify": True})
    auth = await load_kubeconfig(path)
    assert auth.insecure_skip_tls_verify and auth.ca_pem is None
    ctx = auth.ssl_context()
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode is ssl.CERT_NONE


async def test_an_exec_plugin_runs_at_load_and_again_before_its_token_expires(
    tmp_path: Path,
) -> None:
    # An expiry within the library's 5-minute safety margin counts as due at once.
    script = exec_plugin(tmp_path, expires_in=120)
    auth = await load_kubeconfig(kubeconfig(tmp_path / "kc", exec_user(script)))
    provider = auth.token_provider
    assert isinstance(provider, PluginToken)
    assert auth.bearer_token() == "token-1"
    provider.min_interval = 0
    assert auth.bearer_token() == "token-1"  # answered at once; the plugin re-runs behind it
    await eventually(lambda: auth.bearer_token() != "token-1")
    assert auth.bearer_token() == f"token-{(tmp_path / 'runs').read_text()}"
    assert int((tmp_path / "runs").read_text()) >= 2


async def test_an_exec_token_without_expiry_is_kept(tmp_path: Path) -> None:
    script = exec_plugin(tmp_path, expires_in=None)
    auth = await load_kubeconfig(kubeconfig(tmp_path / "kc", exec_user(script)))
    assert isinstance(auth.token_provider, PluginToken)
    auth.token_provider.min_interval = 0
    for _ in range(3):
        assert auth.bearer_token() == "token-1"
        await asyncio.sleep(0.05)
    assert (tmp_path / "runs").read_text().strip() == "1"


async def test_an_exec_token_far_from_expiry_is_kept(tmp_path: Path) -> None:
    script = exec_plugin(tmp_path, expires_in=3600)
    auth = await load_kubeconfig(kubeconfig(tmp_path / "kc", exec_user(script)))
    assert isinstance(auth.token_provider, PluginToken)
    auth.token_provider.min_interval = 0
    assert auth.bearer_token() == "token-1"
    await asyncio.sleep(0.1)
    assert auth.bearer_token() == "token-1"


async def test_a_failing_refresh_keeps_the_last_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    script = exec_plugin(tmp_path, expires_in=60)
    auth = await load_kubeconfig(kubeconfig(tmp_path / "kc", exec_user(script)))
    assert isinstance(auth.token_provider, PluginToken)
    script.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    auth.token_provider.min_interval = 0
    assert auth.bearer_token() == "token-1"
    await eventually(lambda: "refreshing the credential plugin's token failed" in caplog.text)
    assert auth.bearer_token() == "token-1"


@pytest.mark.parametrize(
    ("doc", "field", "problem"),
    [
        ("{", "kc", "cannot read kubeconfig"),
        ("[1]", "kc", "not a kubeconfig"),
        ("current-context: ''", "kc", "no context"),
    ],
)
async def test_unreadable_files(tmp_path: Path, doc: str, field: str, problem: str) -> None:
    (tmp_path / "kc").write_text(doc)
    with pytest.raises(ConfigError) as e:
        await load_kubeconfig(tmp_path / "kc")
    assert e.value.field.endswith(field)
    assert problem in e.value.problem


async def test_errors_name_the_problem(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "kc", {"token": "x"})
    with pytest.raises(ConfigError) as e:
        await load_kubeconfig(path, context="nope")
    assert e.value.field == f"{path}: contexts"
    broken = kubeconfig(tmp_path / "broken", {"exec": {"command": "x"}})
    with pytest.raises(ConfigError, match="apiVersion"):
        await load_kubeconfig(broken)
    failing = exec_plugin(tmp_path, expires_in=None)
    failing.write_text("#!/bin/sh\necho 'login required' >&2\nexit 1\n")
    with pytest.raises(ConfigError, match="login required"):
        await load_kubeconfig(kubeconfig(tmp_path / "failing", exec_user(failing)))
    basic = kubeconfig(tmp_path / "basic", {"username": "a", "password": "b"})
    with pytest.raises(ConfigError, match="username/password are not supported"):
        await load_kubeconfig(basic)
    missing_file = kubeconfig(tmp_path / "mf", {"token": "x"}, **{"certificate-authority": "no"})
    with pytest.raises(ConfigError):
        await load_kubeconfig(missing_file)


# ----------------------------------------------------------------------------- in-cluster


@pytest.fixture
def service_account(tmp_path: Path) -> Path:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    trustme.CA().cert_pem.write_to_path(str(sa / "ca.crt"))
    (sa / "token").write_text("sa-token-1")
    (sa / "namespace").write_text("vwserver")
    return sa


ENV = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def test_in_cluster_uses_the_service_account(service_account: Path) -> None:
    auth = load_in_cluster(service_account_dir=service_account, environ=ENV)
    assert auth.server == "https://10.0.0.1:443"
    assert auth.ca_pem == (service_account / "ca.crt").read_text()
    assert isinstance(auth.token_provider, ServiceAccountToken)
    assert auth.bearer_token() == "sa-token-1"
    v6 = load_in_cluster(
        service_account_dir=service_account,
        environ={"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"},
    )
    assert v6.server == "https://[fd00::1]:6443"


def test_in_cluster_token_is_re_read_when_its_period_is_up(
    service_account: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes_asyncio.config import incluster_config

    auth = load_in_cluster(service_account_dir=service_account, environ=ENV)
    (service_account / "token").write_text("sa-token-2")
    assert auth.bearer_token() == "sa-token-1"  # within the library's refresh period (1 min)
    monkeypatch.setattr(incluster_config, "TOKEN_REFRESH_PERIOD", datetime.timedelta(0))
    # The library re-reads once the period of the last read is up: the next read is immediate.
    auth = load_in_cluster(service_account_dir=service_account, environ=ENV)
    (service_account / "token").write_text("sa-token-3")
    assert auth.bearer_token() == "sa-token-3"
    (service_account / "token").write_text("")  # mid-rotation: the last good token stays
    assert auth.bearer_token() == "sa-token-3"


def test_in_cluster_errors(service_account: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_in_cluster(service_account_dir=service_account, environ={})
    assert e.value.field == "inCluster"
    assert "host/port" in e.value.problem
    with pytest.raises(ConfigError, match="token"):
        load_in_cluster(service_account_dir=service_account / "nope", environ=ENV)


def test_in_cluster_reads_the_process_environment_by_default(
    service_account: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    assert load_in_cluster(service_account_dir=service_account).server == "https://10.0.0.1:443"
    assert os.environ["KUBERNETES_SERVICE_HOST"] == "10.0.0.1"


def test_client_auth_keeps_its_shape() -> None:
    class Fixed:
        def token(self) -> str | None:
            return "from-provider"

    auth = ClientAuth(server="http://x", token="static", token_provider=Fixed())
    assert auth.bearer_token() == "from-provider"
    assert auth.ssl_context() is False
    assert json.dumps(ClientAuth(server="http://x", token="t").bearer_token()) == '"t"'
