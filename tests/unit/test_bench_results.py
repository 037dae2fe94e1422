"""The benchmark's results model (``scripts/bench/results.py``): the kcp part, which takes over
an hour, measured in a run of its own and merged into a run of the other parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"


def load_results() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_results", BENCH / "results.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # msgspec resolves the Structs' annotations through it
    spec.loader.exec_module(module)
    return module


r = load_results()


def run(*, kcp: bool, fake: float, kcp_ratio: float, note: str) -> object:
    ratios = {"list.fake.cache.10000": r.Ratio(label="fake", value=fake)}
    lists = [r.ListPoint(upstream="fake", path="cache", objects=10, items=5, seconds=fake)]
    if kcp:
        ratios["list.kcp.cache.10000"] = r.Ratio(label="kcp", value=kcp_ratio)
        ratios["watch.kcp.initial_events"] = r.Ratio(label="kcp watch", value=kcp_ratio)
        lists.append(
            r.ListPoint(upstream="kcp", path="cache", objects=10, items=5, seconds=kcp_ratio)
        )
    return r.Results(
        mode="full",
        taken=note,
        machine={"python": "3.11", "kcp": "v0.32.3" if kcp else "not used"},
        load={"before": "load 1", "after": "load 2"},
        seconds={"kcp": 3600.0} if kcp else {"list": 10.0},
        skipped={} if kcp else {"kcp": "not asked for in this run (--skip/--only)"},
        notes=[f"{'kcp' if kcp else 'fake'}: {note}"],
        ratios=ratios,
        lists=lists,
    )


def test_the_kcp_part_of_one_run_joins_the_other_parts_of_another() -> None:
    rest = run(kcp=False, fake=0.5, kcp_ratio=0, note="rest")
    kcp_run = run(kcp=True, fake=9.0, kcp_ratio=0.1, note="kcp run")
    merged = r.with_kcp_part(rest, kcp_run, source="/tmp/kcp/results.json")
    assert merged.ratios["list.fake.cache.10000"].value == 0.5  # the rest's own figure
    assert merged.ratios["list.kcp.cache.10000"].value == 0.1
    assert merged.ratios["watch.kcp.initial_events"].value == 0.1
    assert [(p.upstream, p.seconds) for p in merged.lists] == [("fake", 0.5), ("kcp", 0.1)]
    assert "kcp" not in merged.skipped and merged.seconds["kcp"] == 3600.0
    assert merged.machine["kcp"] == "v0.32.3"
    assert merged.notes[0] == "fake: rest" and merged.notes[-1] == "kcp: kcp run"
    assert "measured in a run of its own (kcp run" in merged.notes[1]
    assert "/tmp/kcp/results.json" in merged.notes[1]


def test_only_a_run_without_kcp_takes_a_kcp_part_that_exists() -> None:
    rest = run(kcp=False, fake=0.5, kcp_ratio=0, note="rest")
    kcp_run = run(kcp=True, fake=9.0, kcp_ratio=0.1, note="kcp run")
    with pytest.raises(ValueError, match="measured the kcp part itself"):
        r.with_kcp_part(kcp_run, kcp_run, source="x")
    with pytest.raises(ValueError, match="has no kcp part"):
        r.with_kcp_part(rest, rest, source="x")


def test_a_run_of_some_parts_takes_the_others_from_earlier_results() -> None:
    """``--only writes,consistent --rest-from docs/bench/results.json``: one report again."""
    earlier = run(kcp=True, fake=0.5, kcp_ratio=0.1, note="earlier")
    earlier.seconds["list"] = 10.0
    earlier.ratios["writes.get.c16.time"] = r.Ratio(label="old writes", value=9.0)
    earlier.seconds["writes"] = 60.0
    now = r.Results(
        mode="quick",
        taken="now",
        machine={"kcp": "v0.32.3"},
        seconds={"writes": 100.0},
        skipped={"list": "not asked for", "kcp": "not asked for"},
        notes=["writes: kcp idle"],
        ratios={"writes.get.c16.time": r.Ratio(label="writes", value=1.1)},
        writes=[
            r.WriteRun(target="slice", verb="get", concurrency=16, ops=1, p50_ms=1, p99_ms=1,
                       rps=1, kcp_cpu_ms=1, kcp_requests=3, kcp_dry_runs=0)
        ],
    )  # fmt: skip
    merged = r.with_earlier_parts(now, earlier, source="docs/bench/results.json")
    assert merged.ratios["writes.get.c16.time"].value == 1.1  # this run's own part wins
    assert merged.ratios["list.fake.cache.10000"].value == 0.5
    assert merged.ratios["list.kcp.cache.10000"].value == 0.1
    assert [p.upstream for p in merged.lists] == ["fake", "kcp"]
    assert len(merged.writes) == 1
    assert merged.seconds == {"writes": 100.0, "kcp": 3600.0, "list": 10.0}
    assert "list" not in merged.skipped and "kcp" not in merged.skipped
    assert merged.notes[0] == "writes: kcp idle"
    assert merged.notes[1].startswith("kcp, list: from an earlier full run (earlier")
    assert merged.notes[-1] == "kcp: earlier"  # the kcp part's own note comes with it
    # Nothing to take: the run is returned as it is.
    assert r.with_earlier_parts(now, now, source="x") is now
