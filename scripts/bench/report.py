"""The benchmark report as markdown (docs/bench/README.md): pure text from :class:`Results`."""

from __future__ import annotations

from results import Regression, Results, over

#: Report sections: title, the ratio keys' prefixes, the plot, what the section shows.
SECTIONS: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    (
        "LIST time against object count",
        ("list.", "rss.list_peak"),
        "list.png",
        "Unpaged LIST of the slice (half of the objects) through vwserver passing through, and "
        "from vwserver's shared cache (a consistent read, and `resourceVersion=0` as informers "
        "list), against the direct LIST of the same half with the slice's labelSelector; with "
        "kcp also paged by the client (limit=500, as kubectl) against the direct paged LIST. "
        "Each point is the median of the repetitions, the paths taken in turn.",
    ),
    (
        "Watch fan-out: delivery latency",
        ("fanout.",),
        "fanout.png",
        "One change at a time delivered to N watchers of one slice from vwserver's cache. The "
        "watchers are raw sockets in a process of their own, which also holds one direct watch "
        "on the upstream; delivery latency is arrival minus the write's start (CLOCK_MONOTONIC "
        "in every process), the ratio compares the same percentile through vwserver and direct, "
        "and *added* is the arrival through vwserver minus the direct arrival of the same event. "
        "The upstream counts its open watches: vwserver holds one, whatever N.",
    ),
    (
        "Memory per open watch",
        ("rss.tls", "rss.plain"),
        "rss.png",
        "vwserver's RSS with N idle watches open (after their initial events, from a separate "
        "process), over TLS (trustme certificates) and plain HTTP. The first watch starts the "
        "cache and is the baseline; the figure is (RSS at the last step - RSS with one watch) "
        "over the watches added.",
    ),
    (
        "GET latency: vwserver and nginx",
        ("get.",),
        "gets.png",
        "GET of one object at a fixed concurrency from a separate process (keep-alive "
        "connections, the targets taken in turn): direct to the upstream, through vwserver "
        "(which authenticates and authorizes every request from warm caches), and through an "
        "nginx `proxy_pass` (one worker, keep-alive upstream) in front of the same upstream.",
    ),
    (
        "Writes: every verb through a cached slice and directly",
        ("writes.",),
        "writes.png",
        "Every write verb of a controller against real kcp, through a slice served by vwserver "
        "with the shared cache and directly against kcp's APIExport virtual workspace, in the "
        "same run: the same consumer workspace, namespace and labels (inside the slice), "
        "keep-alive connections from a load process of its own, each worker writing an object "
        "of its own, the targets taken in turn round after round. Latency at concurrency 1, "
        "throughput at 16 (as time per op: direct op/s over the slice's), kcp's CPU per op "
        "(its user + system time from /proc, embedded etcd included, less kcp's idle rate; "
        "not its `process_cpu_seconds_total`: one scrape of kcp's /metrics costs ~120 ms), "
        "kcp's own request count on the resource per op (`apiserver_request_total`: the VW and "
        "the shard both count a request) and vwserver's `vwserver_upstream_requests_total` "
        "per op. Alone: `run.py --only writes,consistent --quick`.",
    ),
    (
        "Consistent reads: LIST and kubectl get through a cached slice and directly",
        ("consistent.",),
        "consistent.png",
        "A consistent LIST (no resourceVersion, what kubectl sends) of one consumer workspace "
        "holding N matching objects (`env=prod`) and as many that do not match, through a "
        "slice served from vwserver's shared cache against the direct LIST with the slice's "
        "labelSelector; `resourceVersion=0` both ways for reference; `kubectl get -A` as a "
        "process (discovery, pages of Tables, printing; default paging is `limit=500`) "
        "against the same kubectl pointed at kcp. What one consistent LIST through the slice "
        "costs is counted once more after the timing: vwserver's requests to kcp and kcp's "
        "CPU against the direct LIST.",
    ),
    (
        "Sharded kcp: each shard's endpoint against that shard's VW",
        ("shards.",),
        "",
        "A sharded kcp (root shard, second shard, front-proxy; a consumer on each), per shard "
        "one vwserver (shared cache, TLS) serving that shard's VW only, as a shard-scoped "
        "replica set does: the slice's LIST over all its clusters against the shard's VW with "
        "the slice's labelSelector (median of the rounds), and one change at a time delivered "
        "to N watchers through vwserver against N watchers on the shard's VW (median delivery "
        "time, write start to arrival, all in the benchmark's process); vwserver's upstream "
        "requests per LIST and its upstream watches during the fan-out are counted. Alone: "
        "`run.py --only shards --quick`.",
    ),
    (
        "Watch stream throughput",
        ("watch.",),
        "",
        "The initial events of a watch-list streamed through the pass-through proxy; the ratio "
        "is the proxy's time over the direct time (1 / the share of direct throughput).",
    ),
)


def markdown(
    results: Results, *, regressions: list[Regression] | None, common: int, baseline: str
) -> str:
    out = [
        "# vwserver benchmark results",
        "",
        f"Written by `make bench` (`scripts/bench/run.py`, {results.mode} run) on "
        f"{results.taken}. Every timing is a **ratio to a direct call to the same upstream "
        "in the same run** (lower is better; 1.00 = as fast as direct), so that runs on a "
        "busy shared machine stay comparable; the absolute times are in the details. Raw "
        "data: [results.json](results.json). The next `make bench` compares its ratios with "
        "the committed results.json and prints every one that got more than 20 % worse.",
        "",
        "| machine | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in results.machine.items()),
        *(f"| load {k} | `{v}` |" for k, v in results.load.items()),
        "| time taken | " + ", ".join(f"{k} {v:.0f} s" for k, v in results.seconds.items()) + " |",
        "",
    ]
    if results.skipped:
        out += ["**Not measured in this run:**", ""]
        out += [f"- {part}: {why}" for part, why in results.skipped.items()]
        out += [""]
    for title, prefixes, plot, about in SECTIONS:
        keys = [k for k in results.ratios if k.startswith(prefixes)]
        out += [f"## {title}", "", about, ""]
        if not keys:
            out += ["Not measured in this run.", ""]
            continue
        if plot:
            out += [f"![{title}]({plot})", ""]
        if prefixes == ("writes.",):
            out += writes_summary(results)
        out += ["| measurement | details | figure | target |", "|---|---|---:|---|"]
        for key in keys:
            r = results.ratios[key]
            figure = f"{r.value:.2f}x" if r.unit == "x" else f"{r.value:.1f} {r.unit}"
            out.append(f"| {r.label} | {r.detail} | **{figure}** | {r.target} |")
        out.append("")
    if results.notes:
        out += ["## Notes", "", *(f"- {n}" for n in results.notes), ""]
    out += ["## Compared with the previous results", "", compared(regressions, common, baseline)]
    return "\n".join(out) + "\n"


def writes_summary(results: Results) -> list[str]:
    """Issue 23's table: per verb, the slice over direct at the lowest and highest concurrency."""
    if not results.writes:
        return []
    levels = sorted({w.concurrency for w in results.writes})
    low, high = levels[0], levels[-1]
    runs = {(w.target, w.verb, w.concurrency): w for w in results.writes}
    verbs = list(dict.fromkeys(w.verb for w in results.writes))
    out = [
        f"| op | throughput slice / direct (c={high}) | p50 slice / direct (c={low}) | "
        "vwserver upstream requests per op | kcp requests per op, slice / direct | "
        "kcp CPU per op, slice / direct |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for verb in verbs:
        try:
            d1, s1 = runs[("direct", verb, low)], runs[("slice", verb, low)]
            dh, sh = runs[("direct", verb, high)], runs[("slice", verb, high)]
        except KeyError:
            continue
        cpu = f"{over(sh.kcp_cpu_ms, dh.kcp_cpu_ms):.2f}x" if dh.kcp_cpu_ms else "—"
        rps, p50 = over(sh.rps, dh.rps), over(s1.p50_ms, d1.p50_ms)
        out.append(
            f"| {verb.replace('_', ' ')} | {rps:.2f} | {p50:.2f}x | "
            f"{sh.upstream_requests:.2f} | {sh.kcp_requests:.1f} / {dh.kcp_requests:.1f} | "
            f"{cpu} ({sh.kcp_cpu_ms:.2f} / {dh.kcp_cpu_ms:.2f} ms) |"
        )
    return [*out, ""]


def compared(regressions: list[Regression] | None, common: int, baseline: str) -> str:
    """What the comparison with the previous results found, in one paragraph."""
    if regressions is None:
        return f"No previous results to compare with ({baseline})."
    if not regressions:
        return f"None of the {common} ratios in common with {baseline} got worse by more than 20 %."
    lines = [f"{len(regressions)} of {common} ratios got worse by more than 20 % ({baseline}):"]
    lines += [
        f"- {r.label} (`{r.key}`): {r.before:.2f} → {r.after:.2f}"
        f"{'' if r.unit == 'x' else ' ' + r.unit} (+{r.change:.0%})"
        for r in regressions
    ]
    return "\n".join(lines)
