"""What a benchmark run produced, as data: the ratios to compare and the points to plot.

Timings on a shared 2-core machine move by tens of percent between runs, so a result is kept as
a *ratio* to a direct call to the same upstream in the same run. Every ratio here is "lower is
better" (a throughput is stored as the proxy's time over the direct time), which lets the
comparison with the committed results be one rule: a ratio that grew by more than the threshold
got worse. Pure: no I/O but msgspec's JSON encoding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

SCHEMA = 1
REGRESSION_THRESHOLD = 0.20
#: Points kept of a latency distribution (every half percent, min to max) for the CDF plot.
CDF_POINTS = 201


class Ratio(msgspec.Struct, kw_only=True):
    """One comparable figure; lower is better."""

    label: str
    value: float
    detail: str = ""
    unit: str = "x"  # "x" for a ratio to direct; otherwise the unit of an absolute cost
    target: str = ""


class ListPoint(msgspec.Struct, kw_only=True):
    upstream: str  # "fake" | "kcp" (| "kcp consistent" in Results.consistent)
    path: str  # "direct" | "pass-through" | "cache" | "cache rv=0" | "... , client pages"
    objects: int  # in the upstream
    items: int  # in the answer (the slice's half)
    seconds: float  # median


class FanoutRun(msgspec.Struct, kw_only=True):
    watchers: int
    events: int
    delivered: int
    upstream_watches: int  # vwserver's, during the run (the direct watcher's excluded)
    #: CPU time per delivery through vwserver while the events flowed: vwserver's, and the
    #: watcher process's (its own cost, which lands in the latencies it reports).
    server_cpu_us: float
    client_cpu_us: float
    #: Quantiles (CDF_POINTS of them) in ms: write → the direct watcher, write → each vwserver
    #: watcher, and each vwserver watcher's arrival minus the direct one of the same event.
    direct_ms: list[float]
    proxied_ms: list[float]
    added_ms: list[float]


class RssPoint(msgspec.Struct, kw_only=True):
    transport: str  # "TLS" | "plain HTTP"
    watches: int
    rss_kib: int


class GetRun(msgspec.Struct, kw_only=True):
    target: str  # "direct" | "vwserver" | "nginx"
    concurrency: int
    requests: int
    p50_ms: float
    p99_ms: float
    #: Requests per second of the run: requests / (sum of latencies / concurrency).
    rps: float


class WriteRun(msgspec.Struct, kw_only=True):
    """One verb against one target (``direct``: kcp's APIExport VW; ``slice``: through a cached
    vwserver slice) at one concurrency, every round together."""

    target: str
    verb: str
    concurrency: int
    ops: int
    p50_ms: float
    p99_ms: float
    #: Operations per second: ops / the runs' wall time.
    rps: float
    #: kcp's CPU per operation (``process_cpu_seconds_total`` delta less kcp's idle rate over
    #: the run's wall time), kcp's own requests on the resource per operation (its
    #: ``apiserver_request_total``: the VW's and the shard's both count), the dry-runs among
    #: them, and for ``slice`` vwserver's ``vwserver_upstream_requests_total`` and CPU per op.
    kcp_cpu_ms: float
    kcp_requests: float
    kcp_dry_runs: float
    upstream_requests: float = 0.0
    upstream_methods: dict[str, float] = msgspec.field(default_factory=dict)
    proxy_cpu_ms: float = 0.0


class Results(msgspec.Struct, kw_only=True):
    schema: int = SCHEMA
    mode: str  # "full" | "quick"
    taken: str  # ISO 8601, UTC
    machine: dict[str, str]
    load: dict[str, str] = msgspec.field(default_factory=dict)  # `uptime` before and after
    seconds: dict[str, float] = msgspec.field(default_factory=dict)  # per part
    skipped: dict[str, str] = msgspec.field(default_factory=dict)  # part → why not measured
    notes: list[str] = msgspec.field(default_factory=list)
    ratios: dict[str, Ratio] = msgspec.field(default_factory=dict)
    lists: list[ListPoint] = msgspec.field(default_factory=list)
    fanout: list[FanoutRun] = msgspec.field(default_factory=list)
    rss: list[RssPoint] = msgspec.field(default_factory=list)
    gets: list[GetRun] = msgspec.field(default_factory=list)
    writes: list[WriteRun] = msgspec.field(default_factory=list)
    #: Consistent reads against kcp: ``path`` direct / cache / ... / kubectl ...; ``objects`` is
    #: the number of matching objects (kcp holds as many more that do not match).
    consistent: list[ListPoint] = msgspec.field(default_factory=list)


def encode(results: Results) -> bytes:
    return msgspec.json.format(msgspec.json.encode(results), indent=1) + b"\n"


def decode(data: bytes) -> Results:
    return msgspec.json.decode(data, type=Results)


class Regression(msgspec.Struct, kw_only=True, frozen=True):
    key: str
    label: str
    before: float
    after: float
    unit: str

    @property
    def change(self) -> float:
        return self.after / self.before - 1


def regressions(
    before: Results, after: Results, *, threshold: float = REGRESSION_THRESHOLD
) -> tuple[list[Regression], int]:
    """Ratios of *after* that grew by more than *threshold* over *before*, and how many ratios
    the two runs have in common (a ratio measured in one run only is not compared)."""
    common = sorted(set(before.ratios) & set(after.ratios))
    worse = [
        Regression(
            key=key,
            label=after.ratios[key].label,
            before=before.ratios[key].value,
            after=after.ratios[key].value,
            unit=after.ratios[key].unit,
        )
        for key in common
        if before.ratios[key].value > 0
        and after.ratios[key].value > before.ratios[key].value * (1 + threshold)
    ]
    return worse, len(common)


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (0 < q ≤ 100) of an ascending sequence."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def quantiles(values: Sequence[float], points: int = CDF_POINTS) -> list[float]:
    """*points* evenly spaced quantiles (minimum to maximum) of *values*, rounded to µs."""
    ordered = sorted(values)
    if not ordered:
        return []
    last = len(ordered) - 1
    return [round(ordered[round(i * last / (points - 1))], 3) for i in range(points)]


def quantile_at(cdf: Sequence[float], q: float) -> float:
    """The q-th percentile (0 to 100) read back from a list made by :func:`quantiles`."""
    if not cdf:
        return math.nan
    return cdf[round(q / 100 * (len(cdf) - 1))]


def over(a: float, b: float) -> float:
    """``a / b``, or 0 where ``b`` is not positive (NaN would not survive results.json: msgspec
    writes it as null); the comparison skips a previous figure of 0."""
    return a / b if b > 0 and math.isfinite(a) else 0.0


def describe(ratio: Ratio) -> str:
    """One printed line: label, detail, the figure and its target."""
    figure = f"{ratio.value:.2f}x" if ratio.unit == "x" else f"{ratio.value:.1f} {ratio.unit}"
    target = f"  (target {ratio.target})" if ratio.target else ""
    return f"{ratio.label:<44} {ratio.detail:<44} {figure:>9}{target}"


#: What of a run the ``kcp`` part measured: its ratios' keys start with one of these.
KCP_RATIOS = ("list.kcp.", "watch.kcp.")


def with_kcp_part(results: Results, kcp: Results, *, source: str) -> Results:
    """``results`` (a run without the ``kcp`` part) with the ``kcp`` part of another run
    (``--only kcp``), which takes over an hour and so may be measured separately; the report
    says so in a note."""
    if "kcp" in results.seconds:
        raise ValueError("this run measured the kcp part itself")
    if "kcp" not in kcp.seconds or kcp.skipped.get("kcp", "").startswith("FAILED"):
        raise ValueError(f"{source} has no kcp part")
    merged = msgspec.structs.replace(
        results,
        seconds={**results.seconds, "kcp": kcp.seconds["kcp"]},
        skipped={part: why for part, why in results.skipped.items() if part != "kcp"},
        notes=[
            *results.notes,
            f"the kcp part was measured in a run of its own ({kcp.taken}, load before "
            f"{kcp.load.get('before', '?')}, after {kcp.load.get('after', '?')}), "
            f"taken from {source}",
            *(n for n in kcp.notes if n.startswith("kcp")),
        ],
        ratios={
            **{k: r for k, r in results.ratios.items() if not k.startswith(KCP_RATIOS)},
            **{k: r for k, r in kcp.ratios.items() if k.startswith(KCP_RATIOS)},
        },
        lists=[
            *(p for p in results.lists if p.upstream != "kcp"),
            *(p for p in kcp.lists if p.upstream == "kcp"),
        ],
    )
    merged.machine = {**results.machine, "kcp": kcp.machine.get("kcp", "?")}
    return merged


#: What each part of a run measured: its ratios' key prefixes and its notes' prefixes.
PART_RATIOS: dict[str, tuple[str, ...]] = {
    "list": ("list.fake.", "rss.list_peak"),
    "watch": ("watch.fake.",),
    "fanout": ("fanout.",),
    "rss": ("rss.tls", "rss.plain"),
    "gets": ("get.",),
    "kcp": KCP_RATIOS,
    "writes": ("writes.",),
    "consistent": ("consistent.",),
    "shards": ("shards.",),
}
PART_NOTES: dict[str, tuple[str, ...]] = {
    "list": ("fake",),
    "kcp": ("kcp", "the kcp part"),
    "writes": ("writes",),
    "consistent": ("consistent",),
    "shards": ("shards",),
}


def measured_parts(results: Results) -> set[str]:
    """The parts a run measured (and did not fail)."""
    return {
        part
        for part in PART_RATIOS
        if part in results.seconds and not results.skipped.get(part, "").startswith("FAILED")
    }


def with_earlier_parts(results: Results, earlier: Results, *, source: str) -> Results:
    """``results`` with every part it did not measure taken from ``earlier`` (e.g. the committed
    docs/bench/results.json), so that a run of a few parts (``--only writes,consistent``)
    updates one whole report; a note says which parts are older and when they were taken."""
    mine = measured_parts(results)
    taken = sorted(measured_parts(earlier) - mine)
    if not taken:
        return results

    def old(part: str) -> bool:
        return part in taken

    def owner(key: str) -> str | None:
        return next((p for p, prefixes in PART_RATIOS.items() if key.startswith(prefixes)), None)

    def note_part(note: str) -> str | None:
        return next((p for p, prefixes in PART_NOTES.items() if note.startswith(prefixes)), None)

    merged = msgspec.structs.replace(
        results,
        seconds={**results.seconds, **{p: earlier.seconds[p] for p in taken}},
        # A part that failed now keeps saying so, beside the earlier figures.
        skipped={
            p: why for p, why in results.skipped.items() if not old(p) or why.startswith("FAILED")
        },
        notes=[
            *results.notes,
            f"{', '.join(taken)}: from an earlier {earlier.mode} run ({earlier.taken}, "
            f"vwserver {earlier.machine.get('vwserver', '?')}, load before "
            f"{earlier.load.get('before', '?')}), taken from {source}",
            *(n for n in earlier.notes if old(note_part(n) or "")),
        ],
        ratios={
            **results.ratios,
            **{k: r for k, r in earlier.ratios.items() if old(owner(k) or "")},
        },
        lists=[
            *results.lists,
            *(p for p in earlier.lists if old("kcp" if p.upstream == "kcp" else "list")),
        ],
        fanout=results.fanout + (earlier.fanout if old("fanout") else []),
        rss=results.rss + (earlier.rss if old("rss") else []),
        gets=results.gets + (earlier.gets if old("gets") else []),
        writes=results.writes + (earlier.writes if old("writes") else []),
        consistent=results.consistent + (earlier.consistent if old("consistent") else []),
    )
    if old("kcp") or old("writes") or old("consistent"):
        merged.machine = {**results.machine, "kcp": earlier.machine.get("kcp", "?")}
    return merged
