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
