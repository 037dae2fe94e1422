"""``vwserver sync`` as a process: JSON logs like ``serve``'s, the shared health endpoints,
credentials from an exec plugin, and a clean exit on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import yaml

TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kubeconfig(path: Path, user: dict[str, object]) -> None:
    # Nothing listens on port 9: the syncer starts, serves its health endpoints and retries
    # (leader election included: the Lease is in the unreachable downstream cluster).
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )


async def test_sync_logs_json_serves_health_and_stops_on_sigterm(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    plugin.write_text(
        f"#!{sys.executable}\nimport json\nprint(json.dumps({{'apiVersion': "
        "'client.authentication.k8s.io/v1', 'kind': 'ExecCredential', "
        "'status': {'token': 't'}}))\n"
    )
    plugin.chmod(0o755)
    exec_user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}}
    kubeconfig(tmp_path / "kcp.kubeconfig", exec_user)
    kubeconfig(tmp_path / "cluster.kubeconfig", {"token": "d"})
    port = free_port()
    config = tmp_path / "syncer.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "eu",
                "upstream": {"kubeconfig": "kcp.kubeconfig", "urls": ["http://127.0.0.1:9/vw"]},
                "downstream": {"kubeconfig": "cluster.kubeconfig"},
                "resources": [{"group": "g.io", "version": "v1", "resource": "t", "kind": "T"}],
                "health": {"port": port},
                "logFormat": "json",
            }
        )
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vwserver.cli", "sync", "--config", str(config),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    stderr = asyncio.create_task(proc.stderr.read())
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(int(TIMEOUT / 0.1)):
                try:
                    async with session.get(f"http://127.0.0.1:{port}/livez") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.1)
            # no downstream cluster at all: the syncer waits for it, saying so (once it tried)
            for _ in range(int(TIMEOUT / 0.1)):
                async with session.get(f"http://127.0.0.1:{port}/readyz") as r:
                    assert r.status == 503
                    text = await r.text()
                    assert text.startswith("not ready: ")
                    if "downstream unreachable" in text:
                        break
                await asyncio.sleep(0.1)
            assert "downstream unreachable" in text
            async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
                assert "vwserver_syncer_" in await r.text()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), TIMEOUT) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await asyncio.wait_for(proc.wait(), TIMEOUT)
    lines = [json.loads(line) for line in (await stderr).decode().splitlines()]
    assert lines, "no log lines"
    assert {"time", "level", "logger", "msg"} <= set(lines[0])
    assert any(line["msg"].startswith("health and metrics on") for line in lines)
