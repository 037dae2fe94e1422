"""The shipped alerts (``manifests/monitoring/prometheus-rules.yaml``) name only metrics and
labels that vwserver and its syncer export, and each has its runbook in ``docs/runbooks.md``.

An alert on a misspelt metric or label never fires, and nothing says so: this is the check.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from vwserver.metrics import ServerMetrics
from vwserver.syncer.metrics import SyncerMetrics

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "manifests" / "monitoring" / "prometheus-rules.yaml"
RUNBOOKS = REPO / "docs" / "runbooks.md"

_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported(registry: CollectorRegistry) -> dict[str, set[str]]:
    """Sample name → label names, for every metric of ``registry`` (children or not)."""
    names: dict[str, set[str]] = {}
    for family in registry.collect():
        # Labelled metrics without children have no samples: their label names are on the
        # collector (prometheus_client keeps them in ``_labelnames``).
        labels = set(getattr(family, "_labelnames", ()))
        for collector in registry._names_to_collectors.values():
            if getattr(collector, "_name", None) == family.name:
                labels |= set(getattr(collector, "_labelnames", ()))
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return names


METRICS = exported(ServerMetrics().registry) | exported(SyncerMetrics().registry)


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    assert doc["kind"] == "PrometheusRule"
    return [rule for group in doc["spec"]["groups"] for rule in group["rules"]]


def used(expr: str) -> dict[str, set[str]]:
    """Metric name → label names an expression uses with it (in ``{...}`` and ``by (...)``)."""
    found: dict[str, set[str]] = {}
    for m in re.finditer(r"\b(vwserver_[a-z_]+)(\{([^}]*)\})?", expr):
        labels = {x.split("=")[0].strip().rstrip("!~") for x in (m[3] or "").split(",") if x}
        found.setdefault(m[1], set()).update(labels)
    by = {
        label.strip() for group in re.findall(r"by \(([^)]*)\)", expr) for label in group.split(",")
    }
    for name in found:
        found[name] |= by
    return found


def anchors(markdown: str) -> set[str]:
    return {
        re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", h.strip().lower()))
        for h in re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)
    }


def test_every_alert_names_exported_metrics_and_labels() -> None:
    assert rules()
    for rule in rules():
        names = used(rule["expr"])
        assert names, f"{rule['alert']}: names no vwserver metric"
        for name, labels in names.items():
            assert name in METRICS, f"{rule['alert']}: {name} is not exported"
            assert labels <= METRICS[name], (
                f"{rule['alert']}: {name} has no {labels - METRICS[name]}"
            )


def test_every_alert_has_its_runbook() -> None:
    documented = anchors(RUNBOOKS.read_text())
    for rule in rules():
        page, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert page == "docs/runbooks.md"
        assert anchor == rule["alert"].lower() and anchor in documented, rule["alert"]


def test_the_check_catches_a_misspelt_metric_or_label() -> None:
    assert used('sum by (kind) (rate(vwserver_upstream_errors_total{kind="5xx"}[5m]))') == {
        "vwserver_upstream_errors_total": {"kind"}
    }
    assert "vwserver_upstream_error_total" not in METRICS
    assert "shard" not in METRICS["vwserver_upstream_errors_total"]
    assert {"resource", "shard"} <= METRICS["vwserver_cache_synced"]
