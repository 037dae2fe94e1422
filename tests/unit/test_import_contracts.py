"""Import contracts of the shipped package, checked on every ``make test``.

Layers, top to bottom; a module may import its own layer's package and anything below it, never
above (the architecture picture in docs/architecture.md):

    cli
    server, listener, syncer, clientconfig, workers (the commands' assembly)
    proxy, controller                             (request path, slice control loop)
    auth, routes, cache
    k8s, selector, config                         (control-loop layer, pure logic, config base)
    errors, clock, logs, metrics, health, files   (leaves)

proxy, controller and syncer are independent of each other, and nothing in the package imports
test support or the development environment.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vwserver"

LAYERS: list[set[str]] = [
    {"cli", "__main__"},
    {"server", "listener", "syncer", "clientconfig", "workers"},
    {"proxy", "controller"},
    {"auth", "routes", "cache"},
    {"k8s", "selector", "holds", "related", "config", "names"},
    {"errors", "clock", "logs", "metrics", "health", "files", "__init__"},
]
INDEPENDENT = ("proxy", "controller", "syncer")
# Top-level packages of the repository that are not shipped: test support and dev tooling.
NOT_SHIPPED = ("fakekcp", "devenv", "tests")


def _top(module: str) -> str:
    """``vwserver.proxy.watch`` → ``proxy``; ``vwserver.errors`` → ``errors``."""
    return module.split(".")[1] if "." in module else "__init__"


def _layer(top: str) -> int:
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise AssertionError(f"vwserver.{top} is in no layer of {__file__}: add it")


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        yield ".".join(parts), path


def _imports(module: str, path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target
            for alias in node.names:  # "from vwserver import x" imports vwserver.x
                if target == "vwserver":
                    yield f"vwserver.{alias.name}"


def _violations() -> list[str]:
    found = []
    for module, path in _modules():
        top = _top(module)
        for target in _imports(module, path):
            if target.split(".")[0] in NOT_SHIPPED:
                found.append(f"{module} imports {target} (test support / dev tooling)")
                continue
            if target == "vwserver" or not target.startswith("vwserver."):
                continue
            other = _top(target)
            if other == top:
                continue
            if top in INDEPENDENT and other in INDEPENDENT:
                found.append(f"{module} imports {target} ({top} and {other} are independent)")
            elif _layer(other) < _layer(top):
                found.append(f"{module} imports {target} (an upper layer)")
    return found


def test_the_package_keeps_its_import_contracts() -> None:
    assert _violations() == []


@pytest.mark.parametrize(
    "planted", ["vwserver.server", "fakekcp.upstream", "devenv.kcp", "tests.support.serve"]
)
def test_the_checker_finds_a_violation(
    planted: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The contract test can fail: an upward (or test-support) import planted in selector.py."""
    real = PACKAGE / "selector.py"
    original = real.read_text()
    fake = tmp_path / "vwserver"
    fake.mkdir()
    for path in PACKAGE.glob("*.py"):
        (fake / path.name).write_text(path.read_text())
    (fake / "selector.py").write_text(f"import {planted}\n" + original)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert any("selector imports" in v for v in _violations())
