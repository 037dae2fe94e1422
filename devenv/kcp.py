"""Start and stop a real kcp server from Python, for the e2e tests and the ``make run`` demo.

vwserver's correctness hinges on what kcp's APIExport virtual workspace *really* does (watch
event semantics, error bodies, wildcard rules), so the e2e tests and the demo run against a real
kcp, not a fake. This module is the one owner of that process's lifetime, because an orphaned
kcp is expensive and confusing: it holds three ports and a few hundred MB, and a later run may
talk to the stale instance. Cleanup is therefore layered:

1. ``async with start_kcp(...)`` stops kcp on exit (SIGTERM to its process group, SIGKILL after
   a grace period) and removes the temporary root directory it created.
2. If Python exits without unwinding that block (``sys.exit`` from a signal handler, an atexit
   path, a SIGTERM/SIGHUP that would otherwise kill the interpreter outright), a process-wide
   safety net kills every kcp process group this module started and has not yet reaped.
3. If Python dies hard (SIGKILL, segfault), the kernel kills kcp: it is started with
   ``PR_SET_PDEATHSIG=SIGKILL`` (Linux only).

kcp runs in its own session/process group, so a Ctrl-C in the terminal reaches only Python,
which then shuts kcp down in order — and killing the group also takes any helper processes kcp
may have spawned.

Readiness: kcp writes ``admin.kubeconfig`` *before* it is ready, so we poll ``/readyz`` first
(TLS verification off: the CA is not known yet, and nothing but the readiness bit is read from
that connection), and only then read the kubeconfig and its CA, which every later request
verifies against.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import ctypes
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import yaml

from vwserver.errors import VWServerError
from vwserver.files import write_private

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "kcp" / "build.sh"

#: Context of ``admin.kubeconfig`` with user ``kcp-admin`` at the shard's base URL.
ADMIN_CONTEXT = "base"
#: Context of ``admin.kubeconfig`` with user ``shard-admin`` (group ``system:masters``, bypasses
#: every authorization check) at the shard's base URL.
SHARD_ADMIN_CONTEXT = "shard-base"

_LOG_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1


class KcpError(VWServerError):
    """kcp could not be built, started, reached or driven."""


class KubectlError(KcpError):
    """A kubectl invocation failed; the message carries its arguments and stderr."""

    def __init__(self, result: KubectlResult) -> None:
        super().__init__(
            f"kubectl {' '.join(result.args)} exited with {result.returncode}: "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )
        self.result = result


# --------------------------------------------------------------------------------------------
# Building


def build_kcp(*, script: Path = BUILD_SCRIPT, timeout: float = 3600.0) -> Path:
    """Build (or reuse the cached) kcp binary with ``scripts/kcp/build.sh`` and return its path.

    The script's progress goes to stderr and is passed straight through to ours so a long first
    build shows signs of life; only stdout (the binary's path) is captured.
    """
    return build_kcp_commands("kcp", script=script, timeout=timeout)["kcp"]


def build_kcp_commands(
    *commands: str, script: Path = BUILD_SCRIPT, timeout: float = 3600.0
) -> dict[str, Path]:
    """Build (or reuse) kcp's ``cmd/<command>`` for each command (``kcp``, ``cache-server``,
    ``kcp-front-proxy``) with ``scripts/kcp/build.sh``; command -> binary path."""
    try:
        completed = subprocess.run(
            [str(script), *commands],
            stdout=subprocess.PIPE,
            stderr=None,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise KcpError(f"{script} did not finish within {timeout:.0f}s") from e
    except OSError as e:
        raise KcpError(f"cannot run {script}: {e}") from e
    if completed.returncode != 0:
        raise KcpError(f"{script} failed with exit code {completed.returncode} (see its stderr)")
    lines = completed.stdout.strip().splitlines()
    if len(lines) < len(commands):
        raise KcpError(f"{script} printed {len(lines)} binary paths for {len(commands)} commands")
    binaries = dict(zip(commands, (Path(line) for line in lines[-len(commands) :]), strict=True))
    for binary in binaries.values():
        if not os.access(binary, os.X_OK):
            raise KcpError(f"{script} printed {binary}, which is not an executable file")
    return binaries


# --------------------------------------------------------------------------------------------
# Process-wide safety net


class _Reaper:
    """Kills the kcp process groups that are still alive when the interpreter goes away.

    This is the one piece of module-level state here, on purpose: atexit hooks and signal
    handlers are process-wide, so the registry they consult has to be process-wide too. Normal
    shutdown never relies on it — :meth:`KcpProcess.stop` removes a group once it is reaped.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: set[int] = set()
        self._installed = False

    def add(self, pgid: int) -> None:
        with self._lock:
            self._groups.add(pgid)
            if not self._installed:
                self._installed = True
                atexit.register(self.kill_all)
                self._install_signal_handlers()

    def discard(self, pgid: int) -> None:
        with self._lock:
            self._groups.discard(pgid)

    def kill_all(self) -> None:
        with self._lock:
            groups, self._groups = self._groups, set()
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)

    def _install_signal_handlers(self) -> None:
        # Only where the signal would otherwise kill Python without running atexit hooks (default
        # disposition), and only from the main thread (signal.signal's rule). A program that
        # installed its own handler shuts down through its own path, which unwinds start_kcp.
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, self._on_fatal_signal)

    def _on_fatal_signal(self, signum: int, frame: FrameType | None) -> None:
        self.kill_all()
        # Die the way the signal would have made us die (exit status, core rules).
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


_REAPER = _Reaper()


def _parent_death_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when this process dies (Linux).

    Everything is resolved *before* fork so that the child only makes two system calls. Note
    that the kernel ties the signal to the forking *thread*: start kcp from a thread that lives
    as long as the instance (asyncio forks in the event loop's thread).
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now.

    All are held open until all are chosen, so they are distinct; another process can still
    take one before the caller binds it (kcp then exits early and we report its log).
    """
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


# --------------------------------------------------------------------------------------------
# The process


class KcpProcess:
    """One ``kcp start`` child process and the root directory it writes into."""

    def __init__(
        self,
        *,
        binary: Path,
        root_dir: Path,
        remove_root_dir: bool,
        token_auth_file: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.binary = binary
        self.root_dir = root_dir
        self.remove_root_dir = remove_root_dir
        self.token_auth_file = token_auth_file
        self.extra_args = tuple(extra_args)
        self.secure_port, self.etcd_client_port, self.etcd_peer_port = free_ports(3)
        self._process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.secure_port}"

    @property
    def log_file(self) -> Path:
        return self.root_dir / "kcp.log"

    @property
    def kubeconfig(self) -> Path:
        return self.root_dir / "admin.kubeconfig"

    @property
    def ready_marker(self) -> Path | None:
        """A file that must exist before the process counts as ready (kcp writes
        ``admin.kubeconfig`` before it is ready, and clients need it); None: ``/readyz`` only.
        Subclasses for kcp's other servers (devenv.shards) override it."""
        return self.kubeconfig

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def returncode(self) -> int | None:
        return self._process.returncode if self._process else None

    def command(self) -> list[str]:
        args = [
            str(self.binary),
            "start",
            f"--root-directory={self.root_dir}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.secure_port}",
            f"--embedded-etcd-client-port={self.etcd_client_port}",
            f"--embedded-etcd-peer-port={self.etcd_peer_port}",
            "--batteries-included=+user",
        ]
        if self.token_auth_file is not None:
            args.append(f"--token-auth-file={self.token_auth_file}")
        args.extend(self.extra_args)
        return args

    async def start(self) -> None:
        if self._process is not None:
            raise KcpError("kcp process already started")
        self.root_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                *self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root_dir,
                start_new_session=True,  # own session and process group (pgid == pid)
                preexec_fn=_parent_death_preexec(),
            )
        _REAPER.add(self._process.pid)

    # A built-in bound (not a caller-side asyncio.timeout) so that no caller can forget one.
    async def wait_ready(self, *, timeout: float) -> None:  # noqa: ASYNC109
        """Poll ``/readyz`` until it answers 200 and :attr:`ready_marker` exists."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        last = "no answer yet"
        client_timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=client_timeout) as session:
            while True:
                if self.returncode is not None:
                    raise KcpError(
                        f"kcp exited with code {self.returncode} before it was ready\n"
                        + self.log_tail()
                    )
                try:
                    async with session.get(f"{self.url}/readyz", ssl=insecure) as resp:
                        text = await resp.text()
                        marker = self.ready_marker
                        if resp.status == 200 and (marker is None or marker.exists()):
                            return
                        last = f"HTTP {resp.status}: {text[-300:]}"
                except (aiohttp.ClientError, TimeoutError, OSError) as e:
                    last = repr(e)
                if loop.time() >= deadline:
                    raise KcpError(
                        f"kcp at {self.url} not ready within {timeout:.0f}s (last /readyz: {last})"
                        "\n" + self.log_tail()
                    )
                await asyncio.sleep(0.5)

    async def kill(self) -> None:
        """SIGKILL the process group at once (a crash, for chaos tests) and reap it; the root
        directory stays, and :meth:`start` may run kcp on it again (same ports)."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        _REAPER.discard(process.pid)
        if process.returncode is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 10)

    async def stop(self, *, grace: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds, remove owned files."""
        process = self._process
        try:
            if process is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), grace)
        finally:
            # Runs even if the wait above was cancelled: never leave the group behind.
            if process is not None:
                # The leader may be gone while children of the group live on: kill the group.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                _REAPER.discard(process.pid)
                if process.returncode is None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(process.wait(), 10)
            if self.remove_root_dir:
                await asyncio.to_thread(_rmtree, self.root_dir)

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of kcp's log, framed for an error message."""
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError as e:
            return f"(no kcp log at {self.log_file}: {e})"
        tail = text.splitlines()[-lines:]
        return f"--- last {len(tail)} lines of {self.log_file} ---\n" + "\n".join(tail)


async def _kill_and_reap(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), 10)


async def run_kubectl(
    binary: str,
    argv: Sequence[str],
    *,
    args: Sequence[str],
    input: str | None = None,
    check: bool = True,
    timeout: float = 60.0,  # noqa: ASYNC109 - a default bound so no kubectl call can hang
) -> KubectlResult:
    """Run ``binary`` with ``argv`` (connection flags, then ``args``, which the result and its
    errors name); :class:`KubectlError` when it fails and ``check``. kubectl is killed and reaped
    on a timeout (a :class:`KcpError`) and when the caller is cancelled."""
    proc = await asyncio.create_subprocess_exec(
        binary,
        *argv,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(
            proc.communicate(input.encode() if input is not None else None), timeout
        )
    except TimeoutError:
        await _kill_and_reap(proc)
        raise KcpError(f"kubectl {' '.join(args)} timed out after {timeout}s") from None
    except BaseException:  # cancelled: do not leave kubectl running
        await _kill_and_reap(proc)
        raise
    assert proc.returncode is not None
    result = KubectlResult(
        args=tuple(args),
        returncode=proc.returncode,
        stdout=out.decode(errors="replace"),
        stderr=err.decode(errors="replace"),
    )
    if check and result.returncode != 0:
        raise KubectlError(result)
    return result


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# A running kcp, as clients see it


@dataclass(frozen=True)
class KubectlResult:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True, kw_only=True)
class KcpInstance:
    """A reachable kcp shard: its URL, credentials and client helpers.

    ``url`` is the shard's base URL (no ``/clusters/...``). ``admin_token`` belongs to the
    kubeconfig user of ``admin_context`` (``kcp-admin`` for an instance we started; it changes
    on every kcp start). ``kubectl`` uses ``admin_context`` unless told otherwise.
    """

    url: str
    kubeconfig: Path
    ca_file: Path
    admin_token: str
    admin_context: str = ADMIN_CONTEXT
    shard_admin_context: str | None = SHARD_ADMIN_CONTEXT
    workdir: Path
    kubectl_binary: str = "kubectl"
    #: Seconds from process start to ``/readyz`` = 200, when this module started the instance.
    ready_seconds: float | None = None
    process: KcpProcess | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_kubeconfig(
        cls,
        kubeconfig: Path,
        *,
        workdir: Path,
        context: str | None = None,
        ready_seconds: float | None = None,
        process: KcpProcess | None = None,
    ) -> KcpInstance:
        """Describe the kcp a kubeconfig points at (``context``: default the current one).

        The CA is written to ``workdir/ca.crt`` so that clients other than kubectl can use it.
        """
        try:
            config: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise KcpError(f"cannot read kubeconfig {kubeconfig}: {e}") from e
        ctx_name: str = context or config.get("current-context") or ""
        contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
        clusters = {c["name"]: c["cluster"] for c in config.get("clusters") or []}
        users = {u["name"]: u.get("user") or {} for u in config.get("users") or []}
        if ctx_name not in contexts:
            raise KcpError(f"kubeconfig {kubeconfig} has no context {ctx_name!r}")
        ctx = contexts[ctx_name]
        cluster = clusters.get(ctx.get("cluster", ""))
        user = users.get(ctx.get("user", ""), {})
        if cluster is None:
            raise KcpError(f"kubeconfig {kubeconfig}: context {ctx_name!r} has no cluster")
        token = user.get("token")
        if not token:
            raise KcpError(f"kubeconfig {kubeconfig}: context {ctx_name!r} has no bearer token")
        server = urlsplit(cluster["server"])
        workdir.mkdir(parents=True, exist_ok=True)
        if "certificate-authority-data" in cluster:
            ca_file = workdir / "ca.crt"
            ca_file.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        elif "certificate-authority" in cluster:
            ca_file = Path(cluster["certificate-authority"])
        else:
            raise KcpError(f"kubeconfig {kubeconfig}: cluster of {ctx_name!r} names no CA")
        return cls(
            url=f"{server.scheme}://{server.netloc}",
            kubeconfig=kubeconfig,
            ca_file=ca_file,
            admin_token=token,
            admin_context=ctx_name,
            shard_admin_context=SHARD_ADMIN_CONTEXT if SHARD_ADMIN_CONTEXT in contexts else None,
            workdir=workdir,
            ready_seconds=ready_seconds,
            process=process,
        )

    def cluster_url(self, workspace: str) -> str:
        """The URL of a workspace by path (``root:provider``) or logical-cluster ID."""
        return f"{self.url}/clusters/{workspace}"

    def write_admin_kubeconfig(self, path: Path, *, server: str) -> None:
        """A kubeconfig at ``path`` with ``admin_context``'s user and CA, pointed at ``server``
        (kcp's base URL, a workspace URL), as its one and current context."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        ctx = next(c["context"] for c in config["contexts"] if c["name"] == self.admin_context)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == ctx["user"])
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "c",
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "clusters": [{"name": "c", "cluster": {**cluster, "server": server}}],
            "users": [{"name": "u", "user": user}],
        }
        write_private(path, yaml.safe_dump(doc))  # the admin's token

    def ssl_context(self) -> ssl.SSLContext:
        """A verifying TLS context trusting kcp's serving CA."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    def http_session(
        self, *, token: str | None = None, timeout: float = 30.0
    ) -> aiohttp.ClientSession:
        """A new aiohttp session that verifies kcp's CA and sends ``token`` (default: admin's).

        The caller owns the session (``async with instance.http_session() as s: ...``).
        """
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.ssl_context()),
            headers={"Authorization": f"Bearer {token or self.admin_token}"},
            timeout=aiohttp.ClientTimeout(total=timeout),
        )

    async def kubectl(
        self,
        *args: str,
        server: str | None = None,
        context: str | None = None,
        token: str | None = None,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,  # noqa: ASYNC109 - a default bound so no kubectl call can hang
    ) -> KubectlResult:
        """Run kubectl with this instance's kubeconfig (``--server`` overrides the URL only).

        ``token`` replaces the context's credentials, e.g. to act as a static test user.
        """
        argv = [
            f"--kubeconfig={self.kubeconfig}",
            f"--context={context or self.admin_context}",
            f"--cache-dir={self.workdir / 'kubectl-cache'}",
        ]
        if server is not None:
            argv.append(f"--server={server}")
        if token is not None:
            argv.append(f"--token={token}")
        argv.extend(args)
        return await run_kubectl(
            self.kubectl_binary, argv, args=args, input=input, check=check, timeout=timeout
        )

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """kcp's log tail when this module started the instance, else an explanation."""
        if self.process is None:
            return "(kcp was not started by devenv: no log)"
        return self.process.log_tail(lines)


@contextlib.asynccontextmanager
async def start_kcp(
    *,
    binary: Path,
    root_dir: Path | None = None,
    token_auth_file: Path | None = None,
    ready_timeout: float = 120.0,
    stop_grace: float = 20.0,
    extra_args: Sequence[str] = (),
) -> AsyncIterator[KcpInstance]:
    """Run a kcp for the duration of the ``async with`` block.

    ``root_dir``: kcp's root directory; kept afterwards (callers that pass one want its log and
    data). Without it a temporary directory is used and removed on stop. Raises
    :class:`KcpError` with kcp's last log lines when kcp exits early or is not ready within
    ``ready_timeout`` seconds.
    """
    root = Path(tempfile.mkdtemp(prefix="vwserver-kcp-")) if root_dir is None else root_dir
    process = KcpProcess(
        binary=binary,
        root_dir=root,
        remove_root_dir=root_dir is None,
        token_auth_file=token_auth_file,
        extra_args=extra_args,
    )
    try:
        started = time.monotonic()
        await process.start()
        await process.wait_ready(timeout=ready_timeout)
        instance = KcpInstance.from_kubeconfig(
            process.kubeconfig,
            workdir=root,
            context=ADMIN_CONTEXT,
            ready_seconds=time.monotonic() - started,
            process=process,
        )
        await _check_verified_readyz(instance)
        yield instance
    finally:
        await process.stop(grace=stop_grace)


async def _check_verified_readyz(instance: KcpInstance) -> None:
    """One verified, authenticated request: proves the CA and token we hand out work."""
    try:
        async with (
            instance.http_session(timeout=10) as session,
            session.get(f"{instance.url}/readyz") as resp,
        ):
            if resp.status != 200:
                raise KcpError(f"verified /readyz answered {resp.status}: {await resp.text()}")
    except aiohttp.ClientError as e:
        raise KcpError(f"kcp CA/token from {instance.kubeconfig} do not work: {e!r}") from e
