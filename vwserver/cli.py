"""The ``vwserver`` command line.

``vwserver serve --config FILE`` runs the filtering proxy; ``vwserver kubeconfig`` writes a
kubeconfig for a slice endpoint (:mod:`vwserver.clientconfig`); ``vwserver sync --config FILE``
runs the syncer (:mod:`vwserver.syncer`). Configuration and usage errors are
printed as one line naming the field or flag and the problem, with exit code 2, and never as a
traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from vwserver import clientconfig
from vwserver.config import Config, check_workers, load_config
from vwserver.errors import ConfigError
from vwserver.logs import configure_logging
from vwserver.server import WorkerRole, serve
from vwserver.syncer import cli as syncer_cli
from vwserver.workers import supervise, watch_parent


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``vwserver kubeconfig: argument --cluster: ...``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="vwserver",
        description="Filtered APIExport virtual workspaces for kcp.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="run the filtering proxy")
    serve.add_argument("--config", required=True, type=Path, help="YAML configuration file")
    serve.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="processes serving the listen port, each one core (default: the config's workers, 1)",
    )
    # Internal: the parent of several workers starts each with its role (vwserver.workers).
    serve.add_argument("--worker-role", type=WorkerRole.decode, help=argparse.SUPPRESS)
    check = sub.add_parser("check-config", help="validate a configuration file and exit")
    check.add_argument("--config", required=True, type=Path, help="YAML configuration file")
    clientconfig.add_parser(sub)
    syncer_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "kubeconfig":
        try:
            clientconfig.run(args)
        except ConfigError as e:
            print(f"vwserver kubeconfig: {e}", file=sys.stderr)
            return 2
        return 0
    if args.command == syncer_cli.COMMAND:
        return syncer_cli.run(args, run_loop=_run)
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"vwserver: invalid configuration: {e}", file=sys.stderr)
        return 2
    if args.command == "check-config":
        print(f"{args.config}: ok ({len(config.slices)} slice(s))")
        return 0
    workers = config.workers
    if args.workers is not None:
        try:
            check_workers(args.workers, field="--workers")
        except ConfigError as e:
            print(f"vwserver serve: {e}", file=sys.stderr)
            return 2
        workers = args.workers
    role: WorkerRole | None = args.worker_role
    configure_logging(
        level=config.log_level,
        fmt=config.log_format,
        worker=role.index if role is not None else None,
    )
    try:
        if role is None and workers > 1:
            return _run(_supervise(args.config, config, workers))
        _run(_serve(args.config.parent, config, role=role))
    except ConfigError as e:
        print(f"vwserver: invalid configuration: {e}", file=sys.stderr)
        return 2
    return 0


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _serve(base_dir: Path, config: Config, *, role: WorkerRole | None) -> None:
    stop = _stop_on_signals()
    if role is not None:
        await watch_parent(stop)
    await serve(config, base_dir=base_dir, stop=stop, role=role)


async def _supervise(path: Path, config: Config, workers: int) -> int:
    return await supervise(config, config_path=path, count=workers, stop=_stop_on_signals())


T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(coro)
    return uvloop.run(coro)


if __name__ == "__main__":
    sys.exit(main())
