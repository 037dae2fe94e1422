"""What ``make run`` prints is tested: every kubectl and curl line, run exactly as printed.

The demo's lines come from one pure function, :func:`devenv.demo.demo_lines`; the demo
prints them (:func:`~devenv.demo.demo_text`) and this module runs each one with
``bash -c`` from the directory they were rendered for, against a vwserver started by the demo's
own :func:`~devenv.demo.serve_demo` on the session's kcp (real ``vwserver serve`` in kcp
mode, over TLS, kubeconfigs written by the demo). Each line's output is checked against what kcp
itself holds (read as kcp-admin), so other tests' objects never confuse the comparison.

The demo server is started the hard way: the first port it is given is already taken by another
listener (the race between finding a free port and binding it), and it must come up on another.

vwserver's API is installed in ``root:vwserver-api``, the workspace the controller tests use: an
APIBinding's export cannot change, so every test that binds it in the provider must agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from devenv import demo as demo_module
from devenv.bootstrap import Bootstrap
from devenv.demo import (
    SLICES,
    DemoLine,
    DemoServer,
    demo_lines,
    demo_text,
    demo_widget,
    serve_demo,
    shown_path,
)
from devenv.kcp import KcpInstance
from devenv.slices import KIND
from tests.e2e.controller_env import API_WS
from tests.support import printed as printed_lines
from tests.support.printed import Ran

TIMEOUT = 30.0  # seconds for any one command or awaited output


@dataclass(frozen=True, kw_only=True)
class Demo:
    kcp: KcpInstance
    world: Bootstrap
    server: DemoServer
    lines: dict[str, DemoLine]
    printed: list[str]
    cwd: Path
    env: dict[str, str]
    taken_port: int
    log: Path


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def demo(
    kcp: KcpInstance, world: Bootstrap, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Demo]:
    cwd = tmp_path_factory.mktemp("demo")  # where the user started `make run`
    run_dir = cwd / ".run"
    log = cwd / "vwserver.log"
    # Another process holds the first port the demo picks: vwserver must come up elsewhere.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    taken_port = taken.getsockname()[1]
    real_port = demo_module._port
    picks: list[int] = []

    def racing_port(preferred: int) -> int:
        picks.append(preferred)
        return taken_port if len(picks) == 1 else real_port(preferred)

    with taken, log.open("w") as sink, pytest.MonkeyPatch.context() as patch:
        patch.setattr(demo_module, "_port", racing_port)
        try:
            async with serve_demo(
                kcp, world, run_dir=run_dir, port=0, api_workspace=API_WS, log=sink
            ) as server:
                shown = shown_path(run_dir, cwd)
                lines = demo_lines(run_dir=shown, kcp=kcp, world=world, endpoints=server.endpoints)
                text = demo_text(
                    run_dir=shown,
                    kcp=kcp,
                    world=world,
                    base=server.base,
                    endpoints=server.endpoints,
                )
                env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
                env["HOME"] = str(cwd / "home")  # kubectl's discovery cache
                yield Demo(
                    kcp=kcp,
                    world=world,
                    server=server,
                    lines={line.key: line for line in lines},
                    printed=text.splitlines(),
                    cwd=cwd,
                    env=env,
                    taken_port=taken_port,
                    log=log,
                )
        finally:  # the slices would point at a stopped server
            await kcp.kubectl(
                "delete", KIND, *SLICES, "--ignore-not-found", server=world.provider.url
            )


# --------------------------------------------------------------------------------------------
# Helpers


async def run_line(demo: Demo, key: str) -> Ran:
    """Run the printed line ``key`` as printed, from the directory it was printed for."""
    return await printed_lines.run_line(demo, key, timeout=TIMEOUT)


def table(stdout: str) -> list[dict[str, str]]:
    """kubectl's table output as rows (cells cut at the header's column starts)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "no table"
    header = lines[0]
    names = header.split()
    starts = []
    at = 0
    for name in names:
        at = header.index(name, at)
        starts.append(at)
        at += len(name)
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    return [
        {n: row[a:b].strip() for n, (a, b) in zip(names, bounds, strict=True)} for row in lines[1:]
    ]


def status_and_body(stdout: str) -> tuple[int, Any]:
    """A printed curl line's output: the JSON body, then ``HTTP <code>`` on the last line."""
    body, _, last = stdout.rstrip("\n").rpartition("\n")
    assert last.startswith("HTTP "), stdout[-500:]
    return int(last.removeprefix("HTTP ")), json.loads(body)


async def kcp_widgets(demo: Demo, server: str, *selector: str) -> list[dict[str, Any]]:
    """Widgets as kcp-admin sees them, straight from kcp (the ground truth)."""
    out = await demo.kcp.kubectl("get", "widgets", "-A", *selector, "-o", "json", server=server)
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


async def prod_truth(demo: Demo, cluster: str = "*") -> list[dict[str, Any]]:
    return await kcp_widgets(demo, f"{demo.world.vw_url}/clusters/{cluster}", "-l", "env=prod")


def ns_names(items: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    return Counter((i["metadata"]["namespace"], i["metadata"]["name"]) for i in items)


def identities(items: list[dict[str, Any]]) -> Counter[tuple[str, str, str]]:
    """(logical cluster, namespace, name) of each item: unique across workspaces."""
    return Counter(
        (
            i["metadata"]["annotations"]["kcp.io/cluster"],
            i["metadata"]["namespace"],
            i["metadata"]["name"],
        )
        for i in items
    )


def row_keys(rows: list[dict[str, str]]) -> Counter[tuple[str, str]]:
    return Counter((r["NAMESPACE"], r["NAME"]) for r in rows)


# --------------------------------------------------------------------------------------------
# The printed text


CHECKED = {
    "slices",
    "prod-wildcard",
    "dev-forbidden",
    "prod-one-workspace",
    "watch",
    "relabel-out",
    "relabel-in",
    "curl",
    "kcp-refuses-kubectl",
    "kcp-refuses-curl",
}


async def test_every_printed_line_is_checked_here(demo: Demo) -> None:
    """A line added to the demo without a check in this module fails here."""
    assert set(demo.lines) == CHECKED
    for line in demo.lines.values():
        assert line.command in demo.printed  # verbatim, on a line of its own
        for text in line.shows:
            assert f"# {text}" in demo.printed
    commands = [p for p in demo.printed if p.startswith(("kubectl ", "curl "))]
    assert commands == [line.command for line in demo.lines.values()]  # and nothing else


async def test_demo_server_came_up_although_its_port_was_taken(demo: Demo) -> None:
    assert demo.server.base != f"https://127.0.0.1:{demo.taken_port}"
    assert "address already in use" in demo.log.read_text().lower()
    assert demo.server.process.returncode is None
    for endpoint in demo.server.endpoints.values():
        assert endpoint.startswith(f"{demo.server.base}/services/filtered-apiexport/")


# --------------------------------------------------------------------------------------------
# One test per printed line (the watch test runs the two label lines)


async def test_slices_line_shows_both_slices_ready_with_their_endpoints(demo: Demo) -> None:
    ran = await run_line(demo, "slices")
    assert ran.returncode == 0, ran.stderr
    rows = {r["NAME"]: r for r in table(ran.stdout)}  # other tests may leave slices of their own
    for name in SLICES:
        assert rows[name] == {
            "NAME": name,
            "EXPORT": demo.world.export_name,
            "PATH": demo.world.provider.path,
            "READY": "True",
            "ENDPOINT": demo.server.endpoints[name],
            "AGE": rows[name]["AGE"],
        }


async def test_prod_wildcard_line_lists_every_prod_widget_and_nothing_else(demo: Demo) -> None:
    ran = await run_line(demo, "prod-wildcard")
    assert ran.returncode == 0, ran.stderr
    rows = table(ran.stdout)
    assert [*rows[0]][:2] == ["NAMESPACE", "NAME"]
    truth = await prod_truth(demo)
    assert row_keys(rows) == ns_names(truth)
    # the sample widgets of both consumers, prod ones only
    prod = [w for w in demo.world.widgets if w.labels["env"] == "prod"]
    assert Counter((w.namespace, w.name) for w in prod) <= row_keys(rows)
    assert not any(r["NAME"].startswith("dev-") for r in rows)


async def test_dev_line_is_forbidden_for_alice(demo: Demo) -> None:
    """kubectl prints "Error from server (Forbidden): unknown" (its discovery cannot decode the
    Status, exactly as with kcp's own virtual workspace); vwserver's access log shows the 403s."""
    before = len(demo.log.read_text().splitlines())
    ran = await run_line(demo, "dev-forbidden")
    assert ran.returncode != 0
    assert ran.stdout == ""
    assert ran.stderr.splitlines()[-1].startswith("Error from server (Forbidden)"), ran.stderr
    dev = f"/services/filtered-apiexport/{demo.world.provider.cluster}/dev/"
    access = [line for line in demo.log.read_text().splitlines()[before:] if dev in line]
    assert access
    for line in access:  # "GET <path> <code> <verb> slice=<cluster>/<name> user=… <ms>"
        found = re.search(r" (\d{3}) \w+ slice=(\S+) ", line)
        assert found, line
        # 403, not 401: kcp accepted alice's token; the slice was not granted to her
        assert found.groups() == ("403", f"{demo.world.provider.cluster}/dev"), line


async def test_one_workspace_line_lists_the_prod_widgets_of_that_workspace(demo: Demo) -> None:
    ran = await run_line(demo, "prod-one-workspace")
    assert ran.returncode == 0, ran.stderr
    a = demo.world.consumer("consumer-a")
    assert a.cluster in demo.lines["prod-one-workspace"].command
    rows = table(ran.stdout)
    assert row_keys(rows) == ns_names(await prod_truth(demo, a.cluster))
    mine = [w for w in demo.world.widgets if w.cluster == a.cluster and w.labels["env"] == "prod"]
    assert Counter((w.namespace, w.name) for w in mine) <= row_keys(rows)
    assert sum(row_keys(rows).values()) < sum(ns_names(await prod_truth(demo)).values())


async def test_watch_line_shows_a_widget_leave_and_enter_the_slice(demo: Demo) -> None:
    """The printed watch in the background; the two printed label lines move the demo widget
    out of env=prod and back in kcp; the watch shows it DELETED, then ADDED, in its table."""
    widget = demo_widget(demo.world)
    truth = ns_names(await prod_truth(demo))
    rows: list[list[str]] = []  # the watch's table rows, split (no empty cells in this table)
    changed = asyncio.Event()
    proc = await printed_lines.spawn(demo, "watch")
    assert proc.stdout is not None

    async def read() -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            cells = line.decode().split()
            if cells and cells[0] != "EVENT":  # the header
                rows.append(cells)
                changed.set()

    async def until(what: str, done: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TIMEOUT
        while not done():
            if loop.time() > deadline or proc.returncode is not None:
                stderr = await _stderr_so_far(proc)
                pytest.fail(f"watch: no {what} within {TIMEOUT}s; rows {rows}; stderr {stderr}")
            changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), 1)

    reader = asyncio.create_task(read())
    key = [widget.namespace, widget.name]
    try:
        await until("initial rows", lambda: len(rows) >= sum(truth.values()))
        initial = len(rows)
        assert all(r[0] == "ADDED" for r in rows)
        assert Counter((r[1], r[2]) for r in rows) == truth

        out = await run_line(demo, "relabel-out")
        assert (out.returncode, out.stdout) == (0, f"widget.example.io/{widget.name} labeled\n")
        await until("DELETED row", lambda: any(r[0] == "DELETED" for r in rows[initial:]))
        back = await run_line(demo, "relabel-in")
        assert (back.returncode, back.stdout) == (0, f"widget.example.io/{widget.name} labeled\n")
        await until("ADDED row", lambda: len(rows) >= initial + 2)
        await asyncio.sleep(0.5)  # nothing else may follow (e.g. the widget as env=dev)
        assert [r[:3] for r in rows[initial:]] == [["DELETED", *key], ["ADDED", *key]]
    finally:
        await printed_lines.kill(proc)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        # whatever happened above: the widget is env=prod again
        await demo.kcp.kubectl(
            "label", "widget", widget.name, "-n", widget.namespace, "env=prod", "--overwrite",
            server=demo.world.consumer("consumer-a").url,
        )  # fmt: skip


async def _stderr_so_far(proc: asyncio.subprocess.Process) -> str:
    await printed_lines.kill(proc)
    assert proc.stderr is not None
    with contextlib.suppress(TimeoutError):
        return (await asyncio.wait_for(proc.stderr.read(), 5)).decode()
    return "(unreadable)"


async def test_curl_line_answers_200_with_the_prod_widgets_only(demo: Demo) -> None:
    ran = await run_line(demo, "curl")
    assert ran.returncode == 0, ran.stderr
    code, body = status_and_body(ran.stdout)
    assert code == 200
    assert body["kind"] == "WidgetList"
    assert {i["metadata"]["labels"]["env"] for i in body["items"]} == {"prod"}
    assert identities(body["items"]) == identities(await prod_truth(demo))
    everything = await kcp_widgets(demo, f"{demo.world.vw_url}/clusters/*")
    assert len(everything) > len(body["items"])  # there was something to filter out


async def test_kcp_refuses_alice_with_kubectl(demo: Demo) -> None:
    """kcp's virtual workspace refuses alice; kubectl says Forbidden (the curl line shows the
    whole Status)."""
    ran = await run_line(demo, "kcp-refuses-kubectl")
    assert ran.returncode != 0
    assert ran.stdout == ""
    assert ran.stderr.splitlines()[-1].startswith("Error from server (Forbidden)"), ran.stderr


async def test_kcp_refuses_alice_with_curl_403(demo: Demo) -> None:
    ran = await run_line(demo, "kcp-refuses-curl")
    assert ran.returncode == 0, ran.stderr
    code, body = status_and_body(ran.stdout)
    assert code == 403
    assert (body["kind"], body["code"], body["reason"]) == ("Status", 403, "Forbidden")
    assert 'User "alice" cannot list resource "widgets"' in body["message"]
