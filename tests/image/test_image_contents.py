"""What the image built by ``make image`` holds, read from the image itself with podman.

The virtualenv holds exactly the runtime lock and vwserver (no pip, no test support, no dev
tools); the image runs as the Dockerfile's numeric non-root user with a read-only root
filesystem; and the CA bundle that pip used during the build (this machine's, given as a build
secret) is in no layer of the image and in none of its configuration. The Dockerfile's text is
checked in ``tests/unit/test_dockerfile.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.podman import podman_env
from tests.unit.test_dockerfile import DOCKERFILE, REPO, lock, normalize

VENV = Path("opt/vwserver")
SITE = VENV / "lib" / "python3.11" / "site-packages"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
#: Where the Dockerfile's build secret is mounted during the build.
SECRET_PATH = "run/secrets/pip-ca"
PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\s+(.+?)-----END CERTIFICATE-----", re.DOTALL)


def _podman(*args: str) -> str:
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=300, env=podman_env()
    )
    assert done.returncode == 0, f"podman {' '.join(args)}: {done.stderr}"
    return done.stdout


@contextlib.contextmanager
def mounted(image: str) -> Iterator[Path]:
    """The image's root filesystem (``podman image mount``), read-only to the test."""
    root = Path(_podman("image", "mount", image).strip())
    try:
        yield root
    finally:
        _podman("image", "unmount", image)


def test_virtualenv_holds_exactly_the_runtime_lock(vwserver_image: str) -> None:
    with mounted(vwserver_image) as root:
        site = root / SITE
        installed = {
            normalize(d.name.removesuffix(".dist-info").rsplit("-", 1)[0])
            for d in site.glob("*.dist-info")
        }
        runtime = set(lock(REPO / "requirements-runtime.lock"))
        assert installed == runtime | {"vwserver"}, "the virtualenv holds exactly the runtime lock"
        bin_dir = root / VENV / "bin"
        assert (bin_dir / "vwserver").is_file()
        assert not list(bin_dir.glob("pip*")), "pip in the image's virtualenv"
        packages = {p.name for p in site.iterdir() if p.is_dir()}
        assert not packages & {"fakekcp", "devenv", "tests", "scripts", "clients"}
        assert not (site / "vwserver" / "testing").exists()
        # compiled at build time: a read-only root filesystem needs no bytecode writes
        sources = list((site / "vwserver").rglob("*.py"))
        assert sources
        assert all(list(s.parent.glob(f"__pycache__/{s.stem}.cpython-311*.pyc")) for s in sources)
        assert not (root / "src").exists(), "the build stage's sources shipped"


def test_config_runs_vwserver_as_numeric_non_root(vwserver_image: str) -> None:
    (config,) = json.loads(_podman("image", "inspect", vwserver_image))
    image = config["Config"]
    final = DOCKERFILE.final
    (user,) = final.all("USER")
    assert image["User"] == user == "65532:65532"
    assert image["Entrypoint"] == ["vwserver"]
    assert image["Cmd"] == ["serve", "--config", "/etc/vwserver/config/config.yaml"]
    env = dict(e.split("=", 1) for e in image["Env"])
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PATH"].startswith("/opt/vwserver/bin:")
    assert not {k for k in env if k.startswith("PIP_")}, "pip settings of the build shipped"


def test_runs_with_a_read_only_root_filesystem(vwserver_image: str) -> None:
    """The final stage's user, ``--read-only`` and no writable path at all: the CLI runs, and
    the uid is the image's."""
    common = ["run", "--rm", "--read-only", "--read-only-tmpfs=false", "--cap-drop=ALL"]
    out = _podman(*common, vwserver_image, "kubeconfig", "--help")
    assert "usage: vwserver" in out
    uid = _podman(
        *common,
        "--entrypoint",
        "python",
        vwserver_image,
        "-c",
        "import os, vwserver; print(os.getuid(), os.getgid(), vwserver.__file__)",
    ).split()
    assert uid == ["65532", "65532", f"/{SITE}/vwserver/__init__.py"]


def _layers(image: str, directory: Path) -> Iterator[tuple[int, tarfile.TarFile]]:
    """Every layer of ``image`` (``podman save``), bottom first, with its index."""
    archive = directory / "image.tar"
    _podman("save", "--format", "docker-archive", "--output", str(archive), image)
    with tarfile.open(archive) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
        (entry,) = manifest
        for index, layer in enumerate(entry["Layers"]):
            member = outer.extractfile(layer)
            assert member is not None
            with tarfile.open(fileobj=io.BytesIO(member.read())) as inner:
                yield index, inner


def _certificates(data: bytes) -> set[bytes]:
    """The certificates PEM-encoded in ``data``, as base64 without whitespace."""
    if b"CERTIFICATE" not in data:
        return set()
    return {b"".join(m.split()) for m in PEM.findall(data)}


def test_build_ca_bundle_is_in_no_layer(
    vwserver_image: str, tmp_path: Path, observe: Callable[[str], None]
) -> None:
    """pip trusted ``/etc/ssl/certs/ca-certificates.crt`` of this machine during the build (the
    build secret): no layer holds that file or the secret's mount point, and no layer the
    Dockerfile added holds a certificate of that bundle which the base image lacks (such as a
    TLS-inspecting proxy's CA; the base is built without this machine's bundle)."""
    if not HOST_CA_BUNDLE.is_file():
        pytest.fail(f"{HOST_CA_BUNDLE} missing: the build's secret came from there")
    host = HOST_CA_BUNDLE.read_bytes()
    (config,) = json.loads(_podman("image", "inspect", vwserver_image))
    base = config["Config"]["Labels"]["io.vwserver.base"]
    (base_config,) = json.loads(_podman("image", "inspect", base))
    base_layers = len(base_config["RootFS"]["Layers"])
    assert config["RootFS"]["Layers"][:base_layers] == base_config["RootFS"]["Layers"]
    in_base: set[bytes] = set()
    added: dict[str, set[bytes]] = {}  # file in a layer above the base -> its certificates
    seen = 0
    for index, layer in _layers(vwserver_image, tmp_path):
        for member in layer:
            assert member.name.lstrip("./") != SECRET_PATH, f"{member.name} in a layer"
            if not member.isfile():
                continue
            data = layer.extractfile(member).read()  # type: ignore[union-attr]
            seen += 1
            assert data != host, f"{member.name} is the build's CA bundle"
            if index < base_layers:
                in_base |= _certificates(data)
            elif certs := _certificates(data):
                added[member.name] = certs
    assert seen > 1000  # the layers were read
    host_only = _certificates(host) - in_base
    observe(f"{len(host_only)} certificates of {HOST_CA_BUNDLE} are not in the base image")
    for name, certs in added.items():
        assert not certs & host_only, f"{name} holds certificates of the build's CA bundle"
    history = _podman("history", "--no-trunc", "--format", "{{.CreatedBy}}", vwserver_image)
    assert "pip-ca" not in json.dumps(config) + history
    assert "PIP_CERT" not in json.dumps(config) + history
