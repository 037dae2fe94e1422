"""The API manifests are generated from one schema and must not drift from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_generated_manifests_are_fresh() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen-manifests.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
