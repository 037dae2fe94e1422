"""The demo's printed text (``make run``) without kcp: paths, quoting, one source of commands.

What each line shows is checked against real kcp in ``tests/e2e/test_demo_lines_kcp.py``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from devenv.bootstrap import Bootstrap, Workspace, sample_widgets
from devenv.demo import demo_lines, demo_text, shown_path
from devenv.kcp import KcpInstance

KCP = "https://127.0.0.1:6443"


def _ws(name: str, cluster: str) -> Workspace:
    return Workspace(
        name=name, path=f"root:{name}", cluster=cluster, url=f"{KCP}/clusters/root:{name}"
    )


def _world() -> Bootstrap:
    consumers = (_ws("consumer-a", "aaaa"), _ws("consumer-b", "bbbb"))
    return Bootstrap(
        provider=_ws("provider", "pppp"),
        consumers=consumers,
        export_name="widgets.example.io",
        group="example.io",
        version="v1alpha1",
        resource="widgets",
        vw_urls=(f"{KCP}/services/apiexport/pppp/widgets.example.io",),
        tokens={"alice": "alice-demo-token"},
        widgets=sample_widgets(consumers),
        duration=0.0,
    )


def _kcp(tmp: Path) -> KcpInstance:
    return KcpInstance(
        url=KCP,
        kubeconfig=tmp / "kcp dir" / "admin.kubeconfig",
        ca_file=tmp / "kcp dir" / "ca.crt",
        admin_token="t",
        workdir=tmp,
    )


ENDPOINTS = {
    "prod": "https://127.0.0.1:8443/services/filtered-apiexport/pppp/prod",
    "dev": "https://127.0.0.1:8443/services/filtered-apiexport/pppp/dev",
}


def test_shown_path_is_relative_inside_the_working_directory_else_absolute(
    tmp_path: Path,
) -> None:
    assert shown_path(tmp_path / ".run", tmp_path) == ".run"
    assert shown_path(tmp_path / "x", tmp_path / "elsewhere") == str(tmp_path / "x")


def test_printed_commands_are_exactly_demo_lines_and_survive_spaces_in_paths(
    tmp_path: Path,
) -> None:
    run_dir = "my run"  # a path the shell would split
    world, kcp = _world(), _kcp(tmp_path)
    lines = demo_lines(run_dir=run_dir, kcp=kcp, world=world, endpoints=ENDPOINTS)
    text = demo_text(
        run_dir=run_dir, kcp=kcp, world=world, base="https://127.0.0.1:8443", endpoints=ENDPOINTS
    )
    printed = [p for p in text.splitlines() if p.startswith(("kubectl ", "curl "))]
    assert printed == [line.command for line in lines]
    assert len({line.key for line in lines}) == len(lines)
    for line in lines:
        argv = shlex.split(line.command)
        for flag in ("--kubeconfig", "--cacert", "--certificate-authority"):
            if flag in argv:
                value = argv[argv.index(flag) + 1]
                assert value.startswith(("my run/", str(tmp_path / "kcp dir"))), line.command
    curl = shlex.split(next(line.command for line in lines if line.key == "curl"))
    assert curl[-1] == f"{ENDPOINTS['prod']}/clusters/*/apis/example.io/v1alpha1/widgets"
    assert curl[curl.index("-w") + 1] == "\\nHTTP %{http_code}\\n"  # curl expands the \n
