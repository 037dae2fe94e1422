"""Benchmarks: vwserver against a direct call to the same upstream, in the same run.

Timed numbers on a shared 2-core machine move around, so every timing is a *ratio* against the
direct call made in the same run, and nothing here is a test assertion. The run writes a report
(docs/bench/: README.md with the tables, PNG plots, results.json) and compares its ratios with
the results committed last, printing every one that got worse by more than 20 %.

    python scripts/bench/run.py                  # everything, full sizes (make bench)
    python scripts/bench/run.py --quick          # small sizes; report in a temporary directory
    python scripts/bench/run.py --only fanout    # one part, printed (no report unless --out)
    python scripts/bench/run.py --only kcp --out /tmp/kcp   # the long part on its own, then:
    python scripts/bench/run.py --kcp-from /tmp/kcp/results.json   # the rest, one report
    python scripts/bench/run.py --only writes,consistent --quick   # issue 23's arms, real kcp
    python scripts/bench/run.py --only writes,consistent --quick \
        --rest-from docs/bench/results.json --out docs/bench   # ... into the committed report

Parts: list (LIST vs object count, fake upstream), watch (watch-list throughput), fanout (one
change to 1/100/1,000 watchers), rss (memory per open watch, TLS and plain), gets (GET latency
against nginx proxy_pass), kcp (LIST vs object count against a real kcp it starts), writes
(every write verb through a cached slice vs kcp's VW directly: latency, throughput, kcp CPU and
requests per op, real kcp), consistent (consistent LIST and kubectl get through a cached slice
vs kcp directly at 1k/10k/50k matching objects, real kcp), shards (per shard of a sharded kcp
it starts: LIST and WATCH fan-out through a shard-scoped vwserver vs that shard's VW directly).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine
from consistent import bench_consistent
from fanout import bench_fanout
from gets import bench_gets
from harness import REPO
from kcpbench import bench_kcp
from lists import bench_lists, bench_watch
from nginx import find_nginx, nginx_version
from plots import write_plots
from report import compared, markdown
from results import (
    Regression,
    Results,
    decode,
    encode,
    regressions,
    with_earlier_parts,
    with_kcp_part,
)
from rss import bench_rss
from shards import ShardSizes, bench_shards
from writes import bench_writes

PARTS = ("list", "watch", "fanout", "rss", "gets", "kcp", "writes", "consistent", "shards")
DOCS = REPO / "docs" / "bench"
COMMITTED = "docs/bench/results.json"


@dataclass(frozen=True, kw_only=True)
class Sizes:
    objects: tuple[int, ...]
    kcp_objects: tuple[int, ...]
    repeat: int
    events: int  # watch throughput: initial events
    watchers: tuple[int, ...]
    fanout_events: int
    fanout_spacing: float
    rss_watches: tuple[int, ...]
    rss_settle: float
    get_concurrency: tuple[int, ...]
    get_requests: int
    get_rounds: int
    write_concurrency: tuple[int, ...]  # latency at the lowest, throughput at the highest
    write_ops: tuple[int, ...]  # operations per verb, target and round at each concurrency
    write_rounds: int
    consistent_objects: tuple[int, ...]  # matching objects (as many more do not match)
    kubectl_chunks: tuple[str, ...]  # "default" (kubectl's own: 500), or a --chunk-size
    shard_objects: int  # widgets per consumer (one per shard), half matching
    shard_watchers: int  # watchers per group (through vwserver, direct) in the fan-out
    shard_events: int  # changes delivered in the fan-out


FULL = Sizes(
    objects=(10_000, 50_000, 100_000),
    kcp_objects=(10_000, 50_000, 100_000),
    repeat=5,
    events=20_000,
    watchers=(1, 100, 1000),
    fanout_events=30,
    fanout_spacing=0.3,
    rss_watches=(1, 100, 250, 500, 1000),
    rss_settle=2.0,
    get_concurrency=(1, 16, 64),
    get_requests=2000,
    get_rounds=3,
    write_concurrency=(1, 16),
    write_ops=(300, 1200),
    write_rounds=3,
    consistent_objects=(1_000, 10_000, 50_000),
    kubectl_chunks=("default", "0"),
    shard_objects=10_000,
    shard_watchers=100,
    shard_events=30,
)
QUICK = Sizes(
    objects=(2_000, 10_000),
    kcp_objects=(1_000, 2_000),
    repeat=3,
    events=2_000,
    watchers=(1, 10, 100),
    fanout_events=8,
    fanout_spacing=0.1,
    rss_watches=(1, 25, 50, 100),
    rss_settle=0.5,
    get_concurrency=(1, 16, 64),
    get_requests=300,
    get_rounds=2,
    write_concurrency=(1, 16),
    write_ops=(50, 200),
    write_rounds=2,
    consistent_objects=(1_000, 10_000),
    kubectl_chunks=("default", "0"),
    shard_objects=1_000,
    shard_watchers=20,
    shard_events=10,
)


def counts(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in text.split(","))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    parser.add_argument("--only", help=f"comma-separated parts to run (only these): {PARTS}")
    parser.add_argument("--skip", default="", help=f"comma-separated parts not to run: {PARTS}")
    parser.add_argument("--out", type=Path, help="report directory (default docs/bench)")
    parser.add_argument(
        "--report-only",
        type=Path,
        metavar="RESULTS_JSON",
        help="measure nothing: write the plots and README.md of these results (into --out, "
        "default beside the file), e.g. after changing the report's code",
    )
    parser.add_argument(
        "--kcp-from",
        type=Path,
        metavar="RESULTS_JSON",
        help="do not run the kcp part (over an hour): take its results from a run of its own "
        "(--only kcp --out DIR), e.g. on a quieter machine",
    )
    parser.add_argument(
        "--rest-from",
        type=Path,
        metavar="RESULTS_JSON",
        help="take every part this run does not measure from these results (e.g. "
        "docs/bench/results.json), so that --only PARTS updates a whole report",
    )
    parser.add_argument(
        "--baseline",
        default="committed",
        help=f"results to compare with: 'committed' ({COMMITTED} at git HEAD, else the file), "
        "a results.json path, or 'none'",
    )
    parser.add_argument(
        "--nginx",
        choices=["install", "if-present"],
        default="install",
        help="install nginx from the Debian packages when missing, or measure it only if there",
    )
    parser.add_argument("--objects", type=counts, help="LIST object counts, fake upstream")
    parser.add_argument("--kcp-objects", type=counts, help="LIST object counts, kcp")
    parser.add_argument("--watchers", type=counts, help="fan-out watcher counts")
    parser.add_argument("--events", type=int, help="watch throughput: initial events")
    parser.add_argument("--fanout-events", type=int, help="fan-out: changes written per run")
    parser.add_argument(
        "--fanout-spacing", type=float, help="fan-out: base seconds between writes (0: a burst)"
    )
    parser.add_argument("--rss-watches", type=counts, help="open watches at each RSS reading")
    parser.add_argument("--get-requests", type=int, help="GETs per target, level and round")
    parser.add_argument("--repeat", type=int, help="repetitions of each timed call")
    parser.add_argument(
        "--write-ops", type=counts, help="writes: ops per verb, target and round at each level"
    )
    parser.add_argument("--write-concurrency", type=counts, help="writes: concurrency levels")
    parser.add_argument("--write-rounds", type=int, help="writes: rounds (targets alternate)")
    parser.add_argument(
        "--consistent-objects", type=counts, help="consistent reads: matching object counts"
    )
    parser.add_argument(
        "--kubectl-chunks",
        type=lambda text: tuple(text.split(",")),
        help="consistent reads: kubectl get --chunk-size values ('default': none given)",
    )
    parser.add_argument(
        "--consistent-busy",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="consistent reads: write a ConfigMap in another workspace every SECONDS while timing"
        " (kcp busy with other resources; 0: an idle kcp)",
    )
    parser.add_argument("--page-size", type=int, default=500, help="vwserver's listPageSize")
    parser.add_argument(
        "--workers",
        type=counts,
        default=(1,),
        help="gets, fanout: vwserver's worker counts to measure (e.g. 1,2: both in one run)",
    )
    args = parser.parse_args(argv)
    skipped = set(filter(None, args.skip.split(",")))
    if skipped - set(PARTS):
        parser.error(f"--skip: unknown parts {sorted(skipped - set(PARTS))}")
    only = set(filter(None, (args.only or "").split(",")))
    if only - set(PARTS):
        parser.error(f"--only: unknown parts {sorted(only - set(PARTS))}")
    if args.kcp_from is not None:
        skipped.add("kcp")
    args.parts = [p for p in PARTS if (p in only if only else p not in skipped)]
    sizes = QUICK if args.quick else FULL
    overrides = {
        field: getattr(args, field)
        for field in (
            "objects",
            "kcp_objects",
            "watchers",
            "events",
            "fanout_events",
            "fanout_spacing",
            "rss_watches",
            "get_requests",
            "repeat",
            "write_ops",
            "write_concurrency",
            "write_rounds",
            "consistent_objects",
            "kubectl_chunks",
        )
        if getattr(args, field) is not None
    }
    args.sizes = replace(sizes, **overrides)
    if len(args.sizes.write_ops) != len(args.sizes.write_concurrency):
        parser.error("--write-ops: one count per --write-concurrency level")
    if args.out is None and args.report_only:
        args.out = args.report_only.parent
    if args.out is None and not args.only:
        args.out = Path(tempfile.gettempdir()) / "vwserver-bench-quick" if args.quick else DOCS
    return args


def load_baseline(spec: str) -> tuple[Results | None, str]:
    """The results to compare with and where they came from."""
    if spec == "none":
        return None, "no comparison asked for"
    if spec == "committed":
        done = subprocess.run(
            ["git", "-C", str(REPO), "show", f"HEAD:{COMMITTED}"],
            capture_output=True,
            check=False,
        )
        if done.returncode == 0:
            return decode(done.stdout), f"{COMMITTED} as committed at HEAD"
        path = REPO / COMMITTED
    else:
        path = Path(spec)
    if not path.exists():
        return None, f"{path} does not exist"
    return decode(path.read_bytes()), str(path)


async def run_parts(args: argparse.Namespace, results: Results) -> list[str]:
    """Run the chosen parts; a part that fails is reported and the others still run."""
    z: Sizes = args.sizes
    parts: dict[str, Callable[[], Awaitable[None]]] = {
        "list": lambda: bench_lists(results, z.objects, repeat=z.repeat, page_size=args.page_size),
        "watch": lambda: bench_watch(results, events=z.events, repeat=z.repeat),
        "fanout": lambda: bench_fanout(
            results,
            z.watchers,
            events=z.fanout_events,
            spacing=z.fanout_spacing,
            workers=args.workers,
        ),
        "rss": lambda: bench_rss(results, z.rss_watches, settle=z.rss_settle),
        "gets": lambda: bench_gets(
            results,
            concurrency=z.get_concurrency,
            requests=z.get_requests,
            rounds=z.get_rounds,
            install_nginx=args.nginx == "install",
            workers=args.workers,
        ),
        "kcp": lambda: bench_kcp(results, z.kcp_objects, repeat=z.repeat, page_size=args.page_size),
        "writes": lambda: bench_writes(
            results,
            concurrency=z.write_concurrency,
            ops=dict(zip(z.write_concurrency, z.write_ops, strict=True)),
            rounds=z.write_rounds,
            page_size=args.page_size,
        ),
        "consistent": lambda: bench_consistent(
            results,
            z.consistent_objects,
            repeat=z.repeat,
            page_size=args.page_size,
            chunks=z.kubectl_chunks,
            busy=args.consistent_busy,
        ),
        "shards": lambda: bench_shards(
            results,
            ShardSizes(
                objects=z.shard_objects,
                repeat=z.repeat,
                watchers=z.shard_watchers,
                events=z.shard_events,
                page_size=args.page_size,
            ),
        ),
    }
    # SIGINT/SIGTERM cancel the run, so that every process it started is stopped on the way
    # out (a background job's SIGINT may be ignored; SIGTERM would end Python on the spot).
    main_task = asyncio.current_task()
    assert main_task is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, main_task.cancel)
    failed = []
    for part in PARTS:
        if part not in args.parts:
            results.skipped.setdefault(part, "not asked for in this run (--skip/--only)")
            continue
        print(f"\n== {part} ==", flush=True)
        started = time.monotonic()
        try:
            await parts[part]()
        except Exception as e:  # one broken part must not hide the others' results
            traceback.print_exc()
            results.skipped[part] = f"FAILED: {type(e).__name__}: {e}"
            failed.append(part)
        results.seconds[part] = time.monotonic() - started
    return failed


def compare(
    baseline: Results | None, source: str, results: Results
) -> tuple[list[Regression] | None, int]:
    if baseline is None:
        print(f"\nNo comparison: {source}.")
        return None, 0
    worse, common = regressions(baseline, results)
    if baseline.mode != results.mode:
        source += f" (a {baseline.mode} run; this is a {results.mode} run)"
    print(f"\nCompared with {source}:")
    print(compared(worse, common, source))
    return worse, common


def write_report(
    results: Results,
    out: Path,
    comparison: tuple[list[Regression] | None, int],
    baseline: str,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_bytes(encode(results))
    plots = write_plots(results, out)
    worse, common = comparison
    (out / "README.md").write_text(
        markdown(results, regressions=worse, common=common, baseline=baseline)
    )
    print(f"report: {out}/README.md, results.json, {', '.join(plots)}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Read before anything is written: the report may replace that very file.
    baseline, source = load_baseline(args.baseline)
    if args.report_only:
        results = decode(args.report_only.read_bytes())
        write_report(results, args.out, compare(baseline, source, results), source)
        return 0
    results = Results(
        mode="quick" if args.quick else "full",
        taken=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine={},
        load={"before": machine.uptime()},
    )
    measured = machine.commit()
    print(f"vwserver benchmarks ({results.mode}): {', '.join(args.parts)}")
    print(f"load before: {results.load['before']}", flush=True)
    started = time.monotonic()
    try:
        failed = asyncio.run(run_parts(args, results))
    except asyncio.CancelledError:
        print("interrupted: every process the run started is stopped; no report written")
        return 130
    results.load["after"] = machine.uptime()
    results.seconds["total"] = time.monotonic() - started
    results.machine = machine.describe(
        nginx=nginx_version(find_nginx()),
        kcp_used=bool({"kcp", "writes", "consistent", "shards"} & set(args.parts)),
        vwserver=measured,
    )
    if args.kcp_from is not None:
        kcp = decode(args.kcp_from.read_bytes())
        results = with_kcp_part(results, kcp, source=str(args.kcp_from))
    if args.rest_from is not None:
        earlier = decode(args.rest_from.read_bytes())
        results = with_earlier_parts(results, earlier, source=str(args.rest_from))
    print("\n" + "\n".join(f"{k:>9}: {v}" for k, v in results.machine.items()))
    print(f"load after: {results.load['after']}; took {results.seconds['total']:.0f} s")
    for part, why in results.skipped.items():
        print(f"not measured: {part}: {why}")
    comparison = compare(baseline, source, results)
    if args.out is not None:
        write_report(results, args.out, comparison, source)
    if failed:
        print(f"FAILED parts: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
