"""What kcp and vwserver count about themselves, read from their Prometheus ``/metrics``.

The writes and consistent-read arms charge each operation with the requests it caused: kcp's own
requests on the benchmark's resource (``apiserver_request_total``; a request to the APIExport
virtual workspace is counted by the VW's handler chain and again by the shard it forwards to,
the same for every client, so the figure is compared between clients, not read as round trips)
and vwserver's requests to kcp for its clients (``vwserver_upstream_requests_total``). A
snapshot is taken before and after each run and the difference divided by the run's operations.

kcp's CPU is not taken from its ``process_cpu_seconds_total``: rendering kcp's ``/metrics``
costs kcp ~120 ms of CPU itself (measured on kcp v0.32.3, two scrapes back to back), as much as
a dozen writes, and that counter moves in 10 ms ticks. The arms read the same time (the
process's user + system CPU, its embedded etcd included) from ``/proc/<kcp pid>`` instead,
to the nanosecond, with the scrapes outside the measured window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

GROUP, RESOURCE = "example.io", "widgets"


@dataclass(frozen=True, kw_only=True)
class KcpCounters:
    #: apiserver_request_total on example.io widgets, by (verb, subresource), and the dry-runs.
    requests: dict[tuple[str, str], float] = field(default_factory=dict)
    dry_runs: float = 0.0

    def minus(self, before: KcpCounters) -> KcpCounters:
        keys = set(self.requests) | set(before.requests)
        return KcpCounters(
            requests={
                k: self.requests.get(k, 0.0) - before.requests.get(k, 0.0)
                for k in sorted(keys)
                if self.requests.get(k, 0.0) != before.requests.get(k, 0.0)
            },
            dry_runs=self.dry_runs - before.dry_runs,
        )

    @property
    def total_requests(self) -> float:
        return sum(self.requests.values())


def kcp_counters(text: str) -> KcpCounters:
    """Pure: the counters of one kcp ``/metrics`` answer."""
    requests: dict[tuple[str, str], float] = {}
    dry = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if (
                s.name == "apiserver_request_total"
                and s.labels.get("group") == GROUP
                and s.labels.get("resource") == RESOURCE
            ):
                key = (s.labels.get("verb", ""), s.labels.get("subresource", ""))
                requests[key] = requests.get(key, 0.0) + s.value
                if s.labels.get("dry_run"):
                    dry += s.value
    return KcpCounters(requests=requests, dry_runs=dry)


def upstream_requests(text: str) -> dict[str, float]:
    """Pure: vwserver's ``vwserver_upstream_requests_total`` by method."""
    return {
        s.labels.get("method", ""): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "vwserver_upstream_requests_total"
    }


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


async def read_metrics(session: aiohttp.ClientSession, base: str) -> str:
    async with session.get(f"{base}/metrics") as r:
        if r.status != 200:
            raise RuntimeError(f"GET {base}/metrics: {r.status} {await r.text()}")
        return await r.text()
