"""Files that hold a key or a token are private from their first byte (issue #22, finding 13).

``make run`` wrote ``.run/tls.key`` and the slices' kubeconfigs (alice's token) with mode 0644.
Every such file the project writes now goes through :func:`vwserver.files.write_private`:
created 0600 (``O_CREAT | O_EXCL``, never chmod-ed afterwards), an existing file replaced by a
rename, so that a reader holding the old file open never sees the new content. The tests run
under umask 0, so that a mode that comes from the umask and not from the creation shows.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devenv.bootstrap import Workspace
from devenv.demo import write_kubeconfigs, write_server_files
from devenv.kcp import KcpInstance
from vwserver.cli import main
from vwserver.files import write_private

PRIVATE = 0o600


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_is_created_private(tmp_path: Path) -> None:
    path = tmp_path / "key"
    write_private(path, "secret")
    assert (mode(path), path.read_text()) == (PRIVATE, "secret")
    assert [p.name for p in tmp_path.iterdir()] == ["key"]  # no temporary file left


def test_an_existing_file_is_replaced_and_an_old_reader_never_sees_the_new_content(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("old")
    path.chmod(0o644)
    with path.open() as reader:  # opened while the file was world-readable
        write_private(path, b"new token")
        assert reader.read() == "old"
    assert (mode(path), path.read_bytes()) == (PRIVATE, b"new token")
    assert [p.name for p in tmp_path.iterdir()] == ["kubeconfig"]


def test_a_symlink_keeps_pointing_at_its_target_which_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "real"
    target.write_text("old")
    target.chmod(0o644)
    link = tmp_path / "link"
    link.symlink_to(target)
    write_private(link, "new")
    assert link.is_symlink()
    assert (mode(target), target.read_text()) == (PRIVATE, "new")


def test_a_stream_is_written_as_it_is(tmp_path: Path) -> None:
    write_private(Path(os.devnull), "anything")  # neither replaced nor chmod-ed
    assert Path(os.devnull).is_char_device()


def _kcp(tmp_path: Path) -> KcpInstance:
    admin = tmp_path / "kcp" / "admin.kubeconfig"
    admin.parent.mkdir(parents=True)
    admin.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "kcp-admin", "user": {"token": "admin-token"}}],
                "contexts": [{"name": "base", "context": {"cluster": "k", "user": "kcp-admin"}}],
            }
        )
    )
    return KcpInstance(
        url="https://127.0.0.1:6443",
        kubeconfig=admin,
        ca_file=tmp_path / "kcp" / "ca.crt",
        admin_token="admin-token",
        admin_context="base",
        workdir=tmp_path,
    )


def test_the_demo_writes_its_key_and_kubeconfigs_private(tmp_path: Path) -> None:
    run_dir = tmp_path / ".run"
    api = Workspace(name="vw", path="root:vw", cluster="vvvv", url="https://kcp/clusters/root:vw")
    write_server_files(run_dir, kcp=_kcp(tmp_path), api=api, port=8443)
    write_kubeconfigs(run_dir, {"prod": "https://127.0.0.1:8443/x/prod"}, token="alice-token")
    assert mode(run_dir) == 0o700
    assert mode(run_dir / "tls.key") == PRIVATE
    assert mode(run_dir / "prod.kubeconfig") == PRIVATE
    assert "alice-token" in (run_dir / "prod.kubeconfig").read_text()
    # written again over the files of an earlier run (make run twice)
    (run_dir / "tls.key").chmod(0o644)
    write_server_files(run_dir, kcp=_kcp(tmp_path / "again"), api=api, port=8443)
    assert mode(run_dir / "tls.key") == PRIVATE
    # what holds neither stays readable
    for public in ("ca.crt", "tls.crt", "vwserver.yaml"):
        assert "PRIVATE KEY" not in (run_dir / public).read_text()


def test_the_admin_kubeconfigs_of_the_dev_environment_are_private(tmp_path: Path) -> None:
    """What ``devenv.seed_story.write_syncer_files`` writes for the syncer (kcp-admin's token)."""
    path = tmp_path / "kcp.kubeconfig"
    _kcp(tmp_path).write_admin_kubeconfig(path, server="https://127.0.0.1:6443")
    assert mode(path) == PRIVATE
    assert "admin-token" in path.read_text()


def _source(path: Path, *, token: str) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "k", "cluster": {"server": "https://kcp.example.com"}}],
                "users": [{"name": "alice", "user": {"token": token}}],
                "contexts": [{"name": "alice", "context": {"cluster": "k", "user": "alice"}}],
                "current-context": "alice",
            }
        )
    )


def test_vwserver_kubeconfig_writes_its_output_private(tmp_path: Path) -> None:
    source = tmp_path / "source.kubeconfig"
    _source(source, token="alice-token")
    endpoint = "https://vw.example.com/services/filtered-apiexport/2fx3m0rnxzbs8mq9/prod"
    out = tmp_path / "prod.kubeconfig"
    argv = ["kubeconfig", "--endpoint", endpoint, "--kubeconfig", str(source), "-o", str(out)]
    assert main(argv) == 0
    assert mode(out) == PRIVATE
    assert "alice-token" in out.read_text()
    out.chmod(0o644)
    _source(source, token="rotated-token")
    with out.open() as reader:  # opened while the file was world-readable
        assert main(argv) == 0
        old = reader.read()
    assert "alice-token" in old and "rotated-token" not in old  # the old file, still whole
    assert mode(out) == PRIVATE
    assert "rotated-token" in out.read_text()
