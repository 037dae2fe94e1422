"""The benchmark's reading of kcp's and vwserver's metrics (``scripts/bench/scrape.py``): which
samples count as work on the benchmark's resource."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"
spec = importlib.util.spec_from_file_location("bench_scrape", BENCH / "scrape.py")
assert spec is not None and spec.loader is not None
scrape = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = scrape
spec.loader.exec_module(scrape)

KCP = """\
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",dry_run="",group="example.io",resource="widgets",subresource="",verb="PATCH"} 3
apiserver_request_total{code="200",dry_run="All",group="example.io",resource="widgets",subresource="",verb="PATCH"} 2
apiserver_request_total{code="200",dry_run="",group="example.io",resource="widgets",subresource="status",verb="PUT"} 1
apiserver_request_total{code="200",dry_run="",group="apis.kcp.io",resource="apibindings",subresource="",verb="LIST"} 50
apiserver_request_total{code="200",dry_run="",group="",resource="widgets",subresource="",verb="GET"} 7
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 14.03
"""


def test_kcp_requests_on_the_benchmarks_resource_only() -> None:
    got = scrape.kcp_counters(KCP)
    assert got.requests == {("PATCH", ""): 5.0, ("PUT", "status"): 1.0}
    assert got.dry_runs == 2.0
    assert got.total_requests == 6.0


def test_differences_keep_what_changed() -> None:
    before = scrape.kcp_counters(KCP)
    after = scrape.kcp_counters(KCP.replace('verb="PATCH"} 3', 'verb="PATCH"} 13'))
    assert after.minus(before).requests == {("PATCH", ""): 10.0}
    assert after.minus(before).dry_runs == 0.0


def test_vwserver_upstream_requests_by_method() -> None:
    text = (
        "# TYPE vwserver_upstream_requests_total counter\n"
        'vwserver_upstream_requests_total{method="GET"} 4.0\n'
        'vwserver_upstream_requests_total{method="PATCH"} 2.0\n'
    )
    now = scrape.upstream_requests(text)
    assert now == {"GET": 4.0, "PATCH": 2.0}
    assert scrape.delta(now, {"GET": 4.0, "PATCH": 1.0}) == {"PATCH": 1.0}
