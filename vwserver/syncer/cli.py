"""``vwserver sync --config FILE`` (wired into :mod:`vwserver.cli`).

Like ``vwserver serve``: a bad configuration is one line naming the field and exit code 2;
logs are text or JSON (``logFormat``, :mod:`vwserver.logs`); SIGINT/SIGTERM shut the syncer down
gracefully (lease released, watches closed).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from vwserver.errors import ConfigError
from vwserver.logs import configure_logging
from vwserver.syncer.config import SyncerConfig, load_syncer_config
from vwserver.syncer.runner import Syncer

COMMAND = "sync"


def add_parser(sub: Any) -> None:
    """Add the ``sync`` subcommand to ``vwserver``'s subparsers."""
    parser: argparse.ArgumentParser = sub.add_parser(
        COMMAND, help="sync objects from kcp into a downstream cluster, status back"
    )
    parser.add_argument("--config", required=True, type=Path, help="syncer YAML configuration")
    parser.add_argument(
        "--check", action="store_true", help="only validate the configuration and exit"
    )


def run(args: argparse.Namespace, *, run_loop: Callable[[Coroutine[Any, Any, None]], None]) -> int:
    try:
        config = load_syncer_config(args.config)
    except ConfigError as e:
        print(f"vwserver sync: invalid configuration: {e}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{args.config}: ok ({len(config.resources)} resource(s))")
        return 0
    configure_logging(level=config.log_level, fmt=config.log_format)
    try:
        run_loop(_sync(config, base_dir=args.config.parent))
    except ConfigError as e:  # e.g. a kubeconfig that does not parse
        print(f"vwserver sync: invalid configuration: {e}", file=sys.stderr)
        return 2
    return 0


async def _sync(config: SyncerConfig, *, base_dir: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await Syncer(config, base_dir=base_dir).run(stop)
