"""The Dockerfile's install steps, executed for real without Docker (no engine exists here).

The build stage's instructions are replayed in order in a temporary directory that stands in
for the image's root: ``COPY`` copies from the repository (leaving out what ``.dockerignore``
leaves out), ``ENV`` sets the environment, ``RUN`` runs the very command line with ``/opt/...``
and ``/src`` moved under that directory, with this machine's Python 3.11 as the base image's
``python``. Then the final stage's environment and ``ENTRYPOINT`` run ``vwserver --help``.

This proves the lock file is complete (``pip check``), that it installs from wheels only, that
nothing but the runtime dependencies ends up in the virtualenv, and that running vwserver writes
nothing into it (read-only root filesystem). What it cannot prove: that the base image builds
the same way (its pip version, its platform's wheels), and the base image digest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.unit.test_dockerfile import DOCKERFILE, REPO, env_pairs, lock, normalize

KNOWN = {"ENV", "COPY", "RUN", "LABEL", "EXPOSE", "USER", "ENTRYPOINT", "CMD", "WORKDIR", "ARG"}


# Where an absolute path of the image starts: /opt/... or /src(/...).
IMAGE_PATH = re.compile(r"(?<![\w.-])(?=/opt/|/src(?:/|\s|$))")


def remap(text: str, *, root: Path) -> str:
    """Absolute image paths (/opt/..., /src) moved under ``root``."""
    return IMAGE_PATH.sub(str(root), text)


def expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)


def base_environment(root: Path) -> dict[str, str]:
    """This machine's environment (pip and network settings) with the base image's PATH:
    ``python`` is this interpreter's base Python, as ``python`` is in the python image."""
    bin_dir = root / "usr-local-bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys._base_executable)  # type: ignore[attr-defined]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PATH", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}
    }
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    env["HOME"] = str(root / "home")
    return env


def copy_into(args: str, *, root: Path) -> None:
    *sources, dest = args.split()
    assert not any(s.startswith("--") for s in sources), f"unsupported COPY flags: {args}"
    target = Path(remap(dest, root=root))
    for source in sources:
        src = REPO / source
        to = target / src.name if dest.endswith("/") else target
        to.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():  # .dockerignore: **/__pycache__, **/*.pyc
            shutil.copytree(src, to, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, to)


def files_under(path: Path) -> set[Path]:
    return set(path.rglob("*"))


def test_build_stage_installs_and_vwserver_runs(tmp_path: Path) -> None:
    root = tmp_path / "image"
    env = base_environment(root)
    for keyword, args in DOCKERFILE.stage("build").instructions:
        assert keyword in KNOWN, f"the replay does not know {keyword}: extend it"
        if keyword == "ENV":
            env |= {k: expand(remap(v, root=root), env) for k, v in env_pairs(args).items()}
        elif keyword == "COPY":
            copy_into(args, root=root)
        elif keyword == "RUN":
            result = subprocess.run(
                ["/bin/sh", "-c", remap(args, root=root)],
                env=env,
                cwd=root,
                capture_output=True,
                text=True,
                timeout=240,
            )
            assert result.returncode == 0, f"RUN {args}\n{result.stdout}\n{result.stderr}"

    venv = root / "opt" / "vwserver"
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    installed = {
        normalize(d.name.removesuffix(".dist-info").rsplit("-", 1)[0])
        for d in (site / "site-packages").glob("*.dist-info")
    }
    runtime = set(lock(REPO / "requirements-runtime.lock"))
    assert installed == runtime | {"vwserver"}, "the virtualenv holds exactly the runtime lock"
    assert not (venv / "bin" / "pip").exists()
    packages = {p.name for p in (site / "site-packages").iterdir() if p.is_dir()}
    assert not packages & {"fakekcp", "devenv", "tests"}, "test support or dev tooling shipped"
    assert not (site / "site-packages" / "vwserver" / "testing").exists()

    # The final stage: its ENV and ENTRYPOINT, on the virtualenv copied from the build stage.
    final = DOCKERFILE.final
    assert final.all("COPY") == ["--from=build /opt/vwserver /opt/vwserver"]
    run_env = base_environment(tmp_path / "final")
    for args in final.all("ENV"):
        run_env |= {k: expand(remap(v, root=root), run_env) for k, v in env_pairs(args).items()}
    (entrypoint,) = final.all("ENTRYPOINT")
    before = files_under(venv)
    for extra in (["--help"], ["kubeconfig", "--help"]):
        result = subprocess.run(
            [*json.loads(entrypoint), *extra],
            env=run_env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert "usage: vwserver" in result.stdout
    assert shutil.which("vwserver", path=run_env["PATH"]) == str(venv / "bin" / "vwserver")
    assert files_under(venv) == before, "running vwserver wrote into the image's virtualenv"
