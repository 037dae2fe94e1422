"""Configuration validation: every bad field is named (vwserver.config, vwserver.cli)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from vwserver.cli import main
from vwserver.config import load_config
from vwserver.errors import ConfigError
from vwserver.holds import DEFAULT_HOLD_TIMEOUT_SECONDS
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.server import static_routes

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    (tmp_path / "kcp.kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def good() -> dict[str, Any]:
    return {
        "insecureServing": True,
        "upstream": {"kubeconfig": "kcp.kubeconfig"},
        "slices": [
            {
                "cluster": "abc123",
                "name": "prod",
                "export": {"cluster": "exp456", "name": "widgets.example.io"},
                "selector": {"matchLabels": {"env": "prod"}},
            }
        ],
    }


def test_good_config_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, good()))
    assert config.slices[0].name == "prod"
    assert config.listen.port == 8443


@pytest.mark.parametrize(
    ("mutate", "field", "problem"),
    [
        (lambda d: d["slices"][0].update(cluster="root:org"), "$.slices[0].cluster", "logical"),
        (lambda d: d["slices"][0].update(name="Bad_Name"), "$.slices[0].name", "valid"),
        (lambda d: d["slices"][0].update(selector={}), "$.slices[0].selector", "empty selector"),
        (
            lambda d: d["slices"][0].update(
                selector={"matchExpressions": [{"key": "a", "operator": "Foo"}]}
            ),
            "$.slices[0].selector.matchExpressions[0].operator",
            "unsupported operator",
        ),
        (
            lambda d: d["slices"][0].update(selector={"matchLabels": {"a": "x" * 64}}),
            "$.slices[0].selector.matchLabels",
            "63",
        ),
        (lambda d: d["slices"][0].pop("export"), "$.slices[0]", "export"),
        (lambda d: d.update(listen={"port": "http"}), "$.listen.port", "Expected `int`"),
        (lambda d: d.update(listen={"port": 70000}), "$.listen.port", "not a TCP port"),
        (lambda d: d.update(lisen={"port": 1}), "lisen", "unknown field"),
        (lambda d: d.pop("insecureServing"), "$.tls", "required"),
        (lambda d: d.update(upstream={}), "$.upstream", "either"),
        (
            lambda d: d.update(upstream={"kubeconfig": "kcp.kubeconfig", "inCluster": True}),
            "$.upstream",
            "mutually exclusive",
        ),
        (
            lambda d: d.update(upstream={"server": "https://kcp", "inCluster": True}),
            "$.upstream",
            "mutually exclusive",
        ),
        (
            lambda d: d.update(upstream={"inCluster": True, "context": "x"}),
            "$.upstream.context",
            "only meaningful with kubeconfig",
        ),
        (lambda d: d.update(upstream={"kubeconfig": "nope"}), "$.upstream.kubeconfig", "exist"),
        (lambda d: d["slices"].append(d["slices"][0]), "$.slices[1]", "duplicate"),
        (lambda d: d.update(auth={"mode": "none"}), "$.auth.mode", "Invalid enum value"),
        (
            lambda d: d.update(auth={"cache": {"allowTTLSeconds": -1}}),
            "$.auth.cache.allowTTLSeconds",
            "negative",
        ),
        (
            lambda d: d.update(auth={"cache": {"tokenNegativeTTLSeconds": "5s"}}),
            "$.auth.cache.tokenNegativeTTLSeconds",
            "Expected `float`",
        ),
        (
            lambda d: d.update(auth={"cache": {"maxEntries": 0}}),
            "$.auth.cache.maxEntries",
            "at least 1",
        ),
        (lambda d: d.update(auth={"cache": {"ttl": 1}}), "ttl", "unknown field"),
        (lambda d: d.update(logFormat="xml"), "$.logFormat", "Invalid enum value"),
        (lambda d: d.update(metrics={"path": "metrics"}), "$.metrics.path", "must be a path"),
        (
            lambda d: d.update(metrics={"path": "/services/filtered-apiexport/m"}),
            "$.metrics.path",
            "outside",
        ),
        (lambda d: d.update(metrics={"path": "/readyz"}), "$.metrics.path", "health endpoint"),
        (lambda d: d.update(metrics={"enable": False}), "enable", "unknown field"),
        (
            lambda d: d.update(shutdownGracePeriodSeconds=-1),
            "$.shutdownGracePeriodSeconds",
            "negative",
        ),
        (lambda d: d.update(shutdownDelaySeconds=-0.5), "$.shutdownDelaySeconds", "negative"),
    ],
)
def test_bad_fields_are_named(tmp_path: Path, mutate: Any, field: str, problem: str) -> None:
    doc = good()
    mutate(doc)
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, doc))
    assert field in str(info.value)
    assert problem.lower() in str(info.value).lower()


@pytest.mark.parametrize("value", [0, -5, 604801, float("inf"), float("nan"), None])
def test_holds_are_always_bounded(tmp_path: Path, value: float | None) -> None:
    """No hold timeout means the default bound; none, zero or beyond a week is refused (there
    is no unbounded hold)."""
    assert load_config(write(tmp_path, good())).slices[0].hold_timeout_seconds == 3600
    doc = good()
    doc["slices"][0]["holdTimeoutSeconds"] = value
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, doc))
    assert "holdTimeoutSeconds" in str(info.value)


def test_the_hold_timeout_reaches_the_route(tmp_path: Path) -> None:
    doc = good()
    doc["slices"][0]["holdTimeoutSeconds"] = 600
    config = load_config(write(tmp_path, doc))
    assert config.slices[0].hold_timeout_seconds == 600
    (route,) = static_routes(config, auth=ClientAuth(server="https://kcp:6443"))
    assert route.hold_timeout == 600
    (default,) = static_routes(
        load_config(write(tmp_path, good())), auth=ClientAuth(server="https://kcp:6443")
    )
    assert default.hold_timeout == DEFAULT_HOLD_TIMEOUT_SECONDS


def test_operations_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, good()))
    assert (config.metrics.enabled, config.metrics.path) == (True, "/metrics")
    assert config.log_format == "text"
    assert (config.shutdown_delay_seconds, config.shutdown_grace_period_seconds) == (0, 25)


def test_auth_defaults_to_delegated_with_short_caches(tmp_path: Path) -> None:
    auth = load_config(write(tmp_path, good())).auth
    assert auth.mode == "delegated"
    assert auth.cache.deny_ttl_seconds < auth.cache.allow_ttl_seconds
    assert 0 < auth.cache.token_negative_ttl_seconds <= auth.cache.token_ttl_seconds <= 60


def with_tls(tmp_path: Path, **tls: str) -> dict[str, Any]:
    for name in ("tls.crt", "tls.key", "clients-ca.crt"):
        (tmp_path / name).write_text("not parsed by the config loader")
    doc = good()
    doc.pop("insecureServing")
    doc["tls"] = {"certFile": "tls.crt", "keyFile": "tls.key", **tls}
    return doc


def test_client_ca_file_is_checked_and_excludes_passthrough(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, with_tls(tmp_path, clientCAFile="clients-ca.crt")))
    assert config.tls is not None
    assert config.tls.client_ca_file == "clients-ca.crt"
    with pytest.raises(ConfigError, match=r"^\$\.tls\.clientCAFile: file 'nope' does not exist"):
        load_config(write(tmp_path, with_tls(tmp_path, clientCAFile="nope")))
    doc = with_tls(tmp_path, clientCAFile="clients-ca.crt")
    doc["auth"] = {"mode": "passthrough"}
    with pytest.raises(ConfigError, match=r"^\$\.tls\.clientCAFile: .*passthrough"):
        load_config(write(tmp_path, doc))


def test_empty_selector_allowed_explicitly(tmp_path: Path) -> None:
    doc = good()
    doc["slices"][0].update(selector={}, allowEmptySelector=True)
    assert load_config(write(tmp_path, doc)).slices[0].allow_empty_selector


def test_cli_reports_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = good()
    doc["slices"][0]["cluster"] = "Not/Valid"
    assert main(["check-config", "--config", str(write(tmp_path, doc))]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vwserver: invalid configuration: $.slices[0].cluster")
    assert "\n" not in err


def test_cli_help_and_example_config() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "vwserver.cli", "--help"], capture_output=True, text=True, check=True
    )
    assert "serve" in out.stdout
    # The shipped example parses (its files do not exist here, so only the schema is checked).
    raw = yaml.safe_load((REPO / "config" / "example.yaml").read_text())
    import msgspec

    from vwserver.config import Config

    msgspec.convert(raw, Config)


def test_upstream_in_cluster(tmp_path: Path) -> None:
    doc = good()
    doc["upstream"] = {"inCluster": True}
    up = load_config(write(tmp_path, doc)).upstream
    assert up.in_cluster and up.kubeconfig is None and up.server is None


async def test_upstream_in_cluster_reads_the_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trustme

    from vwserver.server import upstream_auth

    sa = tmp_path / "sa"
    sa.mkdir()
    trustme.CA().cert_pem.write_to_path(str(sa / "ca.crt"))
    (sa / "token").write_text("sa-token")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    doc = good()
    doc["upstream"] = {"inCluster": True}
    config = load_config(write(tmp_path, doc))
    auth = await upstream_auth(config, base_dir=tmp_path, service_account_dir=sa)
    assert (auth.server, auth.bearer_token()) == ("https://127.0.0.1:6443", "sa-token")
