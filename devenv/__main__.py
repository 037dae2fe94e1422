"""``python -m devenv``: run a bootstrapped kcp until Ctrl-C (the ``make run`` backend).

A developer (or the demo) needs the same kcp the e2e tests use, with the provider/consumer world
in place, without writing any Python. This prints where everything is (and can write it as a
shell-sourceable env file for the next process, e.g. vwserver itself), then keeps kcp running
until SIGINT/SIGTERM, when kcp is stopped and its temporary directory removed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import sys
from pathlib import Path

from devenv.bootstrap import DEMO_USERS_FILE, Bootstrap, bootstrap
from devenv.kcp import KcpError, KcpInstance, build_kcp, start_kcp
from vwserver.files import write_private


def _env_lines(kcp: KcpInstance, world: Bootstrap | None) -> list[str]:
    env = {
        "KCP_URL": kcp.url,
        "KCP_KUBECONFIG": str(kcp.kubeconfig),
        "KCP_CA_FILE": str(kcp.ca_file),
        "KCP_ADMIN_TOKEN": kcp.admin_token,
    }
    if world is not None:
        env["VW_URL"] = world.vw_url
        env["PROVIDER_CLUSTER"] = world.provider.cluster
        for ws in world.consumers:
            env[f"{ws.name.upper().replace('-', '_')}_CLUSTER"] = ws.cluster
        for user, token in world.tokens.items():
            env[f"{user.upper()}_TOKEN"] = token
    return [f"export {key}={shlex.quote(value)}" for key, value in env.items()]


async def _run(args: argparse.Namespace) -> None:
    binary = args.binary or (Path(os.environ["KCP_BINARY"]) if "KCP_BINARY" in os.environ else None)
    if binary is None:
        binary = await asyncio.to_thread(build_kcp)
    async with start_kcp(
        binary=binary,
        root_dir=args.root_dir,
        token_auth_file=DEMO_USERS_FILE,
        ready_timeout=args.ready_timeout,
    ) as kcp:
        print(f"kcp ready at {kcp.url} after {kcp.ready_seconds:.1f}s", file=sys.stderr)
        world = None if args.no_bootstrap else await bootstrap(kcp)
        if world is not None:
            print(world.describe(), file=sys.stderr)
        lines = _env_lines(kcp, world)
        if args.env_file is not None:
            write_private(args.env_file, "\n".join(lines) + "\n")  # tokens
        print("\n".join(lines))
        print("kcp is running; Ctrl-C stops it.", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devenv", description=__doc__)
    parser.add_argument("--binary", type=Path, help="kcp binary (default: $KCP_BINARY or build)")
    parser.add_argument("--root-dir", type=Path, help="kcp root directory (kept; default: temp)")
    parser.add_argument("--env-file", type=Path, help="also write the export lines here")
    parser.add_argument("--no-bootstrap", action="store_true", help="plain kcp, no demo world")
    parser.add_argument("--ready-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    try:
        asyncio.run(_run(args))
    except KeyboardInterrupt:
        return 130
    except KcpError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
