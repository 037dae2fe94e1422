"""vwserver's container image in the tests: built by ``scripts/image/build.sh`` (``make image``)
and run with podman, as a Deployment of ``manifests/`` runs it.

The image is built once per session when collection finishes, and only if a collected test uses
the ``vwserver_image`` fixture (as the Go binaries are, :mod:`tests.support.go_binaries`): a cold
build (a Debian base assembled with mmdebstrap, then the Dockerfile) takes minutes, which must not
count against a test's timeout. Without podman (and no root to install it), or when the build
fails, the tests that need the image skip, or fail with ``CI=true``.

podman runs with the project's settings (``scripts/image/containers.conf`` via
``CONTAINERS_CONF``: runc, cgroupfs, the machine's own ulimits). A container is started in the
foreground (``podman run``, its output to a log file) so that the test holds the process whose
exit code is the container's; :func:`running` removes it whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.kcp import REPO_ROOT

__all__ = [
    "CONTAINERS_CONF",
    "Container",
    "pod_spec",
    "podman",
    "podman_env",
    "podman_options",
    "pytest_collection_finish",
    "running",
    "share_with_fs_group",
    "vwserver_image",
]

IMAGE_SCRIPTS = REPO_ROOT / "scripts" / "image"
CONTAINERS_CONF = IMAGE_SCRIPTS / "containers.conf"
_IMAGE_KEY = pytest.StashKey[str]()  # "ok:<reference>" or why there is no image
#: The group a pod's ``fsGroup`` gives mounted files (the image's USER 65532:65532).
FS_GROUP = 65532


def podman_env() -> dict[str, str]:
    """This environment with the project's podman settings."""
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def build_image(script: str) -> str:
    """Run ``scripts/image/<script>`` (it prints the image reference last); ``ok:<reference>``,
    else why not. Its progress (stderr) passes through."""
    path = IMAGE_SCRIPTS / script
    try:
        done = subprocess.run(
            [str(path)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=1800,
            check=False,
            env=podman_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run {path}: {e}"
    lines = done.stdout.split()
    if done.returncode != 0 or not lines:
        return f"{path} failed with exit code {done.returncode} (see its stderr)"
    return f"ok:{lines[-1]}"


def pytest_collection_finish(session: pytest.Session) -> None:
    if _IMAGE_KEY in session.config.stash:
        return
    if any("vwserver_image" in getattr(item, "fixturenames", ()) for item in session.items):
        session.config.stash[_IMAGE_KEY] = build_image("build.sh")


@pytest.fixture(scope="session")
def vwserver_image(request: pytest.FixtureRequest) -> str:
    """The reference of the image ``make image`` builds (``localhost/vwserver:<key>``)."""
    result = request.config.stash.get(_IMAGE_KEY, "the image build did not run")
    if not result.startswith("ok:"):
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and no vwserver image: {result}", pytrace=False)
        pytest.skip(result)
    return result.removeprefix("ok:")


async def podman(*args: str, timeout: float = 120.0) -> str:
    """``podman ARGS``; its stdout. A non-zero exit fails with podman's stderr."""
    process = await asyncio.create_subprocess_exec(
        "podman",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=podman_env(),
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"podman {' '.join(args)}: no answer within {timeout:.0f} s") from None
    assert process.returncode == 0, f"podman {' '.join(args)}: {err.decode(errors='replace')}"
    return out.decode()


@dataclass(frozen=True, slots=True)
class Container:
    name: str
    process: asyncio.subprocess.Process
    """``podman run`` in the foreground: its exit code is the container's."""
    log_file: Path
    started: float
    """The event loop's clock when ``podman run`` was started."""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    async def signal(self, name: str) -> None:
        await podman("kill", "--signal", name, self.name)

    async def exit_code(self, *, within: float) -> int:
        """The container's exit code once it exits by itself within ``within`` seconds."""
        try:
            return await asyncio.wait_for(self.process.wait(), within)
        except TimeoutError:
            raise AssertionError(
                f"container {self.name} still running after {within:.0f} s:\n{self.log_tail()}"
            ) from None


@contextlib.asynccontextmanager
async def running(
    image: str, args: Sequence[str], *, options: Sequence[str], log_file: Path, prefix: str
) -> AsyncIterator[Container]:
    """``podman run --rm --name <prefix>-<random> OPTIONS IMAGE ARGS`` in the foreground, its
    output in ``log_file``; removed (``podman rm --force``) when the block ends."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    loop = asyncio.get_running_loop()
    with log_file.open("wb") as log:
        started = loop.time()
        process = await asyncio.create_subprocess_exec(
            "podman", "run", "--rm", "--name", name, *options, image, *args,
            stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, env=podman_env(),
        )  # fmt: skip
    try:
        yield Container(name=name, process=process, log_file=log_file, started=started)
    finally:
        if process.returncode is None:
            with contextlib.suppress(AssertionError):
                await podman("rm", "--force", "--time", "0", name, timeout=60)
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()


# --------------------------------------------------------------------------------------------
# A pod of manifests/ as a podman container


def pod_spec(directory: Path) -> dict[str, Any]:
    """The pod template's spec of ``directory``/deployment.yaml."""
    doc = yaml.safe_load((directory / "deployment.yaml").read_text())
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


def podman_options(spec: dict[str, Any], sources: dict[str, Path]) -> list[str]:
    """``podman run`` options for the pod's one container: its security context, its volumes
    (``sources``: volume name -> host directory; the ``emptyDir`` becomes a tmpfs) and the host
    network."""
    (container,) = spec["containers"]
    security = container["securityContext"]
    pod_security = spec["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    options = [
        "--network=host",
        "--read-only",
        "--read-only-tmpfs=false",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        f"--user={pod_security['runAsUser']}:{pod_security['runAsGroup']}",
        f"--group-add={pod_security['fsGroup']}",
    ]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            size = volume["emptyDir"]["sizeLimit"].removesuffix("Mi")
            options.append(f"--tmpfs={mount['mountPath']}:rw,size={size}m,mode=1777")
        else:
            assert mount.get("readOnly") is True
            options.append(f"--volume={sources[mount['name']]}:{mount['mountPath']}:ro")
    return options


def share_with_fs_group(directory: Path) -> None:
    """What ``fsGroup`` and ``defaultMode: 0440`` do to a mounted Secret."""
    os.chown(directory, 0, FS_GROUP)
    directory.chmod(0o750)
    for path in directory.iterdir():
        os.chown(path, 0, FS_GROUP)
        path.chmod(0o440)
