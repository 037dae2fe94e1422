"""The report's PNG plots (matplotlib, no display): one per measured part."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter
from results import Results, WriteRun, over

LIST_PATHS = ("direct", "pass-through", "cache", "cache rv=0")
COLORS = {
    "direct": "black",
    "pass-through": "tab:blue",
    "cache": "tab:green",
    "cache rv=0": "tab:olive",
    "vwserver": "tab:blue",
    "nginx": "tab:red",
}
STYLES = {"fake": "-", "kcp": "--"}


def write_plots(results: Results, out: Path) -> list[str]:
    """Write a PNG for each part with data; returns their file names."""
    written = []
    for name, draw in (
        ("list.png", _lists),
        ("fanout.png", _fanout),
        ("rss.png", _rss),
        ("gets.png", _gets),
        ("writes.png", _writes),
        ("consistent.png", _consistent),
    ):
        fig = draw(results)
        if fig is None:
            continue
        fig.text(0.995, 0.005, _footer(results), ha="right", va="bottom", fontsize=7, color="gray")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written


def _footer(results: Results) -> str:
    m = results.machine
    return f"{results.taken} · {m.get('cpu', '')}, {m.get('cores', '')} cores · {results.mode} run"


def _lists(results: Results) -> Figure | None:
    if not results.lists:
        return None
    fig, (times, ratios) = plt.subplots(1, 2, figsize=(12, 4.8))
    for upstream in ("fake", "kcp"):
        points = [p for p in results.lists if p.upstream == upstream]
        if not points:
            continue
        direct = {p.objects: p.seconds for p in points if p.path == "direct"}
        for path in LIST_PATHS:
            series = sorted((p.objects, p.seconds) for p in points if p.path == path)
            if not series:
                continue
            xs = [x for x, _ in series]
            style = {"color": COLORS[path], "linestyle": STYLES[upstream], "marker": "o"}
            times.plot(xs, [s * 1000 for _, s in series], label=f"{upstream}: {path}", **style)
            if path != "direct":
                ratios.plot(
                    xs, [s / direct[x] for x, s in series], label=f"{upstream}: {path}", **style
                )
    times.set(
        xscale="log",
        yscale="log",
        xlabel="objects in the upstream (the slice: half)",
        ylabel="LIST time, median (ms)",
        title="LIST time against object count",
    )
    ratios.axhline(1.0, color="black", linewidth=0.8)
    ratios.set(
        xscale="log",
        xlabel="objects in the upstream",
        ylabel="time ÷ direct LIST (same run)",
        title="Ratio to the direct LIST",
    )
    _objects_ticks(times, {p.objects for p in results.lists})
    _objects_ticks(ratios, {p.objects for p in results.lists})
    ratios.set_ylim(bottom=0)
    _plain_log(times.yaxis)
    for ax in (times, ratios):
        ax.grid(True, alpha=0.3)
    times.legend(fontsize=8)
    ratios.legend(fontsize=8)
    return fig


def _objects_ticks(ax: Axes, counts: Iterable[int]) -> None:
    ticks = sorted(counts)
    ax.set_xticks(ticks, [f"{n // 1000}k" if n >= 1000 else str(n) for n in ticks])
    ax.minorticks_off()


def _plain_log(axis: Axis) -> None:
    """Numbers (1, 2, 5, 10, 20, ...) instead of powers of ten on a log axis."""
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))


def _fanout(results: Results) -> Figure | None:
    if not results.fanout:
        return None
    fig, (delivery, added) = plt.subplots(1, 2, figsize=(12, 4.8))
    for run in results.fanout:
        n = len(run.proxied_ms)
        ys = [i / (n - 1) for i in range(n)] if n > 1 else [1.0]
        label = f"{run.watchers:,} watcher{'s' if run.watchers > 1 else ''} via vwserver"
        delivery.plot(run.proxied_ms, ys, label=label)
        added.plot(run.added_ms, ys, label=label)
    direct = results.fanout[-1].direct_ms
    if direct:
        ys = [i / (len(direct) - 1) for i in range(len(direct))] if len(direct) > 1 else [1.0]
        delivery.plot(direct, ys, color="black", linestyle="--", label="direct watcher")
    delivery.set(
        xscale="log",
        xlabel="delivery latency: write → arrival (ms)",
        ylabel="fraction of deliveries",
        title="Delivery latency (CDF)",
    )
    added.set(
        xscale="symlog",
        xlabel="added over the direct arrival of the same event (ms)",
        ylabel="fraction of deliveries",
        title="Latency added by vwserver (CDF)",
    )
    for ax in (delivery, added):
        _plain_log(ax.xaxis)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    return fig


def _rss(results: Results) -> Figure | None:
    if not results.rss:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.8))
    for transport, key in (("TLS", "tls"), ("plain HTTP", "plain")):
        points = [p for p in results.rss if p.transport == transport]
        if not points:
            continue
        per = results.ratios.get(f"rss.{key}.kib_per_watch")
        label = transport + (f": {per.value:.1f} KiB per watch" if per else "")
        ax.plot(
            [p.watches for p in points], [p.rss_kib / 1024 for p in points], marker="o", label=label
        )
    ax.set(
        xlabel="open idle watches",
        ylabel="vwserver RSS (MiB)",
        title="vwserver memory against open watches",
    )
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _gets(results: Results) -> Figure | None:
    if not results.gets:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    levels = sorted({g.concurrency for g in results.gets})
    for ax, q in zip(axes, (50, 99), strict=True):
        for target in ("direct", "vwserver", "nginx"):
            runs = sorted(
                (g for g in results.gets if g.target == target), key=lambda g: g.concurrency
            )
            if not runs:
                continue
            xs = [levels.index(g.concurrency) for g in runs]
            ys = [g.p50_ms if q == 50 else g.p99_ms for g in runs]
            ax.plot(xs, ys, marker="o", color=COLORS.get(target, "black"), label=target)
        ax.set_xticks(range(len(levels)), [str(c) for c in levels])
        ax.set(
            xlabel="concurrent requests",
            ylabel=f"GET latency p{q} (ms)",
            title=f"GET of one object, p{q}",
        )
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        missing = results.skipped.get("GET through nginx")
        if missing:
            ax.text(
                0.02,
                0.95,
                f"nginx NOT measured: {missing}",
                transform=ax.transAxes,
                fontsize=8,
                color="tab:red",
                va="top",
                wrap=True,
            )
    return fig


def _writes(results: Results) -> Figure | None:
    if not results.writes:
        return None
    levels = sorted({w.concurrency for w in results.writes})
    low, high = levels[0], levels[-1]
    runs = {(w.target, w.verb, w.concurrency): w for w in results.writes}
    verbs = [
        v
        for v in dict.fromkeys(w.verb for w in results.writes)
        if all((t, v, c) in runs for t in ("direct", "slice") for c in (low, high))
    ]
    fig, (ratios, cpu) = plt.subplots(1, 2, figsize=(13, 4.8))
    xs = list(range(len(verbs)))
    width = 0.27
    cpu_ratios = [_r(runs, v, high, "kcp_cpu_ms") for v in verbs]
    series: tuple[tuple[str, str, list[float]], ...] = (
        (f"p50 latency, c={low}", "tab:blue", [_r(runs, v, low, "p50_ms") for v in verbs]),
        (
            f"time per op (1/throughput), c={high}",
            "tab:orange",
            [_inv_rps(runs, v, high) for v in verbs],
        ),
        (f"kcp CPU per op, c={high}", "tab:green", cpu_ratios),
    )
    for i, (label, color, values) in enumerate(series):
        ratios.bar([x + (i - 1) * width for x in xs], values, width, label=label, color=color)
    ratios.axhline(1.0, color="black", linewidth=0.8)
    ratios.set_xticks(xs, [v.replace("_", " ") for v in verbs], rotation=30, ha="right")
    ratios.set(ylabel="slice ÷ direct kcp (same run)", title="Writes through a cached slice")
    ratios.set_ylim(bottom=0)
    ratios.legend(fontsize=8)
    for i, target in enumerate(("direct", "slice")):
        got = [runs[(target, v, high)] for v in verbs]
        bars = cpu.bar([x + (i - 0.5) * 0.4 for x in xs], [w.kcp_cpu_ms for w in got], 0.4,
                       label=f"{target}", color=COLORS.get(target, "tab:blue"))  # fmt: skip
        if target == "slice":
            for bar, w in zip(bars, got, strict=True):
                cpu.annotate(f"{w.upstream_requests:.1f} req", (bar.get_x() + bar.get_width() / 2,
                             bar.get_height()), ha="center", va="bottom", fontsize=7)  # fmt: skip
    cpu.set_xticks(xs, [v.replace("_", " ") for v in verbs], rotation=30, ha="right")
    cpu.set(
        ylabel="kcp CPU per op (ms)",
        title=f"kcp CPU per op at c={high} (label: vwserver upstream requests per op)",
    )
    cpu.legend(fontsize=8)
    for ax in (ratios, cpu):
        ax.grid(True, axis="y", alpha=0.3)
    return fig


def _r(runs: dict[tuple[str, str, int], WriteRun], verb: str, c: int, attr: str) -> float:
    return over(getattr(runs[("slice", verb, c)], attr), getattr(runs[("direct", verb, c)], attr))


def _inv_rps(runs: dict[tuple[str, str, int], WriteRun], verb: str, c: int) -> float:
    return over(runs[("direct", verb, c)].rps, runs[("slice", verb, c)].rps)


def _consistent(results: Results) -> Figure | None:
    if not results.consistent:
        return None
    fig, (times, ratios) = plt.subplots(1, 2, figsize=(12, 4.8))
    points = results.consistent
    paths = list(dict.fromkeys(p.path for p in points))
    # Each slice path against its direct twin: "cache" ↔ "direct", "X, slice" ↔ "X, direct".
    twins = {"cache": "direct", "cache rv=0": "direct rv=0"}
    twins.update({p: p.removesuffix("slice") + "direct" for p in paths if p.endswith(", slice")})
    palette = iter(("tab:green", "tab:olive", "tab:purple", "tab:red", "tab:cyan", "tab:brown"))
    colors = {via: next(palette, "gray") for via in twins}
    seconds = {(p.path, p.objects): p.seconds for p in points}
    for path in paths:
        series = sorted((p.objects, p.seconds) for p in points if p.path == path)
        xs = [x for x, _ in series]
        via = path if path in twins else next((v for v, d in twins.items() if d == path), path)
        style = {"color": colors.get(via, "black"), "marker": "o"}
        style["linestyle"] = "-" if path in twins else "--"
        times.plot(xs, [s * 1000 for _, s in series], label=path, **style)
        if path in twins:
            ratio = [over(s, seconds[(twins[path], x)]) for x, s in series]
            ratios.plot(xs, ratio, label=f"{path} ÷ {twins[path]}", **style)
    times.set(
        xscale="log",
        yscale="log",
        xlabel="matching objects (as many more do not match)",
        ylabel="time, median (ms)",
        title="Consistent reads against kcp",
    )
    ratios.axhline(1.0, color="black", linewidth=0.8)
    ratios.set(xscale="log", xlabel="matching objects", ylabel="slice ÷ direct (same run)",
               title="Ratio to the same read on kcp directly")  # fmt: skip
    for ax in (times, ratios):
        _objects_ticks(ax, {p.objects for p in points})
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    ratios.set_ylim(bottom=0)
    _plain_log(times.yaxis)
    return fig
