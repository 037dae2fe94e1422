"""nginx as the yardstick for GETs: a plain ``proxy_pass`` in front of the same upstream.

nginx comes from the Debian packages (``install-nginx.sh``). Each run starts its own nginx on a
free port with a generated configuration in a temporary directory: one worker process (vwserver
is one process too), keep-alive connections to the upstream (as vwserver's client pool keeps),
no access log, no limit on requests per keep-alive connection. It
authenticates and authorizes nobody, which vwserver does on every request
(from warm caches), so the difference is the price of the proxy in Python plus its checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from harness import HERE, free_port, stop, wait_http

INSTALL_SCRIPT = HERE / "install-nginx.sh"


def find_nginx() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


def ensure_nginx(*, install: bool) -> tuple[str | None, str]:
    """nginx's path, or ``None`` and why it is not there."""
    found = find_nginx()
    if found or not install:
        return found, "" if found else "nginx is not installed (run without --nginx if-present)"
    print("nginx is missing: installing it from the Debian packages (install-nginx.sh)")
    done = subprocess.run(
        ["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=900, check=False
    )
    found = find_nginx()
    if done.returncode != 0 or not found:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        return None, f"installing nginx failed ({done.returncode}): {tail}"
    return found, ""


def nginx_version(binary: str | None) -> str:
    if binary is None:
        return "not installed"
    done = subprocess.run([binary, "-v"], capture_output=True, text=True, check=False)
    return (done.stderr or done.stdout).strip().removeprefix("nginx version: ")


def nginx_config(*, port: int, upstream: str, prefix: Path, user: str | None) -> str:
    """The configuration: *upstream* is ``host:port``; *user* the worker's ``user`` line (only
    meaningful when nginx starts as root)."""
    temp = "\n".join(
        f"  {kind}_temp_path {prefix / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""{f"user {user};" if user else ""}
daemon off;
worker_processes 1;
pid {prefix / "nginx.pid"};
error_log {prefix / "error.log"} warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
{temp}
  upstream fake {{ server {upstream}; keepalive 128; keepalive_requests 1000000; }}
  server {{
    listen 127.0.0.1:{port};
    keepalive_requests 1000000;
    location / {{
      proxy_pass http://fake;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"""


def _worker_user() -> str | None:
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwuid(os.getuid())
    return f"{entry.pw_name} {grp.getgrgid(entry.pw_gid).gr_name}"


@contextlib.asynccontextmanager
async def start_nginx(binary: str, *, upstream_origin: str) -> AsyncIterator[str]:
    """Run nginx in front of *upstream_origin*; yields nginx's base URL."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="vwserver-bench-nginx-") as tmp:
        prefix = Path(tmp)
        conf = prefix / "nginx.conf"
        conf.write_text(
            nginx_config(
                port=port,
                upstream=upstream_origin.removeprefix("http://"),
                prefix=prefix,
                user=_worker_user(),
            )
        )
        args = [binary, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")]
        proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            try:
                await wait_http(base + "/", within=20)
            except TimeoutError:
                log = (prefix / "error.log").read_text() if (prefix / "error.log").exists() else ""
                raise RuntimeError(f"nginx did not start: {log[-500:]}") from None
            yield base
        finally:
            await stop(proc)
