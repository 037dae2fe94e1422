"""The wheel and the container image ship runtime code only.

The fake kcp (``fakekcp/``), the development environment (``devenv/``), the tests and the scripts
live beside the ``vwserver`` package in the repository. This proves that neither artefact picks
them up: the wheel is built for real from a copy of the repository, and the Docker build context
is computed from ``.dockerignore`` the way the Docker CLI computes it (the last matching rule
wins; a rule that matches a directory matches everything below it).
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parents[2]
# With build isolation: the wheel is built by the setuptools that pyproject.toml requires.
PIP_WHEEL = (sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps")
NOT_SHIPPED = ("fakekcp", "devenv", "tests", "scripts", "clients")


def _tracked_files() -> list[str]:
    result = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return [line for line in result.stdout.splitlines() if (REPO / line).is_file()]


def _rules() -> list[tuple[str, bool]]:
    rules = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.removeprefix("!").strip("/")
        rules.append((pattern, negated))
    return rules


def _matches(pattern: str, path: str) -> bool:
    """Does ``pattern`` match ``path`` or one of its parent directories?"""
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    if pattern.startswith("**/"):
        tail = pattern.removeprefix("**/")
        return any(fnmatch.fnmatchcase(part, tail) for part in parts)
    # Docker's filepath.Match: "*" does not cross "/".
    return any(
        fnmatch.fnmatchcase(c, pattern) and c.count("/") == pattern.count("/") for c in candidates
    )


def docker_context(files: list[str], rules: list[tuple[str, bool]]) -> set[str]:
    included = set()
    for path in files:
        excluded = False
        for pattern, negated in rules:
            if _matches(pattern, path):
                excluded = not negated
        if not excluded:
            included.add(path)
    return included


def test_the_docker_context_holds_the_package_and_nothing_else() -> None:
    context = docker_context(_tracked_files(), _rules())
    assert "vwserver/server.py" in context
    assert "requirements-runtime.lock" in context
    leaked = sorted(p for p in context if p.split("/")[0] in NOT_SHIPPED)
    assert leaked == []
    assert not any("__pycache__" in p or p.endswith(".pyc") for p in context)


def test_the_matcher_would_see_a_leak() -> None:
    """The context computation can fail: without the leading "*" everything is in."""
    files = ["fakekcp/upstream.py", "vwserver/server.py"]
    assert docker_context(files, _rules()) == {"vwserver/server.py"}
    assert docker_context(files, _rules()[1:]) == set(files)
    assert _matches("fakekcp", "fakekcp/upstream.py")
    assert not _matches("vwserver", "fakekcp/upstream.py")
    assert _matches("**/__pycache__", "vwserver/proxy/__pycache__/x.pyc")


def test_the_wheel_holds_the_package_and_nothing_else(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for package in ("vwserver", "fakekcp", "devenv", "tests"):
        shutil.copytree(REPO / package, source / package, ignore=ignore)
    out = tmp_path / "dist"
    subprocess.run(
        [*PIP_WHEEL, "--wheel-dir", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=180,
    )
    (wheel,) = out.glob("vwserver-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert "vwserver" in tops
    assert {t for t in tops if not t.startswith("vwserver")} == set(), tops
    assert not any(name.startswith(("vwserver/testing/", "vwserver/devenv/")) for name in names)
    assert "vwserver/proxy/handler.py" in names
