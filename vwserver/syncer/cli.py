"""``vwserver sync --config FILE`` (wired into :mod:`vwserver.cli`).

Like ``vwserver serve``: a bad configuration is one line naming the field and exit code 2 —
including a resource the servers' discovery does not serve (:mod:`vwserver.syncer.checks`);
logs are text or JSON (``logFormat``, :mod:`vwserver.logs`); SIGINT/SIGTERM shut the syncer down
gracefully (lease released, watches closed). ``--decommission`` removes what a syncer that is
stopped for good left behind (:mod:`vwserver.syncer.decommission`): exit code 0 when everything
is clean, 1 when something is left (the summary says what; running it again finishes the job).
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
from vwserver.syncer.decommission import DecommissionRefused, Summary, decommission
from vwserver.syncer.runner import Syncer

COMMAND = "sync"

EXAMPLE_CONFIG = "config/syncer.example.yaml"
"""The annotated example of every key, in the vwserver repository (the docs' "vwserver sync
settings" page is the reference)."""

DESCRIPTION = f"""\
Sync the objects of an API published in kcp (read through a FilteredAPIExportEndpointSlice of
vwserver, kcp's APIExportEndpointSlice, or given endpoint URLs) into a downstream Kubernetes
cluster, one copy per kcp object, and the status the downstream operator writes back into kcp.
Deletion waits for the downstream copy (a finalizer on the kcp object). Several replicas elect a
leader with a Lease in the downstream cluster; /healthz, /readyz and /metrics are served on the
health port.

Every configuration key, with its default, is in {EXAMPLE_CONFIG} (in the
vwserver repository); the docs' "The syncer" page explains the behaviour."""

EPILOG = f"""\
examples:
  vwserver sync --config syncer.yaml --check       validate the file, contact nothing
  vwserver sync --config syncer.yaml               run the syncer
  vwserver sync --config syncer.yaml --decommission --delete-downstream
                                                   after stopping it for good: remove its
                                                   finalizers in kcp, its downstream copies
                                                   and the namespaces they leave empty

exit codes: 0 ok, 1 decommission left something (see its summary), 2 configuration error
(also: a configured resource that discovery says is not served).
example configuration: {EXAMPLE_CONFIG}"""


def add_parser(sub: Any) -> None:
    """Add the ``sync`` subcommand to ``vwserver``'s subparsers."""
    parser: argparse.ArgumentParser = sub.add_parser(
        COMMAND,
        help="sync objects from kcp into a downstream cluster, status back",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", required=True, type=Path, help=f"syncer YAML configuration ({EXAMPLE_CONFIG})"
    )
    parser.add_argument(
        "--check", action="store_true", help="only validate the configuration and exit"
    )
    removal = parser.add_argument_group("clean removal (run once every replica is stopped)")
    removal.add_argument(
        "--decommission",
        action="store_true",
        help="remove this syncer's finalizer from every object its endpoints show, then exit",
    )
    removal.add_argument(
        "--delete-downstream",
        action="store_true",
        help="with --decommission: also delete this syncer's downstream copies and the "
        "namespaces it created that are left empty",
    )
    removal.add_argument(
        "--wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="with --delete-downstream: how long to wait for deleted copies to go (their own "
        "finalizers) before looking at their namespaces (default 60)",
    )
    removal.add_argument(
        "--force",
        action="store_true",
        help="with --decommission: skip the check that no replica holds the syncer's Lease",
    )


def run(args: argparse.Namespace, *, run_loop: Callable[[Coroutine[Any, Any, None]], None]) -> int:
    if not args.decommission:
        given = [f for f in ("delete_downstream", "force") if getattr(args, f)]
        if given:
            flag = "--" + given[0].replace("_", "-")
            print(f"vwserver sync: {flag} needs --decommission", file=sys.stderr)
            return 2
    if args.wait < 0:
        print("vwserver sync: --wait must not be negative", file=sys.stderr)
        return 2
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
        if args.decommission:
            return _decommission(args, config, run_loop=run_loop)
        run_loop(_sync(config, base_dir=args.config.parent))
    except ConfigError as e:  # e.g. a kubeconfig that does not parse, a resource not served
        print(f"vwserver sync: invalid configuration: {e}", file=sys.stderr)
        return 2
    return 0


def _decommission(
    args: argparse.Namespace,
    config: SyncerConfig,
    *,
    run_loop: Callable[[Coroutine[Any, Any, None]], None],
) -> int:
    result: list[Summary] = []

    async def job() -> None:
        result.append(
            await decommission(
                config,
                base_dir=args.config.parent,
                delete_downstream=args.delete_downstream,
                force=args.force,
                wait_seconds=args.wait,
            )
        )

    try:
        run_loop(job())
    except DecommissionRefused as e:
        print(f"vwserver sync: decommission refused: {e}", file=sys.stderr)
        return 1
    (summary,) = result
    print("\n".join(summary.lines(downstream=args.delete_downstream)))
    return 0 if summary.clean else 1


async def _sync(config: SyncerConfig, *, base_dir: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await Syncer(config, base_dir=base_dir).run(stop)
