"""``vwserver kubeconfig``: building the kubeconfig (pure) and the command's one-line errors."""

from __future__ import annotations

import base64
import stat
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trustme
import yaml

from vwserver.cli import main
from vwserver.clientconfig import (
    build_kubeconfig,
    cluster_server,
    default_name,
    first_endpoint,
    slice_path,
    source_kubeconfig,
)
from vwserver.errors import ConfigError
from vwserver.k8s.kubeconfig import ClientAuth, PluginToken, ServiceAccountToken

SLICE = "https://vw.example.com/services/filtered-apiexport/2fx3m0rnxzbs8mq9/prod"
SLICE_API = "apis/sync.edge-connect.eu/v1alpha1/filteredapiexportendpointslices"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def unb64(text: str) -> str:
    return base64.b64decode(text).decode()


# ----------------------------------------------------------------------------- pure functions


@pytest.mark.parametrize(
    ("endpoint", "cluster", "server"),
    [
        (SLICE, "*", f"{SLICE}/clusters/*"),
        (SLICE + "/", "abc123", f"{SLICE}/clusters/abc123"),
        (f"{SLICE}/shards/0a1b2c3d4e", "root", f"{SLICE}/shards/0a1b2c3d4e/clusters/root"),
        ("http://127.0.0.1:8080/x", "*", "http://127.0.0.1:8080/x/clusters/*"),
    ],
)
def test_cluster_server(endpoint: str, cluster: str, server: str) -> None:
    assert cluster_server(endpoint, cluster=cluster) == server


@pytest.mark.parametrize(
    ("endpoint", "cluster", "flag", "problem"),
    [
        ("ftp://vw/x", "*", "--endpoint", "is not an http(s) URL"),
        ("vw.example.com/x", "*", "--endpoint", "is not an http(s) URL"),
        (SLICE + "?x=1", "*", "--endpoint", "query or fragment"),
        (SLICE + "/clusters/*", "*", "--endpoint", "already names a cluster"),
        (SLICE, "root:org", "--cluster", "not the workspace path"),
        (SLICE, "", "--cluster", "is not a logical-cluster ID"),
        (SLICE, "a/b", "--cluster", "is not a logical-cluster ID"),
    ],
)
def test_cluster_server_errors_name_the_flag(
    endpoint: str, cluster: str, flag: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as e:
        cluster_server(endpoint, cluster=cluster)
    assert e.value.field == flag
    assert problem in e.value.problem


def test_default_name() -> None:
    assert default_name(SLICE, cluster="*") == "prod"
    assert default_name(SLICE, cluster="abc") == "prod-abc"
    assert default_name(SLICE + "/shards/0a1b2c3d4e", cluster="*") == "prod"
    assert default_name("https://elsewhere/x", cluster="*") == "vwserver"


def test_token_and_source_ca_carried_over() -> None:
    source = ClientAuth(server="https://kcp:6443/clusters/root", ca_pem="KCP-CA", token="t0k")
    doc = build_kubeconfig(
        server=f"{SLICE}/clusters/*", name="prod", credentials=source, ca_pem=None
    )
    assert doc == {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "prod",
                "cluster": {
                    "server": f"{SLICE}/clusters/*",
                    "certificate-authority-data": b64("KCP-CA"),
                },
            }
        ],
        "users": [{"name": "prod", "user": {"token": "t0k"}}],
        "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "prod"}}],
        "current-context": "prod",
    }


def test_given_ca_replaces_the_source_ca_and_skip_verify() -> None:
    source = ClientAuth(
        server="https://kcp",
        ca_pem="KCP-CA",
        insecure_skip_tls_verify=True,
        token_file=Path("/var/run/token"),
        client_cert_pem="CERT",
        client_key_pem="KEY",
    )
    doc = build_kubeconfig(server=SLICE, name="n", credentials=source, ca_pem="VW-CA")
    assert doc["clusters"][0]["cluster"] == {
        "server": SLICE,
        "certificate-authority-data": b64("VW-CA"),
    }
    assert doc["users"][0]["user"] == {
        "tokenFile": "/var/run/token",
        "client-certificate-data": b64("CERT"),
        "client-key-data": b64("KEY"),
    }


def test_skip_verify_only_without_any_ca_and_no_ca_on_plain_http() -> None:
    source = ClientAuth(server="https://kcp", insecure_skip_tls_verify=True)
    doc = build_kubeconfig(server=SLICE, name="n", credentials=source, ca_pem=None)
    assert doc["clusters"][0]["cluster"] == {"server": SLICE, "insecure-skip-tls-verify": True}
    assert doc["users"][0]["user"] == {}
    source = ClientAuth(server="https://kcp", ca_pem="KCP-CA")
    doc = build_kubeconfig(server="http://vw/x", name="n", credentials=source, ca_pem="VW-CA")
    assert doc["clusters"][0]["cluster"] == {"server": "http://vw/x"}


def test_slice_path() -> None:
    assert slice_path("https://kcp:6443", name="prod", workspace="root:team") == (
        f"/clusters/root:team/{SLICE_API}/prod"
    )
    # without --workspace: the workspace of the source server URL
    assert slice_path("https://kcp:6443/clusters/root:org/", name="p", workspace=None) == (
        f"/clusters/root:org/{SLICE_API}/p"
    )
    for server, name, workspace, flag in [
        ("https://kcp:6443", "p", None, "--workspace"),
        ("https://kcp:6443", "p", "root/x", "--workspace"),
        ("https://kcp:6443", "p", "Root", "--workspace"),
        ("https://kcp:6443", "P_", "root", "--slice"),
    ]:
        with pytest.raises(ConfigError) as e:
            slice_path(server, name=name, workspace=workspace)
        assert e.value.field == flag


def test_first_endpoint() -> None:
    obj: dict[str, Any] = {"status": {"endpoints": [{"url": SLICE}, {"url": "https://other"}]}}
    assert first_endpoint(obj, name="prod") == SLICE
    not_ready = {
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False", "message": "APIExport root:x/y not found"}
            ]
        }
    }
    with pytest.raises(ConfigError) as e:
        first_endpoint(not_ready, name="prod")
    assert e.value.field == "--slice"
    assert "prod has no endpoint" in e.value.problem
    assert "APIExport root:x/y not found" in e.value.problem
    with pytest.raises(ConfigError):
        first_endpoint({}, name="prod")


def test_source_kubeconfig_like_kubectl() -> None:
    assert source_kubeconfig(Path("a"), environ={"KUBECONFIG": "b"}) == Path("a")
    assert source_kubeconfig(None, environ={"KUBECONFIG": "b"}) == Path("b")
    assert source_kubeconfig(None, environ={"HOME": "/h"}) == Path("/h/.kube/config")
    with pytest.raises(ConfigError) as e:
        source_kubeconfig(None, environ={"KUBECONFIG": "b:c"})
    assert e.value.field == "--kubeconfig"


# ----------------------------------------------------------------------------- the command


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A kcp kubeconfig with relative file references, as kcp and kubectl write them."""
    ca = trustme.CA()
    client = ca.issue_cert("alice")
    (tmp_path / "src").mkdir()
    ca.cert_pem.write_to_path(str(tmp_path / "src" / "kcp-ca.crt"))
    client.cert_chain_pems[0].write_to_path(str(tmp_path / "src" / "alice.crt"))
    client.private_key_pem.write_to_path(str(tmp_path / "src" / "alice.key"))
    (tmp_path / "src" / "token").write_text("file-token\n")
    path = tmp_path / "src" / "kcp.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "kcp",
                        "cluster": {
                            "server": "https://kcp:6443/clusters/root",
                            "certificate-authority": "kcp-ca.crt",
                        },
                    }
                ],
                "users": [
                    {
                        "name": "alice",
                        "user": {
                            "client-certificate": "alice.crt",
                            "client-key": "alice.key",
                            "tokenFile": "token",
                        },
                    },
                    {"name": "bob", "user": {"token": "bob-token"}},
                    {"name": "plugin", "user": {"exec": {"command": "get-token"}}},
                ],
                "contexts": [
                    {"name": "alice", "context": {"cluster": "kcp", "user": "alice"}},
                    {"name": "bob", "context": {"cluster": "kcp", "user": "bob"}},
                    {"name": "plugin", "context": {"cluster": "kcp", "user": "plugin"}},
                ],
                "current-context": "alice",
            }
        )
    )
    return path


def test_writes_a_private_file_with_the_source_credentials(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prod.kubeconfig"
    out.write_text("old")
    out.chmod(0o644)
    argv = ["kubeconfig", "--endpoint", SLICE, "--kubeconfig", str(source), "-o", str(out)]
    assert main([*argv, "--cluster", "abc123"]) == 0
    assert capsys.readouterr() == ("", "")
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    doc = yaml.safe_load(out.read_text())
    src = source.parent
    assert doc["current-context"] == "prod-abc123"
    cluster = doc["clusters"][0]["cluster"]
    assert cluster["server"] == f"{SLICE}/clusters/abc123"
    assert unb64(cluster["certificate-authority-data"]) == (src / "kcp-ca.crt").read_text()
    user = doc["users"][0]["user"]
    assert user["tokenFile"] == str((src / "token").resolve())  # a reference, made absolute
    assert unb64(user["client-certificate-data"]) == (src / "alice.crt").read_text()
    assert unb64(user["client-key-data"]) == (src / "alice.key").read_text()


def test_stdout_other_context_and_serving_ca(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serving_ca = trustme.CA()
    serving_ca.cert_pem.write_to_path(str(tmp_path / "vw-ca.crt"))
    argv = ["kubeconfig", "--endpoint", SLICE, "--kubeconfig", str(source), "--context", "bob"]
    assert main([*argv, "--certificate-authority", str(tmp_path / "vw-ca.crt")]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["users"] == [{"name": "prod", "user": {"token": "bob-token"}}]
    cluster = doc["clusters"][0]["cluster"]
    assert cluster["server"] == f"{SLICE}/clusters/*"
    assert unb64(cluster["certificate-authority-data"]) == serving_ca.cert_pem.bytes().decode()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "vwserver kubeconfig: one of the arguments --endpoint --slice is required"),
        (["--endpoint", SLICE, "--slice", "x"], "argument --slice: not allowed with argument"),
        (["--endpoint", "ftp://x"], "vwserver kubeconfig: --endpoint: 'ftp://x' is not an http"),
        (["--endpoint", SLICE, "--cluster", "root:a"], "vwserver kubeconfig: --cluster: 'root:a'"),
        (["--endpoint", SLICE, "--workspace", "root"], "--workspace: only meaningful with --slice"),
        (["--endpoint", SLICE, "--kubeconfig", "/nonexistent"], "--kubeconfig: /nonexistent does"),
        (["--endpoint", SLICE, "--context", "nope"], "--context: "),
        (["--endpoint", SLICE, "--context", "plugin"], "--kubeconfig: "),
        (["--endpoint", SLICE, "--certificate-authority", "/nonexistent"], "cannot read"),
        (["--endpoint", SLICE, "--certificate-authority", "{source}"], "no PEM CA certificate"),
        (["--endpoint", SLICE, "-o", "/nonexistent/dir/x"], "--output: cannot write"),
        (["--slice", "prod"], "--workspace: required: the source server"),
    ],
)
def test_errors_are_one_line_naming_the_flag_exit_2(
    args: list[str], message: str, source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source.write_text(source.read_text().replace("/clusters/root", ""))
    args = [a.replace("{source}", str(source)) for a in args]
    if "--kubeconfig" not in args:
        args += ["--kubeconfig", str(source)]
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main(["kubeconfig", *args]))
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert err.count("\n") == 1, err
    assert err.startswith("vwserver kubeconfig: ")
    assert message in err


def test_an_exec_plugin_is_copied_with_an_absolute_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Credentials from an exec plugin stay the plugin's: its stanza is copied, so kubectl runs
    it for the slice too (a relative command path made absolute)."""
    plugin = tmp_path / "get-token"
    plugin.write_text(
        f"#!{sys.executable}\nimport json\nprint(json.dumps({{'apiVersion': "
        "'client.authentication.k8s.io/v1', 'kind': 'ExecCredential', "
        "'status': {'token': 'from-plugin'}}))\n"
    )
    plugin.chmod(0o755)
    stanza = {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}
    source = tmp_path / "kcp.kubeconfig"
    source.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "k", "cluster": {"server": "https://kcp:6443"}}],
                "users": [{"name": "p", "user": {"exec": stanza}}],
                "contexts": [{"name": "p", "context": {"cluster": "k", "user": "p"}}],
                "current-context": "p",
            }
        )
    )
    assert main(["kubeconfig", "--endpoint", SLICE, "--kubeconfig", str(source)]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["users"] == [{"name": "prod", "user": {"exec": stanza}}]

    loaded = SimpleNamespace(api_key={"BearerToken": "Bearer t"})
    relative = PluginToken(
        SimpleNamespace(),  # type: ignore[arg-type]
        loaded,
        exec_config={**stanza, "command": "bin/get-token"},
        base_dir=tmp_path,
    )
    user = build_kubeconfig(
        server="https://vw",
        name="n",
        credentials=ClientAuth(server="https://kcp", token_provider=relative),
        ca_pem=None,
    )["users"][0]["user"]
    assert user == {"exec": {**stanza, "command": str(tmp_path / "bin" / "get-token")}}
    in_cluster = ClientAuth(server="https://kcp", token_provider=ServiceAccountToken(loaded))
    with pytest.raises(ConfigError, match="cannot be copied"):
        build_kubeconfig(server="https://vw", name="n", credentials=in_cluster, ca_pem=None)
