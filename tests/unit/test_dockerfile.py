"""What the Dockerfile's text says, checked without building it.

The instructions are parsed (line continuations, comments, ``ARG`` defaults) and checked for the
properties that matter in production: a base image pinned by patch version and digest (the
default for users; the tests build on a local base where it cannot be pulled), a numeric
non-root ``USER``, an exec-form ``ENTRYPOINT``, no bytecode writes at runtime, and an install
from the runtime lock only. ``tests/image/`` builds the image with podman and checks what it
holds and how it runs. Not verified anywhere: the default base's digest (no registry here).
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


@dataclass
class Dockerfile:
    args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)


def parse_dockerfile(text: str) -> Dockerfile:
    """Instructions per stage, continuation lines joined (whitespace runs collapsed, which is
    fine for the checks here); global ARG defaults substituted."""
    logical: list[str] = []
    current = ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):  # comment lines inside a continuation are skipped
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        logical.append(" ".join((current + line).split()))
        current = ""
    assert not current, "Dockerfile ends inside a line continuation"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.strip().partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            image, *alias = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest).split()
            name = alias[1] if len(alias) == 2 and alias[0].upper() == "AS" else None
            stages.append(Stage(base=image, name=name))
        elif not stages and keyword == "ARG":
            key, _, default = rest.partition("=")
            args[key] = default
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, rest))
    return Dockerfile(args=args, stages=stages)


def env_pairs(args: str) -> dict[str, str]:
    """``ENV A=1 B=2`` (the only ENV form used here)."""
    pairs = dict(p.split("=", 1) for p in args.split())
    return {k: v.strip('"') for k, v in pairs.items()}


def lock(path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"{path.name}: not pinned: {line}"
            pins[normalize(name)] = version
    return pins


def normalize(name: str) -> str:
    """PEP 503 project name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
    return normalize(re.split(r"[\s<>=!~;\[]", spec, maxsplit=1)[0])


DOCKERFILE = parse_dockerfile((REPO / "Dockerfile").read_text())
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_base_image_is_pinned_by_patch_version_and_digest() -> None:
    python = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    for stage in DOCKERFILE.stages:
        if stage.base == "build":
            continue
        m = re.fullmatch(
            r"python:(?P<version>\d+\.\d+)\.\d+-slim(-[a-z]+)?@sha256:[0-9a-f]{64}", stage.base
        )
        assert m, f"base image not pinned by patch version and digest: {stage.base}"
        assert m["version"] == python
    assert len({s.base for s in DOCKERFILE.stages}) == 1, "stages use different base images"


def test_final_stage_runs_vwserver_as_numeric_non_root() -> None:
    final = DOCKERFILE.final
    (user,) = final.all("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0, f"USER must be a numeric non-root uid: {user}"
    assert not gid or (gid.isdigit() and int(gid) > 0)
    (entrypoint,) = final.all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["vwserver"]  # exec form: signals reach vwserver
    (cmd,) = final.all("CMD")
    assert json.loads(cmd)[0] == "serve"
    env: dict[str, str] = {}
    for args in final.all("ENV"):
        env |= env_pairs(args)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # read-only root filesystem
    assert env["PYTHONUNBUFFERED"] == "1"  # logs leave the container at once
    assert env["PATH"].startswith("/opt/vwserver/bin:")
    # nothing is installed in the final stage; the virtualenv comes from the build stage
    assert not final.all("RUN")
    assert final.all("COPY") == ["--from=build /opt/vwserver /opt/vwserver"]


def test_build_installs_the_runtime_lock_only() -> None:
    build = DOCKERFILE.stage("build")
    runs = " ".join(build.all("RUN"))
    assert "-r /src/requirements-runtime.lock" in runs
    assert "requirements.lock" not in runs.replace("requirements-runtime.lock", "")
    assert runs.count("--no-deps") == 2  # the lock is complete; pip check proves it
    assert "pip --python /opt/vwserver/bin/python check" in runs
    assert "--without-pip" in runs  # no pip in the image's virtualenv


def test_runtime_lock_is_the_locked_runtime_subset() -> None:
    full = lock(REPO / "requirements.lock")
    runtime = lock(REPO / "requirements-runtime.lock")
    differ = sorted(runtime.items() - full.items())
    assert not differ, (
        f"requirements-runtime.lock pins {differ} unlike requirements.lock: make lock"
    )
    direct = {requirement_name(d) for d in PYPROJECT["project"]["dependencies"]}
    assert direct <= set(runtime), f"runtime dependencies missing: {direct - set(runtime)}"
    dev = {requirement_name(d) for d in PYPROJECT["project"]["optional-dependencies"]["dev"]}
    assert not dev & set(runtime), f"dev tools in the runtime lock: {dev & set(runtime)}"


def test_dockerignore_lets_in_exactly_what_is_copied() -> None:
    rules = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*"
    allowed = {r.removeprefix("!").rstrip("/") for r in rules if r.startswith("!")}
    copied = {
        src.rstrip("/")
        for args in DOCKERFILE.stage("build").all("COPY")
        for src in args.split()[:-1]
    }
    assert copied == allowed


def test_parser_handles_continuations_comments_and_args() -> None:
    parsed = parse_dockerfile(
        "# comment\nARG IMG=python:3.11.1-slim\nFROM ${IMG} AS b\nRUN a \\\n"
        "    # inner comment\n    && b\nFROM ${IMG}\nUSER 1:2\n"
    )
    assert [(s.base, s.name) for s in parsed.stages] == [
        ("python:3.11.1-slim", "b"),
        ("python:3.11.1-slim", None),
    ]
    assert parsed.stage("b").all("RUN") == ["a && b"]
    assert parsed.final.all("USER") == ["1:2"]


def test_pip_ca_is_a_build_secret_of_the_build_stage_only() -> None:
    """pip's CA bundle (a TLS-inspecting proxy's) comes as the build secret ``pip-ca`` for the
    RUN steps that reach PyPI, and ``PIP_CERT`` is an ARG of the build stage: neither reaches
    the final stage (``tests/image/test_image_contents.py`` checks the built image)."""
    build = DOCKERFILE.stage("build")
    assert build.all("ARG") == ["PIP_CERT"]
    pip_runs = [r for r in build.all("RUN") if " pip " in r and " install " in r]
    assert len(pip_runs) == 2
    assert all(r.startswith("--mount=type=secret,id=pip-ca ") for r in pip_runs)
    final = DOCKERFILE.final
    assert not final.all("ARG")
    assert not any("PIP_CERT" in args or "pip-ca" in args for _, args in final.instructions)
