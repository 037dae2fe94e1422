"""The syncer's configuration file: the example loads, and every mistake names its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from vwserver.errors import ConfigError
from vwserver.syncer.config import load_syncer_config, parse_syncer_config

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "syncer.example.yaml"


@pytest.fixture
def base(tmp_path: Path) -> Path:
    for name in ("kcp.kubeconfig", "cluster.kubeconfig", "vw-ca.crt", "token", "tls.crt"):
        (tmp_path / name).write_text("{}")
    return tmp_path


def minimal(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "eu",
        "upstream": {"kubeconfig": "kcp.kubeconfig", "urls": ["https://vw/services/x/y"]},
        "downstream": {"kubeconfig": "cluster.kubeconfig"},
        "resources": [{"group": "g.io", "version": "v1", "resource": "things", "kind": "Thing"}],
    }
    raw.update(overrides)
    return raw


def test_example_is_valid(base: Path) -> None:
    config = parse_syncer_config(yaml.safe_load(EXAMPLE.read_text()), base_dir=base)
    assert config.finalizer == "sync.edge-connect.eu/syncer-eu"
    assert config.lease_name == "vwserver-syncer-eu"
    assert config.resources[0].status_exclude == ["mongoUri"]
    assert config.resources[0].target.kind == "MongoDBCommunity"


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_syncer_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_syncer_config(bad)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "EU"}, "$.name"),
        ({"name": "x" * 57}, "$.name"),
        ({"workers": "many"}, "$.workers"),
        ({"unknown": 1}, "$"),
        ({"upstream": {"kubeconfig": "missing"}}, "$.upstream.kubeconfig"),
        ({"upstream": {"kubeconfig": "kcp.kubeconfig"}}, "$.upstream"),
        (
            {"upstream": {"kubeconfig": "kcp.kubeconfig", "urls": ["ftp://x"]}},
            "$.upstream.urls[0]",
        ),
        (
            {"upstream": {"kubeconfig": "kcp.kubeconfig", "urls": ["https://vw/clusters/*"]}},
            "$.upstream.urls[0]",
        ),
        (
            {
                "upstream": {
                    "kubeconfig": "kcp.kubeconfig",
                    "endpointSlice": {"kind": "Other", "workspace": "root", "name": "n"},
                }
            },
            "$.upstream.endpointSlice.kind",
        ),
        (
            {
                "upstream": {
                    "kubeconfig": "kcp.kubeconfig",
                    "endpointSlice": {
                        "kind": "APIExportEndpointSlice",
                        "workspace": "Root:x",
                        "name": "n",
                    },
                }
            },
            "$.upstream.endpointSlice.workspace",
        ),
        ({"resources": []}, "$.resources"),
        (
            {"resources": [{"group": "g", "version": "v1", "resource": "Things", "kind": "T"}]},
            "$.resources[0].resource",
        ),
        (
            {
                "resources": [
                    {
                        "group": "g",
                        "version": "v1",
                        "resource": "t",
                        "kind": "T",
                        "statusExclude": ["a..b"],
                    }
                ]
            },
            "$.resources[0].statusExclude[0]",
        ),
        *(
            (
                {
                    "resources": [
                        {"group": "g", "version": "v1", "resource": "t", "kind": "T", **bad}
                    ]
                },
                f"$.resources[0].{field}",
            )
            for bad, field in (
                ({"metadataExclude": [""]}, "metadataExclude[0]"),
                ({"maxObjectBytes": 100}, "maxObjectBytes"),
                ({"maxObjectBytes": 4 * 1024 * 1024}, "maxObjectBytes"),
                ({"maxObjectBytes": 4096, "maxClusterBytes": 1024}, "maxClusterBytes"),
            )
        ),
        (
            {
                "resources": [
                    {"group": "g", "version": "v1", "resource": "t", "kind": "T"},
                    {"group": "g", "version": "v2", "resource": "t", "kind": "T"},
                ]
            },
            "$.resources[1]",
        ),
        ({"namespacePrefix": "Kcp-"}, "$.namespacePrefix"),
        ({"leaderElection": {"renewDeadlineSeconds": 20}}, "$.leaderElection"),
        ({"health": {"port": 70000}}, "$.health.port"),
        ({"logLevel": "loud"}, "$.logLevel"),
        ({"logFormat": "xml"}, "$.logFormat"),
        ({"downstream": {}}, "$.downstream"),
        ({"downstream": {"kubeconfig": "cluster.kubeconfig", "inCluster": True}}, "$.downstream"),
        ({"downstream": {"inCluster": True, "context": "c"}}, "$.downstream.context"),
        ({"downstream": {"inCluster": "yes"}}, "$.downstream.inCluster"),
        (
            {
                "upstream": {
                    "inCluster": True,
                    "kubeconfig": "kcp.kubeconfig",
                    "urls": ["https://v"],
                }
            },
            "$.upstream",
        ),
        ({"endpoints": {}}, "$.endpoints"),
        ({"endpoints": {"caFile": "missing.crt"}}, "$.endpoints.caFile"),
        ({"endpoints": {"tokenFile": "token", "inCluster": True}}, "$.endpoints"),
        ({"endpoints": {"tokenFile": "token", "kubeconfig": "kcp.kubeconfig"}}, "$.endpoints"),
        ({"endpoints": {"clientCertFile": "tls.crt"}}, "$.endpoints"),
        ({"endpoints": {"caFile": "vw-ca.crt", "context": "c"}}, "$.endpoints.context"),
        ({"endpoints": {"caFile": "vw-ca.crt", "server": "https://x"}}, "$.endpoints"),
    ],
)
def test_errors_name_the_field(base: Path, change: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_syncer_config(minimal(**change), base_dir=base)
    assert info.value.field == field, str(info.value)


def test_endpoints_section(base: Path) -> None:
    """Without ``endpoints`` the endpoint URLs use upstream's connection; with it, its own CA
    and (optionally) its own identity."""
    assert parse_syncer_config(minimal(), base_dir=base).endpoints is None
    ca_only = parse_syncer_config(minimal(endpoints={"caFile": "vw-ca.crt"}), base_dir=base)
    assert ca_only.endpoints is not None
    assert ca_only.endpoints.ca_file == "vw-ca.crt" and not ca_only.endpoints.own_credentials
    own = parse_syncer_config(
        minimal(endpoints={"tokenFile": "token", "caFile": "vw-ca.crt"}), base_dir=base
    )
    assert own.endpoints is not None and own.endpoints.own_credentials


def test_file_errors_show_the_absolute_path(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative path in a config file means "next to the file": the message says which file
    that was, whatever the working directory of whoever reads it."""
    monkeypatch.chdir(base.parent)
    with pytest.raises(ConfigError) as info:
        parse_syncer_config(
            minimal(upstream={"kubeconfig": "nope.kubeconfig", "urls": ["https://v/x"]}),
            base_dir=Path(base.name),
        )
    assert info.value.field == "$.upstream.kubeconfig"
    assert str(base / "nope.kubeconfig") in info.value.problem
    with pytest.raises(ConfigError) as info:
        load_syncer_config(Path(base.name) / "missing.yaml")
    assert info.value.field == str(base / "missing.yaml")


def test_cli_check_and_one_line_errors(base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vwserver.cli import main

    good = base / "syncer.yaml"
    good.write_text(EXAMPLE.read_text())
    assert main(["sync", "--config", str(good), "--check"]) == 0
    assert "ok (1 resource(s))" in capsys.readouterr().out
    bad = base / "bad.yaml"
    bad.write_text(yaml.safe_dump(minimal(workers=0)))
    assert main(["sync", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == "vwserver sync: invalid configuration: $.workers: must be at least 1\n"


def test_in_cluster_and_json_logs(base: Path) -> None:
    """A syncer running as a Deployment in its downstream cluster: the pod's ServiceAccount
    there (and JSON logs, as ``serve`` has them)."""
    config = parse_syncer_config(
        minimal(downstream={"inCluster": True}, logFormat="json"), base_dir=base
    )
    assert config.downstream.in_cluster and config.downstream.kubeconfig is None
    assert config.log_format == "json"
    assert parse_syncer_config(minimal(), base_dir=base).log_format == "text"


async def test_in_cluster_without_a_service_account_names_the_field(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vwserver.config.base import client_auth

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = parse_syncer_config(minimal(downstream={"inCluster": True}), base_dir=base)
    with pytest.raises(ConfigError) as info:
        await client_auth(
            config.downstream, field="$.downstream", base=base, service_account_dir=base
        )
    assert info.value.field == "$.downstream.inCluster"
    assert "KUBERNETES" in str(info.value) or "host/port" in str(info.value)


def test_cli_decommission_flags(base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vwserver.cli import main

    good = base / "syncer.yaml"
    good.write_text(EXAMPLE.read_text())
    assert main(["sync", "--config", str(good), "--delete-downstream"]) == 2
    assert capsys.readouterr().err == "vwserver sync: --delete-downstream needs --decommission\n"
    assert main(["sync", "--config", str(good), "--decommission", "--wait", "-1"]) == 2
    assert "--wait must not be negative" in capsys.readouterr().err


def test_sync_help_describes_the_command_and_points_to_the_example(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from vwserver.cli import main

    with pytest.raises(SystemExit) as info:
        main(["sync", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "downstream Kubernetes" in out and "--decommission" in out
    assert "config/syncer.example.yaml" in out
    assert EXAMPLE.is_file()
