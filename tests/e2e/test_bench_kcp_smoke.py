"""``scripts/bench/run.py --only writes,consistent`` end to end at a tiny size, against the real
kcp each arm starts (issue 23's benchmark arms).

No timing is checked (timings on a shared machine are not test material); what is checked is
that both arms run every verb and read path, count work from kcp's and vwserver's metrics,
produce their ratios, plots and report sections, and that the regression check covers them: the
baseline below holds impossible ratios for two keys of the new arms, which must be reported as
regressions, and a generous one for a third, which must not be.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "scripts" / "bench" / "run.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VERBS = ("create", "get", "update", "merge_patch", "json_patch", "apply", "status_patch", "delete")
LEVELS = (1, 4)
COUNTS = (10, 30)
WORSE = ("writes.merge_patch.c1.p50", "consistent.list.10")  # any measured value is > 20 % worse
BETTER = "writes.get.c4.time"  # any measured value is better


def baseline(path: Path) -> None:
    ratios = {key: {"label": key, "value": 1e-9} for key in WORSE}
    ratios[BETTER] = {"label": BETTER, "value": 1e9}
    path.write_text(
        json.dumps({"mode": "quick", "taken": "earlier", "machine": {}, "ratios": ratios})
    )


@pytest.mark.timeout(900)
def test_writes_and_consistent_arms_run_and_compare(tmp_path: Path, kcp_binary: Path) -> None:
    out = tmp_path / "report"
    baseline(tmp_path / "baseline.json")
    args = [sys.executable, str(RUN), "--only", "writes,consistent", "--quick"]
    args += ["--write-concurrency", ",".join(map(str, LEVELS)), "--write-ops", "3,8"]
    args += ["--write-rounds", "1", "--consistent-objects", ",".join(map(str, COUNTS))]
    args += ["--repeat", "1", "--out", str(out), "--baseline", str(tmp_path / "baseline.json")]
    env = {**os.environ, "KCP_BINARY": str(kcp_binary)}
    # Its own process group: on a timeout the benchmark's children (kcp too) go down with it.
    proc = subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=840)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the run stops kcp and vwserver on SIGTERM
        stdout, stderr = proc.communicate(timeout=60)
        raise AssertionError(f"the tiny kcp benchmark took over 840 s: {stdout[-3000:]}") from None
    output = stdout + stderr
    assert proc.returncode == 0, output[-4000:]

    results = json.loads((out / "results.json").read_text())
    ratios = results["ratios"]
    for verb in VERBS:
        for key in ("c1.p50", "c1.p99", "c4.time", "kcp_cpu", "kcp_requests", "upstream"):
            assert f"writes.{verb}.{key}" in ratios, (verb, key)
    runs = {(w["target"], w["verb"], w["concurrency"]): w for w in results["writes"]}
    assert set(runs) == {(t, v, c) for t in ("direct", "slice") for v in VERBS for c in LEVELS}
    for (target, verb, c), run in runs.items():
        assert run["ops"] == (3 if c == 1 else 8), (target, verb, c)
        # kcp counted the requests of every operation (the VW's and the shard's), and every
        # operation through the slice cost vwserver at least one request to kcp.
        assert run["kcp_requests"] >= 1, (target, verb, c, run)
        if target == "slice":
            assert run["upstream_requests"] >= 1, (verb, c, run)
            assert run["proxy_cpu_ms"] > 0, (verb, c, run)

    for n in COUNTS:
        for key in ("list", "list_rv0", "kubectl", "kubectl_chunk0", "list_upstream"):
            assert f"consistent.{key}.{n}" in ratios, (key, n)
    paths = {p["path"] for p in results["consistent"]}
    assert {"direct", "cache", "direct rv=0", "cache rv=0"} <= paths
    assert {"kubectl get, slice", "kubectl get --chunk-size=0, direct"} <= paths
    # Every path answered the same objects: the slice's (env=prod), four of the demo's beside.
    for p in results["consistent"]:
        assert p["items"] == p["objects"] + 4, p

    for name in ("writes.png", "consistent.png"):
        assert (out / name).read_bytes().startswith(PNG_MAGIC), name
    report = (out / "README.md").read_text()
    assert "## Writes: every verb through a cached slice and directly" in report
    assert "## Consistent reads" in report
    assert "| merge patch |" in report  # the per-verb summary table

    # The regression comparison covers the new arms.
    assert "2 of 3 ratios got worse by more than 20 %" in stdout, stdout[-3000:]
    for key in WORSE:
        assert f"(`{key}`)" in stdout
        assert f"(`{key}`)" in report
    assert BETTER not in stdout.split("got worse", 1)[1]
