"""The machine and versions a benchmark ran on, printed with and stored beside its results."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from harness import REPO


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory() -> str:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    return "unknown"


def _kcp_version() -> str:
    for line in (REPO / "scripts" / "kcp" / "go.mod").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "github.com/kcp-dev/kcp":
            return parts[1]
    return "unknown"


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else ""


def commit() -> str:
    """The checked-out commit, and whether the tree has changes (read when a run starts)."""
    head = _git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" + uncommitted changes" if _git("status", "--porcelain") else "")


def uptime() -> str:
    """``uptime``'s line (its load averages say how busy the shared machine was)."""
    done = subprocess.run(["uptime"], capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return " ".join(done.stdout.split())
    return "load average: " + " ".join(Path("/proc/loadavg").read_text().split()[:3])


def describe(*, nginx: str, kcp_used: bool, vwserver: str) -> dict[str, str]:
    return {
        "cpu": _cpu_model(),
        "cores": f"{os.cpu_count()} ({len(os.sched_getaffinity(0))} usable)",
        "memory": _memory(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "aiohttp": metadata.version("aiohttp"),
        "uvloop": metadata.version("uvloop"),
        "msgspec": metadata.version("msgspec"),
        "kcp": _kcp_version() + ("" if kcp_used else " (not used in this run)"),
        "nginx": nginx,
        "vwserver": vwserver,
    }
