"""``scripts/bench/run.py --quick`` end to end against the fake upstream (no kcp).

The benchmark's numbers are not checked (they are timings on a shared machine); what is checked
is that a quick run measures every part but those against kcp (the writes and consistent-read
arms: tests/e2e/test_bench_kcp_smoke.py), writes the report (markdown, PNGs, results.json),
keeps fan-out to one upstream watch, says so when nginx is missing instead of dropping the GET
comparison, and compares with the previous results: the baseline below holds impossible ratios
for two keys a quick run produces, so both must be reported as regressions, and a generous one
for a third key, which must not be.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "scripts" / "bench" / "run.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

WORSE = ("fanout.1.p50", "list.fake.cache_rv0.10000")  # any measured value is > 20 % worse
BETTER = "watch.fake.initial_events"  # any measured value is better
ABSENT = "list.kcp.passthrough.100000"  # not measured in this run: not compared


def baseline(path: Path) -> None:
    ratios = {key: {"label": key, "value": 1e-9} for key in WORSE}
    ratios[BETTER] = {"label": BETTER, "value": 1e9}
    ratios[ABSENT] = {"label": ABSENT, "value": 1e-9}
    doc = {"mode": "quick", "taken": "earlier", "machine": {}, "ratios": ratios}
    path.write_text(json.dumps(doc))


def nginx_installed() -> bool:
    return shutil.which("nginx") is not None or os.access("/usr/sbin/nginx", os.X_OK)


def test_quick_run_writes_the_report_and_compares(tmp_path: Path) -> None:
    out = tmp_path / "report"
    baseline(tmp_path / "baseline.json")
    args = [sys.executable, str(RUN), "--quick", "--skip", "kcp,writes,consistent"]
    args += ["--nginx", "if-present"]
    args += ["--out", str(out), "--baseline", str(tmp_path / "baseline.json")]
    # Its own process group: on a timeout the benchmark's children go down with it.
    proc = subprocess.Popen(
        args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"the quick benchmark took over 240 s: {stdout[-3000:]}") from None
    output = stdout + stderr
    assert proc.returncode == 0, output[-4000:]

    for name in ("list.png", "fanout.png", "rss.png", "gets.png"):
        assert (out / name).read_bytes().startswith(PNG_MAGIC), name
    results = json.loads((out / "results.json").read_text())
    report = (out / "README.md").read_text()
    assert results["mode"] == "quick"
    assert {"cpu", "cores", "python", "aiohttp", "kcp", "nginx"} <= set(results["machine"])
    assert set(results["skipped"]) >= {"kcp"}
    for prefix in ("list.fake.", "watch.fake.", "fanout.", "rss.tls.", "get.vwserver."):
        assert any(key.startswith(prefix) for key in results["ratios"]), prefix
    assert [run["upstream_watches"] for run in results["fanout"]] == [1, 1, 1]
    assert all(run["delivered"] == run["watchers"] * run["events"] for run in results["fanout"])

    # The regression comparison, on stdout and in the report.
    assert "2 of 3 ratios got worse by more than 20 %" in stdout, stdout[-3000:]
    for key in WORSE:
        assert f"(`{key}`)" in stdout
        assert f"(`{key}`)" in report
    assert BETTER not in stdout.split("got worse", 1)[1]

    if nginx_installed():
        assert any(key.startswith("get.nginx.") for key in results["ratios"])
    else:
        assert "GET through nginx: NOT MEASURED" in stdout
        assert "nginx is not installed" in results["skipped"]["GET through nginx"]
        assert "GET through nginx: nginx is not installed" in report
